"""What the fast CSV path's tests share: hypothesis settings and CSV files with damage, and one run of the
real file activity with the fast path on or off (its outputs, byte for byte)."""

from __future__ import annotations

import csv
import io
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from s3batch.activities.s3_activities import S3Activities
from temporalio.testing import ActivityEnvironment

from s3batch import layout
from s3batch.config import Settings
from s3batch.messages import ObjectRef, ProcessFileInput

bounded = settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

_FIELDS = ["", "a", "bc", "12.50", "é", "漢字", "a,b", 'say "hi"', "x\ny", "r\rs", "t\r\nu", "tab\tx", "back\\", "\x01"]
_DAMAGE = [b"", b"\n", b'"', b"x", b",", b"\r", b"\xff", b'""', b"\r\n\r\n", b'"a"b', b"\x00"]


def _canonical(rows: list[list[str]], eol: str) -> bytes:
    out = io.StringIO()
    csv.writer(out, lineterminator=eol).writerows(rows)
    return out.getvalue().encode()


@st.composite
def csv_files(draw: Any) -> bytes:
    """A header of 2-4 columns and rows written by a minimal-quoting writer, with some damage (a stray
    quote, a blank line, bad UTF-8, a row of another width...) at a few places."""
    width = draw(st.integers(2, 4))
    eol = draw(st.sampled_from(["\n", "\r\n"]))
    rows = draw(st.lists(st.lists(st.sampled_from(_FIELDS), min_size=width, max_size=width), max_size=60))
    data = bytearray(_canonical([[f"c{i}" for i in range(width)], *rows], eol))
    header = data.find(b"\n") + 1
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(header, len(data)))
        data[at:at] = draw(st.sampled_from(_DAMAGE))
    if draw(st.booleans()) and data.endswith(b"\n"):
        data = data.rstrip(b"\r\n")  # no line end after the last row
    return bytes(data)


def run_both_ways(
    s3: Any, buckets: tuple[str, str], key: str, *, fast: bool, prefix: str, **job: Any
) -> dict[str, Any]:
    """One run of the file activity on ``key`` with the fast path on or off: its result and every output object
    (bytes and metadata), by name."""
    src, out = buckets
    budget = job.pop("budget")
    handler = job.pop("handler", "passthrough")
    head = s3.head_object(Bucket=src, Key=key)
    obj = ObjectRef(key=key, etag=head["ETag"].strip('"'), size=head["ContentLength"])
    req = ProcessFileInput(
        job_id="job-fast", bucket=src, obj=obj, output_bucket=out, output_prefix=prefix, handler=handler,
        format="auto", max_record_bytes=1 << 20, **job,
    )
    worker = Settings(csv_fast_path=fast, max_chunk_bytes=budget)
    result = ActivityEnvironment().run(S3Activities(s3, worker).process_file, req)
    folder = layout.file_dir(prefix, key)
    listed = s3.list_objects_v2(Bucket=out, Prefix=folder).get("Contents", [])
    objects = {}
    for item in listed:
        got = s3.get_object(Bucket=out, Key=item["Key"])
        objects[item["Key"][len(folder) :]] = (got["Body"].read(), got["Metadata"])
    return {"result": result.model_dump(exclude={"attempts"}), "objects": objects}

"""Byte-range splits of one big file (``S3BatchInput.split_bytes``, ``s3batch.activities.splits``), one
activity per split, run through ``ActivityEnvironment`` against the real SeaweedFS S3 server.

The oracle is the file read whole: the splits of a file, each run on its own, must give the same records
(the parts' bytes, concatenated in name order), the same rejects with the same line numbers, and counts
that add up to the whole file's, wherever the nominal cuts fall (blank lines, CRLF, long lines, rejects
around them). A crash of a split resumes from its own checkpoint; a quoted CSV line break at a boundary
fails the file loudly.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from s3batch.activities import file_setup
from s3batch.activities.s3_activities import S3Activities
from s3batch.activities.splits import SplitSource
from s3batch.workflows.splits import split_ranges
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from s3batch import layout
from s3batch.checkpoint import Checkpoint
from s3batch.handlers import ChunkContext
from s3batch.messages import FileResult, ObjectRef, ProcessFileInput
from tests.helpers.data import messy_csv


class Crash(Exception):
    """Stands for the worker dying right after a heartbeat."""


@pytest.fixture(autouse=True)
def parts_written_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    """Small files here: write their parts one chunk behind anyway, as a big file's are."""
    monkeypatch.setattr(file_setup, "BEHIND_MIN_BYTES", 0)


def upload(s3: Any, bucket: str, key: str, body: bytes) -> ObjectRef:
    s3.put_object(Bucket=bucket, Key=key, Body=body)
    head = s3.head_object(Bucket=bucket, Key=key)
    return ObjectRef(key=key, etag=head["ETag"].strip('"'), size=len(body))


def request(buckets: tuple[str, str], obj: ObjectRef, prefix: str, **kw: Any) -> ProcessFileInput:
    src, out = buckets
    fields: dict[str, Any] = {
        "job_id": "job-splits",
        "bucket": src,
        "obj": obj,
        "output_bucket": out,
        "output_prefix": prefix,
        "format": "auto",
        "handler": "passthrough",
        "chunk_records": 7,
        "max_record_bytes": 1024,
    }
    fields.update(kw)
    return ProcessFileInput(**fields)


def run(s3: Any, req: ProcessFileInput, *, details: Sequence[Any] = (), crash_at: int | None = None) -> FileResult:
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, attempt=2 if details or crash_at is None else 1,
                                   heartbeat_details=list(details))
    beats: list[Any] = []

    def on_heartbeat(*d: Any) -> None:
        cp = json.loads(d[0].model_dump_json())
        beats.append(cp)
        if crash_at is not None and cp["chunk"] == crash_at:
            raise Crash(f"killed after chunk {crash_at}")

    env.on_heartbeat = on_heartbeat
    run.beats = beats  # type: ignore[attr-defined]  # this attempt's heartbeats, also when it crashes
    return env.run(S3Activities(s3).process_file, req)


def outputs(s3: Any, out: str, prefix: str, key: str) -> tuple[bytes, bytes, list[str]]:
    """The parts' bytes and the rejects' bytes, each concatenated in name order, and the names."""
    folder = layout.file_dir(prefix, key)
    listed = s3.list_objects_v2(Bucket=out, Prefix=folder).get("Contents", [])
    names = sorted(o["Key"][len(folder) :] for o in listed)
    parts = b"".join(s3.get_object(Bucket=out, Key=folder + n)["Body"].read() for n in names if n.startswith("part-"))
    rejects = b"".join(
        s3.get_object(Bucket=out, Key=folder + n)["Body"].read() for n in names if n.startswith("rejects-")
    )
    return parts, rejects, names


COUNTS = ("records", "records_written", "rejected", "dropped", "bytes_read")


def assert_same_as_whole(s3: Any, buckets: tuple[str, str], obj: ObjectRef, count: int, **kw: Any) -> list[str]:
    """Run ``obj`` whole and as ``count`` splits; their outputs and counts must be the same."""
    out = buckets[1]
    kw = {"max_rejected_ratio": 1.0, **kw}  # a file of rejects only is read too (without a limit, it fails whole)
    whole = run(s3, request(buckets, obj, "whole/", **kw))
    results = [run(s3, request(buckets, obj, "split/", split=r, **kw)) for r in split_ranges(obj, count)]
    assert all(r.status == "succeeded" for r in results)
    for field in COUNTS:
        assert sum(getattr(r, field) for r in results) == getattr(whole, field), field
    w_parts, w_rejects, _ = outputs(s3, out, "whole/", obj.key)
    s_parts, s_rejects, names = outputs(s3, out, "split/", obj.key)
    assert s_parts == w_parts
    assert s_rejects == w_rejects
    return names


@pytest.mark.parametrize("count", [2, 3, 7])
def test_jsonl_splits_read_each_record_once(s3: Any, buckets: tuple[str, str], count: int) -> None:
    lines = []
    for i in range(300):
        lines.append(json.dumps({"n": i, "s": "é" * (i % 13)}).encode())
        if i % 17 == 0:
            lines.append(b"")  # blank lines: skipped, and never a split's last line
        if i % 29 == 0:
            lines.append(b"{not json")  # a reject, with its line number
        if i % 41 == 0:
            lines.append(b"   \t")
    obj = upload(s3, buckets[0], "big/data.jsonl", b"\n".join(lines) + b"\n")
    names = assert_same_as_whole(s3, buckets, obj, count)
    assert {n.split("-")[1] for n in names if n.startswith("part-")} == {f"{i:03d}" for i in range(count)}


@pytest.mark.parametrize("count", [2, 5])
def test_csv_splits_read_each_record_once(s3: Any, buckets: tuple[str, str], count: int) -> None:
    data = messy_csv(400, bad_amounts=True)
    obj = upload(s3, buckets[0], "big/data.csv", data)
    assert_same_as_whole(s3, buckets, obj, count)


def test_crlf_csv_and_a_file_without_a_last_line_feed(s3: Any, buckets: tuple[str, str]) -> None:
    rows = [f"{i},name {i},{'x' * (i % 50)}" for i in range(500)]
    data = ("id,name,pad\r\n" + "\r\n".join(rows)).encode()  # no CRLF after the last row
    obj = upload(s3, buckets[0], "big/crlf.csv", data)
    assert_same_as_whole(s3, buckets, obj, 4)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lines=st.lists(
        st.one_of(
            st.integers(0, 10**6).map(lambda n: json.dumps({"n": n}).encode()),
            st.sampled_from([b"", b" ", b"\r", b"{bad", b"[1,2]", b'"' + b"y" * 900 + b'"', b"z" * 1100]),
        ),
        min_size=0,
        max_size=60,
    ),
    count=st.integers(2, 9),
)
def test_any_jsonl_split_anywhere_reads_like_the_whole_file(
    s3: Any, buckets: tuple[str, str], lines: list[bytes], count: int
) -> None:
    data = b"\n".join(lines) + (b"\n" if lines and lines[-1] else b"")
    key = f"prop/{abs(hash((data, count)))}.jsonl"
    obj = upload(s3, buckets[0], key, data)
    assert_same_as_whole(s3, buckets, obj, count, chunk_records=3)


def test_a_quoted_line_break_at_a_boundary_fails_the_file(s3: Any, buckets: tuple[str, str]) -> None:
    rows = [f'{i},"line one\nline two of {i}"' for i in range(200)]
    data = ("id,note\n" + "\n".join(rows) + "\n").encode()
    obj = upload(s3, buckets[0], "big/quoted.csv", data)
    failures = []
    for r in split_ranges(obj, 3):
        try:
            run(s3, request(buckets, obj, "split/", split=r))
        except ApplicationError as err:
            failures.append(err)
    # Every other boundary is inside a quoted field (one line break in two is): some split fails loudly.
    assert failures
    assert all(f.type == "BadFile" and f.non_retryable for f in failures)
    assert '"split_bytes": null' in failures[0].message and "crosses the boundary" in failures[0].message


def test_a_crashed_split_resumes_from_its_own_checkpoint(s3: Any, buckets: tuple[str, str]) -> None:
    lines = [json.dumps({"n": i}).encode() for i in range(400)]
    obj = upload(s3, buckets[0], "big/crash.jsonl", b"\n".join(lines) + b"\n")
    whole = run(s3, request(buckets, obj, "whole/"))
    splits = split_ranges(obj, 3)
    results = []
    for r in splits:
        req = request(buckets, obj, "split/", split=r)
        with pytest.raises(ApplicationError):
            run(s3, req, crash_at=3)
        last = run.beats[-1]  # type: ignore[attr-defined]
        assert last["chunk"] == 3  # this split's own checkpoint, at the crash
        if r.index == 1:
            results.append(run(s3, req, details=[last]))  # resumed from the heartbeat
        else:
            results.append(run(s3, req, details=[None]))  # no heartbeat: from its committed parts
        assert results[-1].resumed_from_record == last["next_record"] > 0
    assert sum(r.records for r in results) == whole.records == 400
    assert outputs(s3, buckets[1], "split/", obj.key)[0] == outputs(s3, buckets[1], "whole/", obj.key)[0]


def test_a_finished_split_started_again_returns_its_result_and_writes_nothing(
    s3: Any, buckets: tuple[str, str]
) -> None:
    """A file in splits handed over at continue-as-new runs the same splits in the next run: one that had
    finished meanwhile finds its final checkpoint and gives the same result, its parts untouched."""
    lines = [json.dumps({"n": i}).encode() for i in range(300)]
    obj = upload(s3, buckets[0], "big/twice.jsonl", b"\n".join(lines) + b"\n")
    req = request(buckets, obj, "split/", split=split_ranges(obj, 2)[1])
    first = run(s3, req)
    before = s3.list_objects_v2(Bucket=buckets[1], Prefix="split/")["Contents"]
    again = run(s3, req, details=[None])
    same = {"attempts", "resumed_from_record"}
    assert again.model_dump(exclude=same) == first.model_dump(exclude=same)
    assert again.resumed_from_record == first.records > 0  # resumed from its final checkpoint: nothing left
    after = s3.list_objects_v2(Bucket=buckets[1], Prefix="split/")["Contents"]
    assert [(o["Key"], o["ETag"], o["LastModified"]) for o in after] == [
        (o["Key"], o["ETag"], o["LastModified"]) for o in before
    ]


def test_splits_of_another_count_are_replaced(s3: Any, buckets: tuple[str, str]) -> None:
    """A file split in 4 by an earlier job, then in 2 into the same output: the old splits' parts go."""
    lines = [json.dumps({"n": i}).encode() for i in range(300)]
    obj = upload(s3, buckets[0], "big/again.jsonl", b"\n".join(lines) + b"\n")
    for r in split_ranges(obj, 4):
        run(s3, request(buckets, obj, "split/", split=r))
    run(s3, request(buckets, obj, "whole/"))
    for r in split_ranges(obj, 2):
        run(s3, request(buckets, obj, "split/", split=r))
    parts, _, names = outputs(s3, buckets[1], "split/", obj.key)
    assert {n.split("-")[1] for n in names} == {"000", "001"}
    assert parts == outputs(s3, buckets[1], "whole/", obj.key)[0]
    # ... and a whole-file run into that output removes the splits' parts.
    run(s3, request(buckets, obj, "split/"))
    assert all(layout.output_kind(n) is not None for n in outputs(s3, buckets[1], "split/", obj.key)[2])


def test_boundaries_and_lines(s3: Any, buckets: tuple[str, str]) -> None:
    data = b"a\n\n  \nb\r\nc\rd\n" + b"x" * 600_000 + b"\ne\n"
    obj = upload(s3, buckets[0], "big/b.csv", data)
    source = SplitSource(s3, buckets[0], obj, None, "s3://x/big/b.csv")
    assert source.boundary(0) == 0
    assert source.boundary(1) == 2  # after "a\n"
    assert source.boundary(2) == 2  # the LF at 1 ends "a"
    assert source.boundary(3) == 9  # "\n" and "  \n" are blank: after "b\r\n"
    assert source.boundary(len(data)) == len(data)
    assert source.boundary(20) == len(data) - 2  # through a long line
    assert source.line_at(9, "csv") == source.line_at(9, "jsonl") == 5
    assert source.line_at(13, "csv") == 7  # "c\r" is a line for CSV
    assert source.line_at(13, "jsonl") == 6


def test_each_split_has_chunk_keys_of_its_own() -> None:
    one = ChunkContext("job", "b", "k", "e", 0, 1)
    a, b = one._replace(split=0), one._replace(split=1)
    assert len({one.chunk_key, a.chunk_key, b.chunk_key}) == 3
    assert a.record_key(10) == b.record_key(10) == one.record_key(10)  # a record's key is its line's
    assert Checkpoint(etag="e", fingerprint="f").line == 1


def test_the_default_split_bytes_is_left_out_of_the_input_as_written() -> None:
    """A job that does not set split_bytes is written as before it existed (a worker of the release before
    reads it); one that sets it, even to null (never split), says so."""
    from s3batch.models import DEFAULT_SPLIT_BYTES, S3BatchInput

    base = {"bucket": "in-bucket", "output_bucket": "out-bucket", "output_prefix": "p/"}
    assert "split_bytes" not in S3BatchInput(**base).model_dump()
    assert S3BatchInput(**base).split_bytes == DEFAULT_SPLIT_BYTES
    assert S3BatchInput(**base, split_bytes=None).model_dump()["split_bytes"] is None
    assert S3BatchInput(**base, split_bytes=65536).model_dump()["split_bytes"] == 65536


_FIELD = st.text(alphabet=st.sampled_from(list('ab,"\n\r x')), max_size=6)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.lists(_FIELD, min_size=2, max_size=2), min_size=1, max_size=40), count=st.integers(2, 6))
def test_any_csv_split_anywhere_reads_like_the_whole_file_or_fails_loudly(
    s3: Any, buckets: tuple[str, str], rows: list[list[str]], count: int
) -> None:
    """Quoted fields holding line breaks, CRs, quotes and commas anywhere: the splits either give exactly
    what the whole file gives, or one of them fails the file (BadFile) - never a different output."""
    import csv
    import io

    text = io.StringIO()
    csv.writer(text, lineterminator="\n").writerows([["k", "v"], *rows])
    data = text.getvalue().encode()
    obj = upload(s3, buckets[0], f"prop/{abs(hash((data, count)))}.csv", data)
    out = buckets[1]
    whole = run(s3, request(buckets, obj, "whole/", chunk_records=3))
    results, failures = [], []
    for r in split_ranges(obj, count):
        try:
            results.append(run(s3, request(buckets, obj, "split/", split=r, chunk_records=3)))
        except ApplicationError as err:
            failures.append(err)
    event("a split failed" if failures else "read like the whole file")
    if failures:
        assert all(f.type == "BadFile" and "crosses the boundary" in f.message for f in failures)
        return
    assert sum(r.records for r in results) == whole.records
    assert outputs(s3, out, "split/", obj.key)[:2] == outputs(s3, out, "whole/", obj.key)[:2]


def test_a_cancelled_file_in_splits_reports_what_each_split_committed(s3: Any, buckets: tuple[str, str]) -> None:
    """A cancel that found some splits waiting for a retry: they reported nothing, so the report counts each
    split's last committed part (activities/committed.fill_cancelled)."""
    from s3batch.activities.committed import fill_cancelled

    from s3batch.messages import Totals

    lines = [json.dumps({"n": i}).encode() for i in range(300)]
    obj = upload(s3, buckets[0], "big/cancel.jsonl", b"\n".join(lines) + b"\n")
    committed = 0
    for r in split_ranges(obj, 3):
        req = request(buckets, obj, "split/", split=r)
        if r.index == 0:
            committed += run(s3, req).records  # finished: its result is in the merged one
            continue
        with pytest.raises(ApplicationError):
            run(s3, req, crash_at=r.index + 1)  # then "in backoff" when the cancel came
        committed += run.beats[-1]["next_record"]  # type: ignore[attr-defined]
    reported = FileResult(key=obj.key, etag=obj.etag, status="cancelled", records=100, records_written=100,
                          chunks=15, splits=3)
    files, totals = fill_cancelled(s3, buckets[1], "split/", [reported], Totals(records=100, records_written=100), None)
    assert files[0].records == files[0].records_written == committed
    assert totals.records == committed and files[0].splits == 3
    assert 100 < committed < 300

"""A manifest's pages, searched for counterexamples: whatever the rows (quoted fields, line breaks in
keys, CRLF, a header, blank lines, JSONL, gzip, Parquet row groups), the page sizes, the worker
process each page lands on and pages listed twice (an attempt's result lost), the pages hand out
every row once, in the manifest's order. And a page
does not read the rows before it again: a plain data file is entered where the page before ended (a
ranged GET), a gzip one read on where the worker process left it open, Parquet at its row group."""

from __future__ import annotations

import gzip
import io
import json
import uuid
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from s3batch.activities.manifest_rows import ManifestPositions
from s3batch.activities.manifests import check_manifest, list_manifest_page
from s3batch.workflows.batch import S3BatchWorkflow
from temporalio.client import Client, WorkflowFailureError
from temporalio.worker import Worker

from s3batch.config import Settings
from s3batch.errors import InvalidInput
from s3batch.messages import ListObjectsInput
from s3batch.models import S3BatchInput
from s3batch.s3io import make_client
from tests.helpers.data import put_files
from tests.helpers.jobs import execute, job_error, new_id, until
from tests.helpers.output import list_keys

ANY = Settings.explicit()
"""A worker without allow-lists."""

# Keys with what a CSV must quote (comma, quote, line breaks) and more than ASCII; never a key that
# is only spaces (a plain CSV row needs a key).
KEYS = st.lists(
    st.text(alphabet='ab,"\n\r é/', min_size=1, max_size=8).filter(lambda k: k.strip() != ""),
    min_size=1,
    max_size=30,
    unique=True,
)
FORMATS = st.sampled_from(["csv", "csv-header", "csv-crlf", "csv-blank-lines", "csv.gz", "jsonl", "jsonl.gz"])


def _field(text: str) -> str:
    """A CSV field, quoted where it holds a delimiter, a quote or a line break (a lone CR too)."""
    return '"' + text.replace('"', '""') + '"' if any(c in text for c in ',"\r\n') else text


def _manifest(bucket: str, keys: list[str], fmt: str) -> bytes:
    if fmt.startswith("jsonl"):
        body = "".join(json.dumps({"bucket": bucket, "key": k}) + "\n" for k in keys)
    else:
        end = "\r\n" if fmt == "csv-crlf" else "\n"
        lines = ["bucket,key"] if fmt == "csv-header" else []
        for i, k in enumerate(keys):
            lines.append(f"{_field(bucket)},{_field(k)}")
            if fmt == "csv-blank-lines" and i % 3 == 0:
                lines.append("")
        body = "".join(line + end for line in lines)
    return gzip.compress(body.encode()) if fmt.endswith(".gz") else body.encode()


def _list_all(
    s3: Any,
    uri: str,
    sizes: list[int],
    processes: list[ManifestPositions],
    where: list[int],
    again: tuple[int, ...] = (),
) -> list[str]:
    """Every page of the manifest ``uri``: page ``i`` of ``sizes[i % len(sizes)]`` rows, on the worker
    process ``where[i % len(where)]``; listed once more first on process ``again[i % len(again)]`` (an
    attempt whose result was lost), when there is one."""
    keys: list[str] = []
    token: str | None = None
    for i in range(10_000):
        req = ListObjectsInput(
            bucket="", prefix="", manifest=uri, continuation_token=token, page_size=sizes[i % len(sizes)]
        )
        lost = list_manifest_page(s3, req, processes[again[i % len(again)]], ANY) if again else None
        page = list_manifest_page(s3, req, processes[where[i % len(where)]], ANY)
        assert lost is None or lost == page
        assert len(page.objects) <= req.page_size
        keys += [o.key for o in page.objects]
        token = page.next_token
        if token is None:
            return keys
    raise AssertionError("the pages never end")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    keys=KEYS,
    fmt=FORMATS,
    sizes=st.lists(st.integers(1, 12), min_size=1, max_size=4),
    where=st.lists(st.integers(0, 1), min_size=1, max_size=5),
    again=st.lists(st.integers(0, 1), max_size=3).map(tuple),
    repeat=st.integers(0, 29),
)
def test_any_manifest_in_any_pages_on_any_process_hands_out_each_row_once(
    s3: Any,
    buckets: tuple[str, str],
    keys: list[str],
    fmt: str,
    sizes: list[int],
    where: list[int],
    again: tuple[int, ...],
    repeat: int,
) -> None:
    src, out = buckets
    name = f"lists/{uuid.uuid4().hex}.{fmt.split('-')[0]}"
    s3.put_object(Bucket=out, Key=name, Body=_manifest(src, keys, fmt))
    processes = [ManifestPositions(), ManifestPositions()]
    listed = _list_all(s3, f"s3://{out}/{name}", sizes, processes, where, again)
    assert listed == keys
    check_manifest(s3, f"s3://{out}/{name}", ANY)  # each key once: the job may start

    # The same manifest naming one of its keys again, last: refused at the start, naming the key.
    again_key = keys[repeat % len(keys)]
    s3.put_object(Bucket=out, Key=f"twice-{name}", Body=_manifest(src, [*keys, again_key], fmt))
    with pytest.raises(InvalidInput) as refused:
        check_manifest(s3, f"s3://{out}/twice-{name}", ANY)
    assert f"names {again_key!r} 2 times" in str(refused.value)


def _get_ranges(client: Any) -> list[str]:
    """The Range of each GetObject the client sends (collected as they are sent)."""
    ranges: list[str] = []
    client.meta.events.register(
        "before-call.s3.GetObject", lambda params, **_: ranges.append(params["headers"].get("Range", ""))
    )
    return ranges


def test_a_page_of_a_plain_manifest_starts_where_the_page_before_ended(
    s3: Any, buckets: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """600 rows in six pages of 100: each page after the first is a ranged GET from the byte where the
    page before ended, on the same worker process; a gzip manifest is read on from where it was left. (Each
    row is looked up with a HEAD: 3,000 rows in pages of 500 took 26 s of CPU for the same six pages.)"""
    monkeypatch.setenv("S3BATCH_DATA_CLIENT", "boto3")  # every GET on the counted client's events
    src, out = buckets
    keys = [f"in/{i:05d},x.csv" for i in range(600)]  # quoted: the offsets count the quotes
    body = _manifest(src, keys, "csv")
    s3.put_object(Bucket=out, Key="plain.csv", Body=body)
    s3.put_object(Bucket=out, Key="packed.csv.gz", Body=_manifest(src, keys, "csv.gz"))
    counted = make_client()
    ranges = _get_ranges(counted)
    row = len(f'{src},"in/00000,x.csv"\n')
    assert _list_all(counted, f"s3://{out}/plain.csv", [100], [ManifestPositions()], [0]) == keys
    assert [int(r.removeprefix("bytes=").split("-")[0]) for r in ranges] == [p * 100 * row for p in range(6)]
    assert len(body) == 600 * row

    # A gzip manifest cannot be entered in the middle: the worker process leaves it open for the next
    # page, which reads on (one GET for all six pages). Pages alternating between two processes: each
    # process reads the file once, on past the other's pages.
    ranges.clear()
    here = ManifestPositions()
    assert _list_all(counted, f"s3://{out}/packed.csv.gz", [100], [here], [0]) == keys
    assert len(ranges) == 1 and ranges[0].startswith("bytes=0-")
    ranges.clear()
    assert _list_all(counted, f"s3://{out}/packed.csv.gz", [100], [here, ManifestPositions()], [0, 1]) == keys
    assert len(ranges) == 2 and all(r.startswith("bytes=0-") for r in ranges), ranges


def test_parquet_manifest_pages_skip_the_row_groups_before_them(s3: Any, buckets: tuple[str, str]) -> None:
    """An inventory in Parquet with row groups of 7 rows, some rows not the latest version: pages of
    any size hand out the latest rows once, in order."""
    src, out = buckets
    keys = [f"k{i:03d}.csv" for i in range(60)]
    latest = [i % 5 != 0 for i in range(60)]
    table = pa.table({"bucket": [src] * 60, "key": keys, "is_latest": latest})
    buf = io.BytesIO()
    pq.write_table(table, buf, row_group_size=7)
    s3.put_object(Bucket=out, Key="inv/data/1.parquet", Body=buf.getvalue())
    doc = {
        "sourceBucket": src,
        "destinationBucket": f"arn:aws:s3:::{out}",
        "fileFormat": "Parquet",
        "fileSchema": "message s3.inventory { required binary bucket; required binary key; }",
        "files": [{"key": "inv/data/1.parquet"}],
    }
    s3.put_object(Bucket=out, Key="inv/manifest.json", Body=json.dumps(doc).encode())
    wanted = [k for k, new in zip(keys, latest, strict=True) if new]
    for size in (1, 6, 7, 8, 48, 100):
        assert _list_all(s3, f"s3://{out}/inv/manifest.json", [size], [ManifestPositions()], [0]) == wanted, size


async def test_a_job_whose_manifest_names_a_key_twice_fails_at_its_start(
    client: Client, worker: Worker, s3: Any, buckets: tuple[str, str], task_queue: str
) -> None:
    """A key named on two pages (rows 1 and 506) was processed twice into the same output, and its
    records counted twice: the job reported 507 records written for 505 in its output. It is refused
    before any file runs, saying which key and rows."""
    src, out = buckets
    keys = [f"d/{i:04d}.jsonl" for i in range(505)]
    put_files(s3, src, {k: b'{"a": 1}\n' for k in keys})
    s3.put_object(Bucket=out, Key="l.csv", Body=_manifest(src, [*keys, keys[0]], "csv"))
    spec = S3BatchInput(manifest=f"s3://{out}/l.csv", output_bucket=out, output_prefix="o/")
    with pytest.raises(WorkflowFailureError) as failed:
        await execute(client, task_queue, spec, "manifest-twice")
    cause = job_error(failed.value)
    assert cause.type == "InvalidInput"
    assert "names 'd/0000.jsonl' 2 times (row 1 of l.csv, row 506 of l.csv)" in cause.message
    assert [k for k in list_keys(s3, out, "o/") if not k.startswith("o/_")] == []  # no file ran


async def test_a_manifest_replaced_while_its_job_runs_fails_the_job_loudly(
    client: Client, worker: Worker, s3: Any, buckets: tuple[str, str], task_queue: str
) -> None:
    """Pages count rows: a manifest overwritten mid-job (a daily ``today.csv`` regenerated while
    yesterday's job runs) made the next pages read another version's rows, missing or repeating
    keys, and the job succeeded. The job keeps the manifest's ETag from its check (across
    continue-as-new: its first run ends after the 500 files of the first page) and the next page
    fails the job, saying what changed."""
    src, out = buckets
    keys = [f"d/{i:04d}.jsonl" for i in range(600)]
    put_files(s3, src, {k: b'{"a": 1}\n' for k in keys})
    s3.put_object(Bucket=out, Key="today.csv", Body=_manifest(src, keys, "csv"))
    uri = f"s3://{out}/today.csv"
    # One activity at a time, of 25 files (one file each: 500 activities, 120 s of the suite), so the first page
    # is still running when the manifest is replaced.
    spec = S3BatchInput(manifest=uri, output_bucket=out, output_prefix="o/", max_concurrent_files=1, group_max_files=25)
    wid = new_id("manifest-replaced")
    handle = await client.start_workflow(S3BatchWorkflow.run, spec, id=wid, task_queue=task_queue)
    first = await until(lambda p: p.files_listed >= 500, handle)
    assert first.files_succeeded < 400, "the first page's files ran too fast to replace the manifest meanwhile"
    s3.put_object(Bucket=out, Key="today.csv", Body=_manifest(src, keys[::-1], "csv"))
    with pytest.raises(WorkflowFailureError) as failed:
        await handle.result()
    cause = job_error(failed.value)
    assert cause.type == "InvalidInput"
    assert f"the manifest s3://{out}/today.csv changed since the job started" in cause.message

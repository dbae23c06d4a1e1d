"""Issue 12, a newcomer's first hour: what they hit after ``make demo``, each checked against the real
stack (the walk-through of the README's Quick start is ``tests/test_quickstart.py``)."""

from __future__ import annotations

from typing import Any

import pytest
from temporalio.client import Client, WorkflowFailureError
from temporalio.worker import Worker

import tests.fault_handlers  # registers explode_on_marker for the in-process worker
import tests.slow_handlers  # noqa: F401 - registers slow_passthrough for the in-process worker
from s3batch import layout
from s3batch.models import S3BatchInput
from tests.helpers import wait_for
from tests.helpers.data import make_csv
from tests.helpers.jobs import start, until
from tests.helpers.output import report


def slow_job(src: str, out: str, **kw: Any) -> S3BatchInput:
    # 100-record chunks at 50 ms each (slow_passthrough).
    options: dict[str, Any] = {
        "prefix": "in/",
        "output_bucket": out,
        "output_prefix": "o/",
        "handler": "slow_passthrough",
        "chunk_records": 100,
        "group_max_files": 1,
        "heartbeat_timeout_seconds": 20,
    }
    return S3BatchInput(bucket=src, **{**options, **kw})


def parts(s3: Any, bucket: str, key: str) -> int:
    return s3.list_objects_v2(Bucket=bucket, Prefix=f"{layout.file_dir('o/', key)}part-")["KeyCount"]


async def test_cancelled_files_report_what_they_committed(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets: tuple[str, str]
):
    """Point 3: a file stopped by a cancel is reported with the records, parts and chunks of its last
    checkpoint (it had committed them), not with zeros."""
    src, out = buckets
    key = "in/big.csv"
    s3.put_object(Bucket=src, Key=key, Body=make_csv(20_000))  # 200 chunks of 50 ms
    handle = await start(client, task_queue, slow_job(src, out), "cancel-books")
    await until(lambda p: p.files_in_flight == 1, handle)
    await wait_for(lambda: parts(s3, out, key) >= 5, 60, "five committed parts")
    await handle.cancel()
    with pytest.raises(WorkflowFailureError):
        await handle.result()
    committed = parts(s3, out, key)
    rep = report(s3, out)
    (f,) = rep["files"]
    assert f["status"] == "cancelled"
    assert f["chunks"] == committed and f["records"] == f["records_written"] == committed * 100, f
    t = rep["totals"]
    assert (t["records"], t["records_written"]) == (committed * 100, committed * 100), t


async def test_a_file_cancelled_between_attempts_reports_its_committed_parts(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets: tuple[str, str]
):
    """Point 3: a cancel that finds a file waiting for its next attempt (the server cancels it without
    running it, so the workflow learns nothing from it) still reports the parts that file committed:
    the report reads them back, so it is true and a redrive resumes from there."""
    src, out = buckets
    key = "in/boom.csv"
    body = make_csv(1_000).replace(b'550,"name, 550"', b'550,"BOOM"')  # chunk 5 fails on every attempt
    s3.put_object(Bucket=src, Key=key, Body=body)
    spec = slow_job(src, out, handler="explode_on_marker", max_attempts=10)
    handle = await start(client, task_queue, spec, "cancel-backoff")

    async def retrying() -> bool:
        desc = await handle.describe()
        pending = desc.raw_description.pending_activities
        return bool(pending) and pending[0].attempt >= 3

    await wait_for(retrying, 60, "the file's third attempt (in retry backoff)")
    assert parts(s3, out, key) == 5
    await handle.cancel()
    with pytest.raises(WorkflowFailureError):
        await handle.result()
    rep = report(s3, out)
    (f,) = rep["files"]
    assert (f["status"], f["chunks"], f["records"], f["records_written"]) == ("cancelled", 5, 500, 500), f
    assert (rep["totals"]["records"], rep["totals"]["records_written"]) == (500, 500), rep["totals"]

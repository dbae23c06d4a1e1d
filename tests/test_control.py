"""Operating a running job: pause, resume, set-concurrency and graceful cancel, from Python, the
``s3batch`` command and the ``temporal`` CLI, against the real stack."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)
from temporalio.exceptions import CancelledError
from temporalio.worker import Worker

import tests.slow_handlers  # noqa: F401 - registers slow_passthrough for the in-process worker
from s3batch import layout
from s3batch.devstack import Stack
from s3batch.models import Progress, S3BatchInput, S3BatchResult
from tests.test_cli import run
from workflows.batch import S3BatchWorkflow


def make_csv(rows: int) -> bytes:
    return ("id,name\n" + "".join(f"{i},n{i}\n" for i in range(rows))).encode()


def upload(s3: Any, bucket: str, files: int, rows: int) -> list[str]:
    keys = [f"in/{i:02d}.csv" for i in range(files)]
    for key in keys:
        s3.put_object(Bucket=bucket, Key=key, Body=make_csv(rows))
    return keys


def job(src: str, out: str, **kw: Any) -> S3BatchInput:
    # 100-record chunks at 50 ms each (slow_passthrough): a 1,000-row file is in flight ~0.5 s.
    options: dict[str, Any] = {
        "prefix": "in/",
        "output_bucket": out,
        "output_prefix": "o/",
        "handler": "slow_passthrough",
        "chunk_records": 100,
        "group_max_files": 1,
        "heartbeat_timeout_seconds": 2,
    }
    return S3BatchInput(bucket=src, **{**options, **kw})


async def start(client: Client, task_queue: str, spec: S3BatchInput, tag: str) -> WorkflowHandle[Any, S3BatchResult]:
    return await client.start_workflow(
        S3BatchWorkflow.run, spec, id=f"ctl-{tag}-{uuid.uuid4().hex[:8]}", task_queue=task_queue
    )


async def progress(handle: WorkflowHandle[Any, Any]) -> Progress:
    return await handle.query(S3BatchWorkflow.progress)


async def until(check: Callable[[Progress], bool], handle: WorkflowHandle[Any, Any], timeout: float = 60) -> Progress:
    deadline = time.monotonic() + timeout
    while True:
        p = await progress(handle)
        if check(p):
            return p
        assert time.monotonic() < deadline, p
        await asyncio.sleep(0.05)


def report(s3: Any, bucket: str, prefix: str = "o/") -> dict[str, Any]:
    return json.loads(s3.get_object(Bucket=bucket, Key=layout.report_key(prefix))["Body"].read())


async def assert_stays(handle: WorkflowHandle[Any, Any], done: int, seconds: float) -> None:
    """Progress stays paused at ``done`` files with nothing in flight for ``seconds``."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        p = await progress(handle)
        assert p.paused and p.files_in_flight == 0 and p.files_succeeded == done, p
        await asyncio.sleep(0.1)


async def test_pause_lets_running_files_finish_and_starts_no_new_one(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets: tuple[str, str]
):
    src, out = buckets
    keys = upload(s3, src, 5, 1_000)
    handle = await start(client, task_queue, job(src, out, max_concurrent_files=1), "pause")
    await until(lambda p: p.files_in_flight == 1, handle)

    paused = await handle.execute_update(S3BatchWorkflow.pause)
    assert paused.paused and paused.files_in_flight <= 1
    # The file in flight runs to its end; nothing starts after it.
    p = await until(lambda p: p.files_in_flight == 0, handle)
    assert p.files_succeeded < len(keys)
    await assert_stays(handle, p.files_succeeded, 2.0)
    desc = await handle.describe()
    assert desc.status == WorkflowExecutionStatus.RUNNING

    resumed = await handle.execute_update(S3BatchWorkflow.resume)
    assert not resumed.paused
    result = await handle.result()
    assert result.totals.files_succeeded == len(keys)
    assert result.totals.records_written == len(keys) * 1_000


async def test_set_concurrency_changes_files_in_flight_and_rejects_bad_values(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets: tuple[str, str]
):
    src, out = buckets
    keys = upload(s3, src, 8, 1_500)
    handle = await start(client, task_queue, job(src, out, max_concurrent_files=1), "conc")
    p = await until(lambda p: p.files_in_flight == 1, handle)
    assert p.max_concurrent_files == 1

    for bad in (0, 1_001):
        with pytest.raises(WorkflowUpdateFailedError) as err:
            await handle.execute_update(S3BatchWorkflow.set_concurrency, bad)
        assert "concurrency must be an integer from 1 to 1000" in str(err.value.cause)

    changed = await handle.execute_update(S3BatchWorkflow.set_concurrency, 3)
    assert changed.max_concurrent_files == 3
    p = await until(lambda p: p.files_in_flight == 3, handle)
    assert p.max_concurrent_files == 3
    result = await handle.result()
    assert result.totals.files_succeeded == len(keys)


async def test_cancel_stops_in_flight_files_and_still_writes_the_report(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets: tuple[str, str]
):
    src, out = buckets
    keys = upload(s3, src, 4, 20_000)  # 200 chunks of 50 ms: ~10 s per file
    handle = await start(client, task_queue, job(src, out, max_concurrent_files=2), "cancel")
    p = await until(lambda p: p.files_in_flight == 2, handle)
    in_flight = p.in_flight
    await asyncio.sleep(1.0)  # some chunks committed

    started = time.monotonic()
    await handle.cancel()
    with pytest.raises(WorkflowFailureError) as failure:
        await handle.result()
    assert isinstance(failure.value.cause, CancelledError)
    assert time.monotonic() - started < 8, "in-flight files should stop at a chunk boundary, not finish"
    assert (await handle.describe()).status == WorkflowExecutionStatus.CANCELED

    rep = report(s3, out)
    assert rep["status"] == "cancelled"
    assert rep["totals"]["files_cancelled"] == 2
    # Files in flight stopped as cancelled; the others are listed as never started (a redrive picks them up).
    assert sorted(f["key"] for f in rep["files"] if f["status"] == "cancelled") == in_flight
    assert sorted(f["key"] for f in rep["files"] if f["status"] == "not_started") == sorted(set(keys) - set(in_flight))
    assert rep["totals"]["files_not_started"] == 2
    # Each cancelled file kept its committed parts (a later job resumes from them).
    for key in in_flight:
        listed = s3.list_objects_v2(Bucket=out, Prefix=f"o/{key}/part-")
        assert 0 < listed["KeyCount"] < 200


async def test_temporal_cli_pauses_resumes_and_sets_concurrency(
    client: Client, worker: Worker, task_queue: str, stack: Stack, s3: Any, buckets: tuple[str, str]
):
    src, out = buckets
    keys = upload(s3, src, 4, 1_000)
    handle = await start(client, task_queue, job(src, out, max_concurrent_files=1), "tcli")
    await until(lambda p: p.files_in_flight == 1, handle)
    base = ("temporal", "workflow", "update", "execute", "--address", stack.config.temporal_address,
            "--workflow-id", handle.id)

    r = await run(*base, "--name", "pause")
    assert r.code == 0, r
    assert '"paused": true' in r.stdout.replace("\n", " ") or "paused" in r.stdout
    p = await until(lambda p: p.files_in_flight == 0, handle)
    await assert_stays(handle, p.files_succeeded, 1.0)

    bad = await run(*base, "--name", "set_concurrency", "--input", "0")
    assert bad.code != 0 and "concurrency must be" in bad.stdout + bad.stderr
    r = await run(*base, "--name", "set_concurrency", "--input", "2")
    assert r.code == 0, r
    assert (await progress(handle)).max_concurrent_files == 2

    r = await run(*base, "--name", "resume")
    assert r.code == 0, r
    result = await handle.result()
    assert result.totals.files_succeeded == len(keys)


async def test_s3batch_pause_set_concurrency_resume_report_and_list(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets: tuple[str, str]
):
    src, out = buckets
    keys = upload(s3, src, 3, 1_000)
    handle = await start(client, task_queue, job(src, out, max_concurrent_files=1), "s3cli")
    wid = handle.id
    await until(lambda p: p.files_in_flight == 1, handle)

    r = await run("s3batch", "pause", wid)
    assert r.code == 0, r
    assert f"Paused job {wid}" in r.stdout and "paused, at most 1 file(s) at once" in r.stdout
    bad = await run("s3batch", "set-concurrency", wid, "0")
    assert bad.code == 2 and "set_concurrency rejected" in bad.stderr and "from 1 to 1000" in bad.stderr, bad
    r = await run("s3batch", "set-concurrency", wid, "2", "--json")
    assert r.code == 0, r
    assert json.loads(r.stdout)["progress"]["max_concurrent_files"] == 2

    listed = await run("s3batch", "list", "--running")
    assert listed.code == 0, listed
    [row] = [line for line in listed.stdout.splitlines() if wid in line]
    assert "running" in row and task_queue in row
    early = await run("s3batch", "report", wid)
    assert early.code == 1 and "no report" in early.stderr, early

    r = await run("s3batch", "resume", wid)
    assert r.code == 0 and f"Resumed job {wid}" in r.stdout, r
    await handle.result()

    human = await run("s3batch", "report", wid)
    assert human.code == 0, human
    assert "succeeded" in human.stdout and f"s3://{out}/o/_report.json" in human.stdout
    for key in keys:
        [line] = [line for line in human.stdout.splitlines() if key in line]
        assert "succeeded" in line and "1,000" in line
    data = json.loads((await run("s3batch", "report", wid, "--json")).stdout)
    assert data["job_id"] == wid and sorted(f["key"] for f in data["files"]) == keys

    listed = json.loads((await run("s3batch", "list", "--json")).stdout)
    [mine] = [row for row in listed if row["workflow_id"] == wid]
    assert mine["status"] == "completed" and mine["close_time"]


async def test_s3batch_cancel_then_report_lists_cancelled_files(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets: tuple[str, str]
):
    src, out = buckets
    upload(s3, src, 2, 20_000)
    handle = await start(client, task_queue, job(src, out, max_concurrent_files=1), "s3cancel")
    p = await until(lambda p: p.files_in_flight == 1, handle)
    await asyncio.sleep(0.5)

    r = await run("s3batch", "cancel", handle.id)
    assert r.code == 0 and "Cancellation requested" in r.stdout, r
    with pytest.raises(WorkflowFailureError):
        await handle.result()
    human = await run("s3batch", "report", handle.id)
    assert human.code == 0, human
    [line] = [line for line in human.stdout.splitlines() if p.in_flight[0] in line]
    assert "cancelled" in line
    [line] = [line for line in human.stdout.splitlines() if "in/01.csv" in line]
    assert "not_started" in line  # never started: listed, so a redrive picks it up
    again = await run("s3batch", "cancel", handle.id)
    assert again.code == 3 and "not running" in again.stderr, again


async def test_search_attributes_index_jobs_started_by_s3batch(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets: tuple[str, str]
):
    from s3batch import search_attributes as sa

    src, out = buckets
    upload(s3, src, 2, 200)
    unindexed = await run("s3batch", "start", "--bucket", src, "--prefix", "in/", "--output-bucket", out,
                          "--output-prefix", "u/", "--task-queue", task_queue, "--wait")
    assert unindexed.code == 0, unindexed  # registered or not, the job runs

    assert await sa.ensure_registered(client)
    wid = f"ctl-sa-{uuid.uuid4().hex[:8]}"
    r = await run("s3batch", "start", "--bucket", src, "--prefix", "in/", "--output-bucket", out,
                  "--output-prefix", "o/", "--task-queue", task_queue, "--id", wid, "--wait")
    assert r.code == 0, r
    query = f'S3BatchSource="{src}/in/" AND S3BatchStatus="succeeded" AND S3BatchFilesDone=2'
    deadline = time.monotonic() + 30
    while not [wf async for wf in client.list_workflows(query) if wf.id == wid]:
        assert time.monotonic() < deadline, "job not found by its search attributes"
        await asyncio.sleep(0.5)
    listed = await run("s3batch", "list")
    [row] = [line for line in listed.stdout.splitlines() if wid in line]
    assert f"s3://{src}/in/" in row and "completed" in row

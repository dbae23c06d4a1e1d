"""Operating a running job: pause, resume, set-concurrency and graceful cancel, from Python, the
``s3batch`` command and the ``temporal`` CLI, against the real stack."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import pytest
from s3batch.workflows.batch import S3BatchWorkflow
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
from s3batch.dev.stack import Stack
from s3batch.messages import S3BatchResult
from s3batch.models import S3BatchInput
from tests.helpers import run, wait_for
from tests.helpers.data import make_csv
from tests.helpers.jobs import progress, slow_job, start, until
from tests.helpers.output import has_part, report


def upload(s3: Any, bucket: str, files: int, rows: int) -> list[str]:
    keys = [f"in/{i:02d}.csv" for i in range(files)]
    for key in keys:
        s3.put_object(Bucket=bucket, Key=key, Body=make_csv(rows))
    return keys


async def until_parts(s3: Any, bucket: str, keys: list[str], timeout: float = 60) -> None:
    """Until every file in ``keys`` has committed at least one part (chunks committed)."""
    await wait_for(
        lambda: all(has_part(s3, bucket, layout.file_dir("o/", key)) for key in keys),
        timeout,
        f"a committed part of each of {keys}",
    )


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
    handle = await start(client, task_queue, slow_job(src, out, max_concurrent_files=1), "pause")
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
    keys = upload(s3, src, 10, 1_500)  # 15 chunks of 50 ms: each file in flight ~0.75 s
    handle = await start(client, task_queue, slow_job(src, out, max_concurrent_files=1), "conc")
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

    # Lowered: the files in flight finish, no new one starts until fewer than 1 run, and from then
    # on at most one file is in flight.
    lowered = await handle.execute_update(S3BatchWorkflow.set_concurrency, 1)
    assert lowered.max_concurrent_files == 1
    p = await until(lambda p: p.files_in_flight <= 1, handle)
    assert p.files_succeeded < len(keys) - 1, "too few files left to see the lower limit at work"
    seen: list[int] = []

    async def all_done_one_at_a_time() -> bool:
        p = await progress(handle)
        seen.append(p.files_in_flight)
        assert p.files_in_flight <= 1 and p.max_concurrent_files == 1, p
        return p.files_succeeded == len(keys)

    await wait_for(all_done_one_at_a_time, 60, "every file done, one at a time")
    assert 1 in seen, "no file was seen in flight after lowering the concurrency"
    result = await handle.result()
    assert result.totals.files_succeeded == len(keys)


async def test_cancel_stops_in_flight_files_and_still_writes_the_report(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets: tuple[str, str]
):
    src, out = buckets
    keys = upload(s3, src, 4, 20_000)  # 200 chunks of 50 ms: ~10 s per file
    handle = await start(client, task_queue, slow_job(src, out, max_concurrent_files=2), "cancel")
    p = await until(lambda p: p.files_in_flight == 2, handle)
    in_flight = p.in_flight
    await until_parts(s3, out, in_flight)

    await handle.cancel()
    with pytest.raises(WorkflowFailureError) as failure:
        await handle.result()
    assert isinstance(failure.value.cause, CancelledError)
    assert (await handle.describe()).status == WorkflowExecutionStatus.CANCELED

    rep = report(s3, out)
    assert rep["status"] == "cancelled"
    assert rep["totals"]["files_cancelled"] == 2
    # Files in flight stopped as cancelled; the others are listed as never started (a redrive picks them up).
    assert sorted(f["key"] for f in rep["files"] if f["status"] == "cancelled") == in_flight
    assert sorted(f["key"] for f in rep["files"] if f["status"] == "not_started") == sorted(set(keys) - set(in_flight))
    assert rep["totals"]["files_not_started"] == 2
    # Each cancelled file kept its committed parts (a later job resumes from them), and stopped at a
    # chunk boundary instead of running to its end (200 parts).
    for key in in_flight:
        listed = s3.list_objects_v2(Bucket=out, Prefix=f"o/{key}/part-")
        assert 0 < listed["KeyCount"] < 200


async def test_temporal_cli_pauses_resumes_and_sets_concurrency(
    client: Client, worker: Worker, task_queue: str, stack: Stack, s3: Any, buckets: tuple[str, str]
):
    src, out = buckets
    keys = upload(s3, src, 4, 1_000)
    handle = await start(client, task_queue, slow_job(src, out, max_concurrent_files=1), "tcli")
    await until(lambda p: p.files_in_flight == 1, handle)
    base = ("temporal", "workflow", "update", "execute", "--address", stack.config.temporal_address,
            "--workflow-id", handle.id)

    r = await run(*base, "--name", "pause", "-o", "json")
    assert r.code == 0, r
    assert update_result(r.stdout)["paused"] is True, r.stdout
    p = await until(lambda p: p.files_in_flight == 0, handle)
    await assert_stays(handle, p.files_succeeded, 1.0)

    bad = await run(*base, "--name", "set_concurrency", "--input", "0")
    assert bad.code != 0 and "concurrency must be" in bad.stdout + bad.stderr
    r = await run(*base, "--name", "set_concurrency", "--input", "2", "-o", "json")
    assert r.code == 0, r
    assert update_result(r.stdout)["max_concurrent_files"] == 2, r.stdout
    assert (await progress(handle)).max_concurrent_files == 2

    r = await run(*base, "--name", "resume", "-o", "json")
    assert r.code == 0, r
    assert update_result(r.stdout)["paused"] is False, r.stdout
    result = await handle.result()
    assert result.totals.files_succeeded == len(keys)


async def test_s3batch_pause_set_concurrency_resume_report_and_list(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets: tuple[str, str]
):
    src, out = buckets
    # About 2 s a file (40 chunks of 50 ms), one at a time: the job is still running when the CLI pauses it,
    # even where each CLI call takes several seconds (a machine loaded to 12: three files, 6 s, were done first).
    keys = upload(s3, src, 6, 4_000)
    handle = await start(client, task_queue, slow_job(src, out, max_concurrent_files=1), "s3cli")
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
    assert early.code == 6 and "no report" in early.stderr, early

    r = await run("s3batch", "resume", wid)
    assert r.code == 0 and f"Resumed job {wid}" in r.stdout, r
    await handle.result()

    human = await run("s3batch", "report", wid)
    assert human.code == 0, human
    assert "succeeded" in human.stdout and f"s3://{out}/o/_report.json" in human.stdout
    for key in keys:
        [line] = [line for line in human.stdout.splitlines() if key in line]
        assert "succeeded" in line and "4,000" in line
    data = json.loads((await run("s3batch", "report", wid, "--json")).stdout)
    assert data["job_id"] == wid and sorted(f["key"] for f in data["files"]) == keys

    listed = json.loads((await run("s3batch", "list", "--json")).stdout)
    [mine] = [row for row in listed if row["workflow_id"] == wid]
    assert mine["status"] == "succeeded" and mine["close_time"]


async def test_s3batch_cancel_then_report_lists_cancelled_files(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets: tuple[str, str]
):
    src, out = buckets
    upload(s3, src, 2, 20_000)
    handle = await start(client, task_queue, slow_job(src, out, max_concurrent_files=1), "s3cancel")
    p = await until(lambda p: p.files_in_flight == 1, handle)
    await until_parts(s3, out, p.in_flight)

    r = await run("s3batch", "cancel", handle.id)
    assert r.code == 0 and "Cancellation requested" in r.stdout, r
    with pytest.raises(WorkflowFailureError):
        await handle.result()
    human = await run("s3batch", "report", handle.id)
    assert human.code == 4, human  # the report of a cancelled job: exit code 4
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
    async def found() -> bool:
        return bool([wf async for wf in client.list_workflows(query) if wf.id == wid])

    await wait_for(found, 30, f"{wid} listed by its search attributes ({query})", interval=0.5)
    listed = await run("s3batch", "list")
    [row] = [line for line in listed.stdout.splitlines() if wid in line]
    assert f"s3://{src}/in/" in row and "succeeded" in row


def cli_json(stdout: str) -> Any:
    """The ``-o json`` output of a ``temporal`` command: one JSON document, or one per line."""
    try:
        return json.loads(stdout)
    except ValueError:
        return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def update_result(stdout: str) -> dict[str, Any]:
    """The value an update returned, from ``temporal workflow update execute -o json``
    (``{"name": ..., "updateId": ..., "result": ...}``)."""
    return json.loads(stdout)["result"]


async def test_temporal_cli_queries_cancels_and_lists_jobs_by_status(
    client: Client, worker: Worker, task_queue: str, stack: Stack, s3: Any, buckets: tuple[str, str]
):
    """The ``temporal`` CLI paths of docs/how-to/operate.md, through the real binary: ``workflow query --name
    progress``, ``workflow update execute``, ``workflow cancel`` and ``workflow list --query`` on
    the ``S3BatchStatus`` values ``paused``, ``cancelled`` and ``failed``."""
    from s3batch import search_attributes as sa

    assert await sa.ensure_registered(client)
    src, out = buckets
    keys = upload(s3, src, 2, 20_000)  # 200 chunks of 50 ms: ~10 s per file
    s3.put_object(Bucket=src, Key="bad/x.data", Body=b'{"n": 1}\n')  # no known format: fails
    address = ("--address", stack.config.temporal_address, "--namespace", "default")

    async def start_indexed(spec: S3BatchInput, tag: str) -> WorkflowHandle[Any, S3BatchResult]:
        # As `s3batch start` does where the attributes exist: the job's source at start.
        return await client.start_workflow(
            S3BatchWorkflow.run,
            spec,
            id=f"ctl-{tag}-{uuid.uuid4().hex[:8]}",
            task_queue=task_queue,
            search_attributes=sa.at_start(spec.bucket, spec.prefix),
        )

    async def listed(status: str, wid: str) -> None:
        query = f'WorkflowType="S3BatchWorkflow" AND S3BatchStatus="{status}" AND WorkflowId="{wid}"'

        async def found() -> bool:
            r = await run("temporal", "workflow", "list", *address, "--query", query, "-o", "json")
            assert r.code == 0, r
            rows = cli_json(r.stdout) if r.stdout.strip() else []
            return [row["execution"]["workflowId"] for row in rows] == [wid]

        await wait_for(found, 30, f"temporal workflow list --query '{query}' to list {wid}", interval=0.5)

    handle = await start_indexed(slow_job(src, out, max_concurrent_files=1), "tq")
    await until(lambda p: p.files_in_flight == 1, handle)

    q = await run("temporal", "workflow", "query", *address, "--workflow-id", handle.id, "--name", "progress",
                  "-o", "json")
    assert q.code == 0, q
    [answer] = json.loads(q.stdout)["queryResult"]
    assert answer["files_listed"] == len(keys) and answer["files_in_flight"] == 1, q.stdout
    assert answer["in_flight"] == keys[:1] and answer["paused"] is False, q.stdout

    paused = await run("temporal", "workflow", "update", "execute", *address, "--workflow-id", handle.id,
                       "--name", "pause", "-o", "json")
    assert paused.code == 0 and update_result(paused.stdout)["paused"] is True, paused
    await listed("paused", handle.id)

    await until_parts(s3, out, keys[:1])
    cancelled = await run("temporal", "workflow", "cancel", *address, "--workflow-id", handle.id)
    assert cancelled.code == 0, cancelled
    with pytest.raises(WorkflowFailureError) as failure:
        await handle.result()
    assert isinstance(failure.value.cause, CancelledError)
    rep = report(s3, out)
    assert rep["status"] == "cancelled"
    assert [f["key"] for f in rep["files"] if f["status"] == "cancelled"] == keys[:1], rep["files"]
    await listed("cancelled", handle.id)

    failing = await start_indexed(S3BatchInput(bucket=src, prefix="bad/", output_bucket=out, output_prefix="f/"), "tf")
    with pytest.raises(WorkflowFailureError) as failure:
        await failing.result()
    assert failure.value.cause.type == "JobFailed"
    await listed("failed", failing.id)

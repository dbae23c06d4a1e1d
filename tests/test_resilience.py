"""Failures provoked for real: SIGKILLed and SIGTERMed worker processes, a killed workflow worker,
continue-as-new, and a source object overwritten while it is being read."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from s3batch.workflows.batch import S3BatchWorkflow
from temporalio.client import Client, WorkflowFailureError
from temporalio.worker import Worker

import tests.slow_handlers  # noqa: F401 - registers slow_passthrough for in-process workers
from s3batch.dev.workers import WorkerProcess
from s3batch.errors import WORKER_SHUTDOWN
from s3batch.models import S3BatchInput
from tests.helpers import wait_for
from tests.helpers.assertions import assert_exactly_once
from tests.helpers.data import make_csv
from tests.helpers.output import committed_parts, report
from tests.helpers.workers import worker_process

pytestmark = pytest.mark.slow


async def test_sigkill_mid_file_resumes_from_last_committed_chunk(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, tmp_path: Path
) -> None:
    src, out = buckets
    rows, chunk = 40_000, 1_000
    s3.put_object(Bucket=src, Key="big.csv", Body=make_csv(rows))
    first = worker_process(task_queue, tmp_path, "a", S3BATCH_TEST_HANDLER_DELAY="0.1")
    second: WorkerProcess | None = None
    try:
        first.wait_ready()
        handle = await client.start_workflow(
            S3BatchWorkflow.run,
            S3BatchInput(
                bucket=src,
                output_bucket=out,
                output_prefix="o/",
                chunk_records=chunk,
                handler="slow_passthrough",
                heartbeat_timeout_seconds=5,
            ),
            id=f"crash-{uuid.uuid4().hex[:8]}",
            task_queue=task_queue,
        )
        await wait_for(lambda: len(committed_parts(s3, out, "o/big.csv/")) >= 6, 60, "6 committed parts")
        first.kill()
        killed_at = time.monotonic()
        at_kill = committed_parts(s3, out, "o/big.csv/")
        committed_records = at_kill[-1].next_record
        assert 0 < committed_records < rows, "the kill must land mid-file"

        second = worker_process(task_queue, tmp_path, "b")
        second.wait_ready()
        result = await handle.result()
        assert result.status == "succeeded"
        recovered_in = time.monotonic() - killed_at
    finally:
        first.stop()
        if second:
            second.stop()

    entry = report(s3, out, "o/")["files"][0]
    assert entry["status"] == "succeeded"
    assert entry["attempts"] >= 2
    # Resumed exactly where the committed output ended: only the chunk in flight at the kill
    # (never written) is processed again, at most `chunk` records.
    assert entry["resumed_from_record"] == committed_records
    assert entry["records"] == rows
    assert_exactly_once(s3, out, "o/big.csv/", rows)
    assert recovered_in < 60


async def test_sigterm_hands_the_file_over_without_waiting_for_the_heartbeat_timeout(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, tmp_path: Path
) -> None:
    src, out = buckets
    rows, chunk = 40_000, 1_000
    s3.put_object(Bucket=src, Key="big.csv", Body=make_csv(rows))
    # The first worker is slow (40 chunks of 0.5 s), so the file is still in flight once the second has
    # started, however loaded the machine; the second finishes the rest quickly.
    first = worker_process(task_queue, tmp_path, "a", S3BATCH_TEST_HANDLER_DELAY="0.5")
    second: WorkerProcess | None = None
    try:
        first.wait_ready()
        handle = await client.start_workflow(
            S3BatchWorkflow.run,
            S3BatchInput(
                bucket=src,
                output_bucket=out,
                output_prefix="o/",
                chunk_records=chunk,
                handler="slow_passthrough",
                heartbeat_timeout_seconds=30,
            ),
            id=f"deploy-{uuid.uuid4().hex[:8]}",
            task_queue=task_queue,
        )
        await wait_for(lambda: len(committed_parts(s3, out, "o/big.csv/")) >= 4, 60, "4 committed parts")
        second = worker_process(task_queue, tmp_path, "b", S3BATCH_TEST_HANDLER_DELAY="0.02")
        second.wait_ready()
        first.proc.send_signal(15)

        async def retried() -> Any:
            desc = await handle.describe()
            pending = desc.raw_description.pending_activities
            return [p for p in pending if p.attempt >= 2 and p.state == 2]  # STARTED on attempt 2

        [pending] = await wait_for(retried, 60, "attempt 2 of the file running on the other worker")
        # Handed over by the graceful stop (attempt 1 failed with WorkerShutdown at a chunk boundary),
        # not by the 30 s heartbeat timeout. How fast it is, is measured by `make bench`.
        assert pending.last_failure.application_failure_info.type == WORKER_SHUTDOWN, pending.last_failure
        assert first.proc.wait(25) == 0, first.log()
        result = await handle.result()
        assert result.status == "succeeded"
    finally:
        first.stop()
        if second:
            second.stop()

    entry = report(s3, out, "o/")["files"][0]
    assert entry["attempts"] >= 2
    assert entry["resumed_from_record"] > 0
    assert_exactly_once(s3, out, "o/big.csv/", rows)


async def test_workflow_worker_killed_mid_job_is_replayed_elsewhere(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, tmp_path: Path
) -> None:
    src, out = buckets
    files = 6
    for i in range(files):
        s3.put_object(Bucket=src, Key=f"f{i}.csv", Body=make_csv(3_000))
    first = worker_process(task_queue, tmp_path, "a", S3BATCH_TEST_HANDLER_DELAY="0.1")
    second: WorkerProcess | None = None
    try:
        first.wait_ready()
        handle = await client.start_workflow(
            S3BatchWorkflow.run,
            S3BatchInput(
                bucket=src,
                output_bucket=out,
                output_prefix="o/",
                chunk_records=500,
                handler="slow_passthrough",
                max_concurrent_files=2,
                group_max_files=1,
                heartbeat_timeout_seconds=5,
            ),
            id=f"wfkill-{uuid.uuid4().hex[:8]}",
            task_queue=task_queue,
        )

        async def some_done() -> bool:
            progress = await handle.query(S3BatchWorkflow.progress)
            return progress.files_succeeded >= 2

        await wait_for(some_done, 120, "2 files succeeded", interval=0.1)
        first.kill()
        second = worker_process(task_queue, tmp_path, "b")
        second.wait_ready()
        result = await handle.result()
    finally:
        first.stop()
        if second:
            second.stop()
    assert result.status == "succeeded"
    assert result.totals.files_succeeded == files
    assert result.totals.records_written == files * 3_000
    for i in range(files):
        assert_exactly_once(s3, out, f"o/f{i}.csv/", 3_000)


async def test_continue_as_new_keeps_every_file_in_the_report(
    client: Client, worker: Worker, s3: Any, buckets: tuple[str, str], task_queue: str
) -> None:
    src, out = buckets
    for i in range(7):
        s3.put_object(Bucket=src, Key=f"in/{i:02d}.jsonl", Body=b'{"a": 1}\n{"a": 2}\n')
    job_id = f"can-{uuid.uuid4().hex[:8]}"
    job = S3BatchInput(
        bucket=src, prefix="in/", output_bucket=out, output_prefix="o/", max_concurrent_files=2, group_max_files=1
    )
    result = await client.execute_workflow(
        "S3BatchWorkflow",
        args=[job.model_dump(mode="json"), {"files_per_run": 3}],
        id=job_id,
        task_queue=task_queue,
        result_type=dict,
    )
    assert result["totals"]["files_succeeded"] == 7
    assert result["totals"]["records_written"] == 14
    desc = await client.get_workflow_handle(job_id).describe()
    assert desc.run_id != desc.raw_description.workflow_execution_info.first_run_id, "expected continue-as-new"
    files = report(s3, out, "o/")["files"]
    assert sorted(f["key"] for f in files) == [f"in/{i:02d}.jsonl" for i in range(7)]


async def test_source_overwritten_mid_file_fails_clearly(
    client: Client, worker: Worker, s3: Any, buckets: tuple[str, str], task_queue: str
) -> None:
    src, out = buckets
    rows = 24_000  # ~24 MB: more than one 16 MiB read window, so the change is seen mid-file
    s3.put_object(Bucket=src, Key="big.csv", Body=make_csv(rows, pad=1_000))
    handle = await client.start_workflow(
        S3BatchWorkflow.run,
        S3BatchInput(bucket=src, output_bucket=out, output_prefix="o/", chunk_records=500, handler="slow_passthrough"),
        id=f"changed-{uuid.uuid4().hex[:8]}",
        task_queue=task_queue,
    )
    await wait_for(lambda: committed_parts(s3, out, "o/big.csv/"), 60, "a committed part")
    s3.put_object(Bucket=src, Key="big.csv", Body=make_csv(10))
    with pytest.raises(WorkflowFailureError) as failure:
        await handle.result()
    assert failure.value.cause.type == "JobFailed"
    entry = report(s3, out, "o/")["files"][0]
    assert entry["status"] == "failed"
    assert entry["error"].startswith("SourceChanged: s3://")
    assert "changed since it was listed" in entry["error"]

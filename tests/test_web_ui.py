"""The Temporal Web UI shows a running job: the file each activity processes and the job's progress
text, checked in a real headless Chromium."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from s3batch.devstack import Stack
from s3batch.models import S3BatchInput
from scripts.ui_screenshot import capture, chromium
from tests.procs import WorkerProcess
from workflows.batch import S3BatchWorkflow

pytestmark = pytest.mark.skipif(
    chromium() is None, reason="Debian's chromium is not installed here (make test installs it where apt-get works)"
)


async def test_running_job_page_shows_file_and_progress(
    stack: Stack, client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, tmp_path: Path
) -> None:
    src, out = buckets
    key = f"ui/customers-{uuid.uuid4().hex[:6]}.csv"
    rows = "".join(f"{i},name {i}\n" for i in range(20_000))
    s3.put_object(Bucket=src, Key=key, Body=f"id,name\n{rows}".encode())
    worker = WorkerProcess(task_queue, tmp_path, "ui", S3BATCH_TEST_HANDLER_DELAY="2.0")
    try:
        worker.wait_ready()
        handle = await client.start_workflow(
            S3BatchWorkflow.run,
            S3BatchInput(bucket=src, prefix="ui/", output_bucket=out, handler="slow_passthrough", chunk_records=1_000),
            id=f"ui-{uuid.uuid4().hex[:8]}",
            task_queue=task_queue,
            static_summary=f"s3://{src}/ui/ -> s3://{out}/",
        )
        while not (await handle.query(S3BatchWorkflow.progress)).files_in_flight:
            await asyncio.sleep(0.2)
        pages = await asyncio.to_thread(
            capture, stack.config.ui_url, handle.id, handle.result_run_id or "", key, tmp_path
        )
        assert (await handle.describe()).status.name == "RUNNING"
        await handle.cancel()
    finally:
        worker.stop()
    assert key in pages["timeline"]
    assert "s3batch.process_file" in pages["timeline"]
    details = pages["details"]
    assert f"s3://{src}/ui/ -> s3://{out}/" in details
    assert "files: 0 done of 1 listed, 0 failed, 1 in flight" in details
    assert "records: 0 written" in details
    assert (tmp_path / "ui-timeline.png").stat().st_size > 10_000

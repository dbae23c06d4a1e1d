"""What the Temporal Web UI shows of a job: the summary and current details the product sets (read
through the API the UI uses), and, in a real headless Chromium, the file each activity processes and
the job's progress text on the page."""

from __future__ import annotations

import asyncio
import re
import uuid
from pathlib import Path
from typing import Any

import pytest
from s3batch.workflows.batch import S3BatchWorkflow
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client, WorkflowHandle
from temporalio.worker import Worker

import tests.slow_handlers  # noqa: F401 - registers slow_passthrough (50 ms a chunk) for the in-process worker
from s3batch.dev.stack import Stack
from s3batch.models import S3BatchInput
from scripts.ui_screenshot import capture, chromium
from tests.helpers import run, wait_for
from tests.helpers.data import make_csv
from tests.helpers.workers import worker_process


async def details(handle: WorkflowHandle[Any, Any]) -> str:
    """The workflow's current details, as the Web UI reads them (the SDK's metadata query)."""
    metadata = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    return metadata.current_details


async def details_matching(handle: WorkflowHandle[Any, Any], pattern: str, timeout: float = 60) -> str:
    async def matching() -> str | None:
        text = await details(handle)
        return text if re.search(pattern, text) else None

    return await wait_for(matching, timeout, f"current details of {handle.id} matching {pattern!r}")


async def test_summary_is_the_source_and_output_and_details_follow_the_files(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets: tuple[str, str]
) -> None:
    src, out = buckets
    for i in range(3):
        s3.put_object(Bucket=src, Key=f"in/{i}.csv", Body=make_csv(4_000))  # 40 chunks of 50 ms: ~2 s each
    wid = f"ui-sum-{uuid.uuid4().hex[:8]}"
    started = await run(
        "s3batch", "start", "--bucket", src, "--prefix", "in/", "--output-bucket", out, "--output-prefix", "o/",
        "--handler", "slow_passthrough", "--chunk-records", "100", "--group-max-files", "1",
        "--max-concurrent-files", "1", "--task-queue", task_queue, "--id", wid,
    )
    assert started.code == 0, started
    handle = client.get_workflow_handle(wid)
    head = f"s3://{src}/in/ -> s3://{out}/o/"

    # The summary is set by `s3batch start`, not by this test.
    assert await (await handle.describe()).static_summary() == head
    # The details follow the files as they finish.
    first = await details_matching(handle, r"files: 0 done of 3 listed, 0 failed, 1 in flight \(max 1\)")
    assert first.startswith(f"**processing** {head}")
    await details_matching(handle, r"files: 1 done of 3 listed, 0 failed, 1 in flight")
    await details_matching(handle, r"files: 2 done of 3 listed, 0 failed, 1 in flight")
    await handle.result()
    final = await details(handle)
    assert final.startswith(f"**succeeded** {head}"), final
    assert "files: 3 done of 3 listed, 0 failed, 0 in flight" in final
    assert "records: 12,000 written, 0 rejected" in final  # numbers as the CLI prints them
    assert f"report: s3://{out}/o/_report.json" in final


async def test_details_are_set_again_after_continue_as_new(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets: tuple[str, str]
) -> None:
    """Continue-as-new drops a run's current details: each new run must set them again, with the
    totals of the whole job so far."""
    src, out = buckets
    for i in range(5):
        s3.put_object(Bucket=src, Key=f"in/{i}.csv", Body=make_csv(2_000))  # ~1 s each
    job = S3BatchInput(
        bucket=src, prefix="in/", output_bucket=out, output_prefix="o/", handler="slow_passthrough",
        chunk_records=100, group_max_files=1, max_concurrent_files=1,
    )
    handle = await client.start_workflow(
        "S3BatchWorkflow",
        args=[job.model_dump(mode="json"), {"files_per_run": 2}],
        id=f"ui-can-{uuid.uuid4().hex[:8]}",
        task_queue=task_queue,
    )

    async def in_a_later_run() -> bool:
        p = await handle.query(S3BatchWorkflow.progress)
        return p.run >= 1 and p.files_in_flight == 1

    await wait_for(in_a_later_run, 60, "a file in flight in run 1 or later")
    text = await details(handle)  # the latest run's
    done = re.search(r"files: (\d) done of 5 listed", text)
    assert done and int(done.group(1)) >= 2, text
    assert text.startswith(f"**processing** s3://{src}/in/ -> s3://{out}/o/"), text
    assert "1 in flight" in text
    await handle.result()
    assert "files: 5 done of 5 listed, 0 failed, 0 in flight" in await details(handle)


@pytest.mark.skipif(
    chromium() is None, reason="Debian's chromium is not installed here (make test installs it where apt-get works)"
)
async def test_running_job_page_shows_file_and_progress(
    stack: Stack, client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, tmp_path: Path
) -> None:
    src, out = buckets
    key = f"ui/customers-{uuid.uuid4().hex[:6]}.csv"
    rows = "".join(f"{i},name {i}\n" for i in range(20_000))
    s3.put_object(Bucket=src, Key=key, Body=f"id,name\n{rows}".encode())
    worker = worker_process(task_queue, tmp_path, "ui", S3BATCH_TEST_HANDLER_DELAY="2.0")
    try:
        worker.wait_ready()
        wid = f"ui-{uuid.uuid4().hex[:8]}"
        # Started as users start jobs: `s3batch start` sets the summary the page shows.
        started = await run(
            "s3batch", "start", "--bucket", src, "--prefix", "ui/", "--output-bucket", out,
            "--handler", "slow_passthrough", "--chunk-records", "1000", "--task-queue", task_queue, "--id", wid,
        )
        assert started.code == 0, started
        handle = client.get_workflow_handle(wid)

        async def in_flight() -> int:
            return (await handle.query(S3BatchWorkflow.progress)).files_in_flight

        await wait_for(in_flight, 60, "the file in flight", interval=0.2)
        run_id = (await handle.describe()).run_id
        pages = await asyncio.to_thread(capture, stack.config.ui_url, wid, run_id, key, tmp_path)
        assert (await handle.describe()).status.name == "RUNNING"
        await handle.cancel()
    finally:
        worker.stop()
    assert key in pages["timeline"]
    assert "s3batch.process_file" in pages["timeline"]
    page = pages["details"]
    assert f"s3://{src}/ui/ -> s3://{out}/" in page
    assert "files: 0 done of 1 listed, 0 failed, 1 in flight" in page
    assert "records: 0 written" in page
    assert (tmp_path / "ui-timeline.png").stat().st_size > 10_000

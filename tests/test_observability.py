"""The worker's Prometheus endpoint and structured logs, from a real worker process."""

from __future__ import annotations

import json
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from s3batch.workflows.batch import S3BatchWorkflow
from temporalio.client import Client

from s3batch.dev.stack import SECRET_KEY, free_port_block
from s3batch.models import S3BatchInput
from tests.helpers import wait_for
from tests.helpers.workers import worker_process

MARKER = "Zq9-record-content-marker"


def metric_values(text: str, name: str) -> list[float]:
    return [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{")]


async def test_metrics_and_json_logs(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, tmp_path: Path
) -> None:
    src, out = buckets
    rows = [f'{{"id": {i}, "note": "{MARKER}"}}' for i in range(2_500)] + ["{broken " + MARKER]
    s3.put_object(Bucket=src, Key="logs/a.jsonl", Body=("\n".join(rows) + "\n").encode())
    port = free_port_block([0])
    worker = worker_process(
        task_queue,
        tmp_path,
        "metrics",
        S3BATCH_METRICS_ADDRESS=f"127.0.0.1:{port}",
        S3BATCH_LOG_FORMAT="json",
    )
    try:
        worker.wait_ready()
        job_id = f"obs-{uuid.uuid4().hex[:8]}"
        await client.execute_workflow(
            S3BatchWorkflow.run,
            S3BatchInput(bucket=src, prefix="logs/", output_bucket=out, chunk_records=1_000),
            id=job_id,
            task_queue=task_queue,
        )
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    finally:
        worker.terminate()

    assert sum(metric_values(text, "s3batch_records_processed")) == 2_501
    assert sum(metric_values(text, "s3batch_records_rejected")) == 1
    assert sum(metric_values(text, "s3batch_chunks_committed")) == 3
    assert sum(metric_values(text, "s3batch_bytes_read")) > 0
    assert "s3batch_checkpoint_age_seconds" in text
    assert "temporal_activity_execution_latency" in text  # the SDK's own metrics, same endpoint

    lines = [json.loads(line) for line in worker.log().splitlines() if line.startswith("{")]
    finished = [entry for entry in lines if entry["message"].startswith("finished s3://")]
    assert finished, worker.log()
    assert finished[0]["job_id"] == job_id
    assert finished[0]["key"] == "logs/a.jsonl"
    assert finished[0]["attempt"] == 1
    assert MARKER not in worker.log()
    assert SECRET_KEY not in worker.log()


async def test_jobs_started_without_search_attributes_are_indexed_by_a_registering_worker(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, tmp_path: Path
) -> None:
    src, out = buckets
    s3.put_object(Bucket=src, Key="sa/a.jsonl", Body=b'{"a": 1}\n')
    worker = worker_process(task_queue, tmp_path, "sa")  # worker.py registers the attributes at start
    try:
        worker.wait_ready()
        job_id = f"sa-{uuid.uuid4().hex[:8]}"
        # Started like `temporal workflow start` would: plain JSON, no search attributes.
        await client.execute_workflow(
            "S3BatchWorkflow",
            {"bucket": src, "prefix": "sa/", "output_bucket": out},
            id=job_id,
            task_queue=task_queue,
        )
    finally:
        worker.terminate()
    query = f'S3BatchSource="{src}/sa/" AND S3BatchStatus="succeeded" AND S3BatchFilesDone=1'

    async def listed() -> list[str]:
        return [w.id async for w in client.list_workflows(query)]

    # Visibility is eventually consistent.
    assert await wait_for(listed, 30, f"a job listed by {query}", interval=0.2) == [job_id]

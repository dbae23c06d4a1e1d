"""On demand: upload sample files and start an s3batch job, then say where to watch it.

Runs in the worker image (``docker compose run --rm demo``) with the same environment conventions
as the worker: ``TEMPORAL_*`` for the server, boto3's variables for S3, and

    S3BATCH_SOURCE_BUCKET / S3BATCH_OUTPUT_BUCKET   buckets (created by the create-buckets service)
    S3BATCH_DEMO_FILES / S3BATCH_DEMO_ROWS          how much sample data (default 6 files x 200,000 rows)
    S3BATCH_TASK_QUEUE                              the workers' task queue (default s3-batch)

It prints the workflow id on the last line and exits once the job has started; the workers do the
rest. Watch it in the Web UI, or wait for the result with
``temporal workflow result --workflow-id <id>``.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid

import boto3
from s3batch.workflows.batch import S3BatchWorkflow

from s3batch.config import Settings, connect, ui_base
from s3batch.models import S3BatchInput
from s3batch.plugin import S3BatchPlugin


def sample_csv(file_no: int, rows: int) -> bytes:
    lines = ["id,name,email,city,amount"]
    lines += [
        f"{i},customer {file_no}-{i},c{i}@example.com,city {i % 97},{i % 1000}.{i % 100:02d}" for i in range(rows)
    ]
    return ("\n".join(lines) + "\n").encode()


def main() -> int:
    settings = Settings()
    source = os.environ.get("S3BATCH_SOURCE_BUCKET", "incoming")
    output = os.environ.get("S3BATCH_OUTPUT_BUCKET", "processed")
    files = int(os.environ.get("S3BATCH_DEMO_FILES", "6"))
    rows = int(os.environ.get("S3BATCH_DEMO_ROWS", "200000"))
    run = time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]

    s3 = boto3.client("s3")
    prefix = f"demo/{run}/"
    for n in range(files):
        s3.put_object(Bucket=source, Key=f"{prefix}customers-{n:02d}.csv", Body=sample_csv(n, rows))
    sys.stdout.write(f"uploaded {files} files x {rows:,} rows to s3://{source}/{prefix}\n")

    job = S3BatchInput(bucket=source, prefix=prefix, output_bucket=output, output_prefix=f"out/{run}/")
    workflow_id = f"demo-{run}"

    async def start() -> str:
        client = await connect([S3BatchPlugin.from_settings(settings)])
        handle = await client.start_workflow(S3BatchWorkflow.run, job, id=workflow_id, task_queue=settings.task_queue)
        return f"{ui_base(settings)}/namespaces/{client.namespace}/workflows/{handle.id}/{handle.result_run_id}/history"

    url = asyncio.run(start())
    sys.stdout.write(f"job started: {url}\n")
    sys.stdout.write(f"output: s3://{output}/out/{run}/ (report: _report.json)\n")
    sys.stdout.write(f"{workflow_id}\n")
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: the Temporal client's Rust threads can still touch the GIL while
    # Python finalizes, aborting a short-lived client process after its work is done
    # (temporalio/sdk-python issue 300). Nothing here needs cleaning up.
    os._exit(code)

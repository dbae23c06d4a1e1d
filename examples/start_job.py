"""Run an s3batch job from Python on a worker of your own: the Python example of the README, as a script.

    eval "$(.venv/bin/s3batch-stack env)"   # the local stack (or your own TEMPORAL_* and AWS_* settings)
    python examples/start_job.py incoming demo/ processed runs/python/

The plugin brings the workflow, the activities and the data converter to both the client and the
worker; the worker here runs in this process until the job ends.
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid

from temporalio.client import Client
from temporalio.worker import Worker

from s3batch import S3BatchInput, S3BatchPlugin, S3BatchWorkflow


async def main(bucket: str, prefix: str, output_bucket: str, output_prefix: str) -> None:
    client = await Client.connect(os.environ.get("TEMPORAL_ADDRESS", "localhost:7233"), plugins=[S3BatchPlugin()])
    async with Worker(client, task_queue="s3-batch"):  # workflow + activities come from the plugin
        result = await client.execute_workflow(
            S3BatchWorkflow.run,
            S3BatchInput(bucket=bucket, prefix=prefix, output_bucket=output_bucket, output_prefix=output_prefix),
            id=f"import-{uuid.uuid4().hex[:8]}",
            task_queue="s3-batch",
        )
    t = result.totals
    # A script's output (T201 bans print in library code).
    print(f"{result.status}: {t.files_succeeded} of {t.files_listed} files, {t.records_written:,} written")  # noqa: T201
    print(f"report: s3://{result.report_bucket}/{result.report_key}")  # noqa: T201


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit("usage: python examples/start_job.py BUCKET PREFIX OUTPUT_BUCKET OUTPUT_PREFIX")
    asyncio.run(main(*sys.argv[1:]))

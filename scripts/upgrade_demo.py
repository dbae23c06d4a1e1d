"""``make upgrade-demo``: an upgrade with Worker Versioning, jobs running, on the local stack.

1. Starts the local stack (or reuses it, as ``make demo`` does) and uploads ten CSV files.
2. Starts a worker of build ``v1`` of the Worker Deployment ``s3batch-demo`` and makes it current.
3. Starts two jobs on v1: ``wide`` (two files, both in flight at once) and ``long`` (ten files, one at a time).
4. Starts a worker of build ``v2`` beside it and makes v2 current (``s3batch deploy promote v2``).
5. Starts a third job, ``new``: it runs on v2. ``wide`` finishes on v1, where it started; ``long`` moves
   to v2 at its next file end (its run hands its file in flight over and continues as new on v2).
6. Prints which build each run of each job ran on, waits until no run is pinned to v1, stops the v1
   worker (SIGTERM) and prints ``s3batch deploy status``. The v2 worker is stopped at the end too.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from rich.console import Console
from temporalio.client import Client, WorkflowHandle

from s3batch.cli.deploy import print_run_versions
from s3batch.client import connect
from s3batch.client.deployments import describe_deployment, promote, run_versions
from s3batch.dev.sample_data import customers_csv, upload_chunks
from s3batch.dev.stack import ensure_buckets, s3_client
from s3batch.dev.workers import WorkerProcess
from s3batch.messages import S3BatchResult
from s3batch.models import S3BatchInput

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from scripts.demo import stack_up  # noqa: E402  (make demo's stack start)

DEPLOYMENT = "s3batch-demo"
SOURCE_BUCKET, OUTPUT_BUCKET = "incoming", "processed"
FILES, ROWS = 10, 150_000
"""``long``'s files (``wide`` and ``new`` read two of the same size)."""
console = Console(highlight=False, soft_wrap=True)


def worker(build: str, root: Path, task_queue: str) -> WorkerProcess:
    env = {"S3BATCH_DEPLOYMENT_NAME": DEPLOYMENT, "S3BATCH_BUILD_ID": build, "S3BATCH_MAX_CONCURRENT_FILES": "2"}
    w = WorkerProcess(task_queue, root, f"upgrade-{build}", env=env)
    w.ready_timeout = 60
    console.print(f"  worker {build}: pid {w.proc.pid}, log {w.log_path}")
    return w.wait_ready()


async def start(client: Client, task_queue: str, name: str, prefix: str, stamp: str, concurrency: int,
                files_per_run: int = 500) -> WorkflowHandle[Any, S3BatchResult]:
    spec = S3BatchInput(bucket=SOURCE_BUCKET, prefix=prefix, output_bucket=OUTPUT_BUCKET,
                        output_prefix=f"upgrade-demo/{stamp}/{name}/", max_concurrent_files=concurrency)
    args = [spec.model_dump(mode="json", exclude_unset=True), {"files_per_run": files_per_run}]
    handle = await client.start_workflow("S3BatchWorkflow", args=args, id=f"upgrade-{name}-{stamp}",
                                         task_queue=task_queue, result_type=S3BatchResult)
    console.print(f"  started job {handle.id}")
    return handle


async def demo(root: Path) -> None:
    client = await connect()
    stamp = time.strftime("%H%M%S")
    task_queue = f"upgrade-demo-{uuid.uuid4().hex[:6]}"
    console.rule("[bold]2. v1 is current")
    v1 = worker("v1", root, task_queue)
    await promote(client, DEPLOYMENT, "v1")
    console.rule("[bold]3. Two jobs on v1")
    wide = await start(client, task_queue, "wide", "upgrade-demo/wide/", stamp, concurrency=2)
    long = await start(client, task_queue, "long", "upgrade-demo/long/", stamp, concurrency=1, files_per_run=4)
    console.rule("[bold]4. v2 beside v1, made current")
    v2 = worker("v2", root, task_queue)
    try:
        await promote(client, DEPLOYMENT, "v2")
        console.print("  s3batch deploy promote v2: new jobs and continue-as-new start on v2")
        console.rule("[bold]5. A new job")
        new = await start(client, task_queue, "new", "upgrade-demo/wide/", stamp, concurrency=2)
        for handle in (wide, long, new):
            result = await handle.result()
            console.print(f"  {handle.id}: {result.status}, {result.totals.records_written:,} records")
            print_run_versions(await run_versions(client, handle.id))
        console.rule("[bold]6. v1 drained and stopped")
        while (await describe_deployment(client, DEPLOYMENT)).version("v1").running:  # type: ignore[union-attr]
            await asyncio.sleep(1)
        console.print(f"  no run pinned to v1: stopping its worker (exit {v1.terminate()})")
        status = await asyncio.create_subprocess_exec(
            str(Path(sys.executable).parent / "s3batch"), "deploy", "status", "--deployment-name", DEPLOYMENT)
        await status.wait()
    finally:
        v1.stop()
        v2.stop()


def main() -> int:
    root = Path(os.environ.get("S3BATCH_STACK_DIR", ".stack")).resolve()
    console.rule("[bold]1. Local stack and data")
    config = stack_up(root)
    os.environ.update(config.env())
    s3 = s3_client(config)
    ensure_buckets(s3, SOURCE_BUCKET, OUTPUT_BUCKET)
    for i in range(FILES):
        upload_chunks(s3, SOURCE_BUCKET, f"upgrade-demo/long/{i:02d}.csv", customers_csv(ROWS, seed=i))
    for i in range(2):
        upload_chunks(s3, SOURCE_BUCKET, f"upgrade-demo/wide/{i:02d}.csv", customers_csv(ROWS, seed=100 + i))
    console.print(f"  {FILES} + 2 files of {ROWS:,} rows under s3://{SOURCE_BUCKET}/upgrade-demo/")
    asyncio.run(demo(root))
    return 0


if __name__ == "__main__":
    sys.exit(main())

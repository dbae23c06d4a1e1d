"""``make demo``: one job, end to end, on the local stack.

1. Starts the local stack (or reuses the one recorded in ``.stack/stack.json``), exactly as
   ``s3batch-stack up`` does; ports come from ``S3BATCH_TEMPORAL_PORT``, ``S3BATCH_UI_PORT``,
   ``S3BATCH_S3_PORT`` and ``S3BATCH_WEED_BASE_PORT``.
2. Creates the buckets ``incoming`` and ``processed`` and uploads generated sample data under
   ``incoming/demo/``: a 200,000-row customer CSV, a JSONL of events, a gzipped JSONL and a CSV
   with malformed rows.
3. Starts two workers (``s3batch-worker``), runs ``s3batch start ... --wait`` with its progress bar,
   prints the report, then stops the workers with SIGTERM. The stack keeps running (for the Web UI);
   ``make stack-down`` stops it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from s3batch.dev import stack as devstack
from s3batch.dev.sample_data import upload_samples
from s3batch.dev.stack import StackConfig, ensure_buckets, s3_client

SOURCE_BUCKET = "incoming"
OUTPUT_BUCKET = "processed"
SOURCE_PREFIX = "demo/"
CSV_ROWS = 200_000
WORKERS = 2

BIN = Path(sys.executable).parent
console = Console(highlight=False, soft_wrap=True)


def stack_up(root: Path) -> StackConfig:
    """Start the stack as ``s3batch-stack up`` does (or reuse a running one) and return its config."""
    devstack.main(["up", "--root", str(root)])
    saved = json.loads((root / "stack.json").read_text())["config"]
    saved["root"] = Path(saved["root"])
    return StackConfig(**saved)


def start_workers(root: Path, count: int) -> list[subprocess.Popen[bytes]]:
    """Worker subprocesses pointed at the stack (through ``os.environ``), logging to ``root``."""
    workers = []
    for n in range(1, count + 1):
        with open(root / f"demo-worker-{n}.log", "ab") as log:
            workers.append(
                subprocess.Popen(
                    [str(BIN / "s3batch-worker")],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,  # Ctrl-C reaches the demo, which stops them gracefully
                )
            )
    return workers


def stop_workers(workers: list[subprocess.Popen[bytes]], timeout: float = 45) -> None:
    """SIGTERM, the way a deploy stops a worker; SIGKILL only if one overstays ``timeout``."""
    for proc in workers:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for proc in workers:
        try:
            proc.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def print_report(report: dict[str, Any]) -> None:
    table = Table(title=f"Report of {report['job_id']}: {report['status']}", title_justify="left")
    table.add_column("file", overflow="fold")
    for column in ("status", "records", "written", "rejected", "attempts"):
        table.add_column(column, justify="left" if column == "status" else "right", no_wrap=True)
    for f in sorted(report["files"], key=lambda f: f["key"]):
        table.add_row(
            f["key"],
            f["status"],
            f"{f['records']:,}",
            f"{f['records_written']:,}",
            f"{f['rejected']:,}",
            str(f["attempts"]),
        )
    console.print(table)
    for f in report["files"]:
        if f["error"]:
            console.print(f"  [red]{f['key']}[/]: {f['error']}")


def main() -> int:
    root = Path(os.environ.get("S3BATCH_STACK_DIR", ".stack")).resolve()
    console.rule("[bold]1. Local stack")
    config = stack_up(root)
    os.environ.update(config.env())  # the workers, the s3batch command and boto3 all read these
    s3 = s3_client(config)
    ensure_buckets(s3, SOURCE_BUCKET, OUTPUT_BUCKET)

    console.rule("[bold]2. Sample data")
    started = time.monotonic()
    samples = upload_samples(s3, SOURCE_BUCKET, SOURCE_PREFIX, rows=CSV_ROWS)
    for sample in samples:
        size = s3.head_object(Bucket=SOURCE_BUCKET, Key=sample.key)["ContentLength"]
        malformed = f", {sample.parse_rejects} malformed" if sample.parse_rejects else ""
        console.print(f"  {size / 1e6:5.1f} MB  {sample.records:>7,} records{malformed}  s3://{SOURCE_BUCKET}/{sample.key}")
    console.print(f"  uploaded in {time.monotonic() - started:.1f}s")

    console.rule(f"[bold]3. {WORKERS} workers and one job")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    job_id = f"demo-{stamp}"
    output_prefix = f"demo-runs/{stamp}/"
    workers = start_workers(root, WORKERS)
    console.print(f"  workers: pids {', '.join(str(w.pid) for w in workers)} (logs in {root}/demo-worker-N.log)")
    try:
        code = subprocess.call(
            [
                str(BIN / "s3batch"), "start",
                "--bucket", SOURCE_BUCKET, "--prefix", SOURCE_PREFIX,
                "--output-bucket", OUTPUT_BUCKET, "--output-prefix", output_prefix,
                "--id", job_id, "--wait",
            ]
        )  # fmt: skip
    finally:
        console.print("  stopping the workers (SIGTERM)")
        stop_workers(workers)

    console.rule("[bold]4. Report")
    with contextlib.suppress(s3.exceptions.NoSuchKey):
        body = s3.get_object(Bucket=OUTPUT_BUCKET, Key=f"{output_prefix}_report.json")["Body"].read()
        print_report(json.loads(body))
    console.print(f"  report   s3://{OUTPUT_BUCKET}/{output_prefix}_report.json")
    console.print(f"  outputs  s3://{OUTPUT_BUCKET}/{output_prefix}<source key>/part-NNNNN.jsonl")
    console.print(f"  Web UI   {config.ui_url}/namespaces/default/workflows/{job_id}")
    console.print(f"  status   .venv/bin/s3batch status {job_id}   (with `eval $(.venv/bin/s3batch-stack env)`)")
    console.print("The stack keeps running for the Web UI; [bold]make stack-down[/] stops it.")
    return code


if __name__ == "__main__":
    sys.exit(main())

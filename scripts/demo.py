"""``make demo``: one job, end to end, on the local stack.

1. Starts the local stack (or reuses the one recorded in ``.stack/stack.json``), exactly as
   ``s3batch-stack up`` does; ports come from ``S3BATCH_TEMPORAL_PORT``, ``S3BATCH_UI_PORT``,
   ``S3BATCH_S3_PORT`` and ``S3BATCH_WEED_BASE_PORT``.
2. Creates the buckets ``incoming`` and ``processed`` and uploads generated sample data under
   ``incoming/demo/``: a 200,000-row customer CSV, a JSONL of events, a gzipped JSONL and a CSV
   with malformed rows.
3. Starts two workers in the background (``s3batch-stack up --workers 2``; none when two already
   run), runs ``s3batch start ... --wait`` with its progress bar and prints the report.
4. Leaves the stack and the workers running, so that the commands it prints next (and jobs started
   from another shell) run at once; ``make stack-down`` stops the workers, then the stack.
   ``--stop-workers`` stops the workers at the end instead (SIGTERM, as a deploy does).
"""

from __future__ import annotations

import argparse
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

from s3batch.dev import stack_cli as devstack
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


def start_workers(config: StackConfig, count: int) -> list[int]:
    """Make sure ``count`` background workers of the stack run (``s3batch-stack up --workers``): their pids."""
    state = config.root / "stack.json"
    running = [pid for pid in json.loads(state.read_text()).get("workers", {}).values() if devstack.pid_alive(pid)]
    if len(running) < count:
        devstack.start_workers(config, state, count - len(running))
    return [pid for pid in json.loads(state.read_text())["workers"].values() if devstack.pid_alive(pid)]


def stop_workers(config: StackConfig, pids: list[int], timeout: float = 45) -> None:
    """SIGTERM, the way a deploy stops a worker; SIGKILL only if one overstays ``timeout``."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for pid in pids:
        while devstack.pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if devstack.pid_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
    state = config.root / "stack.json"
    saved = json.loads(state.read_text())
    saved["workers"] = {name: pid for name, pid in saved.get("workers", {}).items() if pid not in pids}
    state.write_text(json.dumps(saved))


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


def next_steps(config: StackConfig, job_id: str, workers_left: bool) -> None:
    """Commands to run next, exactly as they run from this folder."""
    env = f'eval "$({os.path.relpath(BIN)}/s3batch-stack env)"'
    running = f"the stack and {WORKERS} workers keep running" if workers_left else "the stack keeps running"
    console.print(f"Next ({running}; [bold]make stack-down[/] stops {'them' if workers_left else 'it'}):")
    console.print(f"  {env:<44} # once per shell: s3batch, temporal and boto3 use the local stack", markup=False)
    console.print(f"  s3batch status {job_id}", markup=False)
    console.print(f"  s3batch report {job_id}", markup=False)
    console.print(
        f"  s3batch start --bucket {SOURCE_BUCKET} --prefix {SOURCE_PREFIX} --output-bucket {OUTPUT_BUCKET} "
        "--output-prefix runs/1/ --wait",
        markup=False,
    )
    if not workers_left:
        console.print("  make worker                                  # a worker for those jobs", markup=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="demo.py", description="make demo: one job, end to end, on the local stack")
    parser.add_argument("--stop-workers", action="store_true", help="stop the workers at the end (default: keep them)")
    args = parser.parse_args(argv)
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
    pids = start_workers(config, WORKERS)
    console.print(f"  workers: pids {', '.join(map(str, pids))} (logs in {root}/worker-N.log)")
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
        if args.stop_workers:
            console.print("  stopping the workers (SIGTERM)")
            stop_workers(config, pids)

    console.rule("[bold]4. Report")
    with contextlib.suppress(s3.exceptions.NoSuchKey):
        body = s3.get_object(Bucket=OUTPUT_BUCKET, Key=f"{output_prefix}_report.json")["Body"].read()
        print_report(json.loads(body))
    console.print(f"  report   s3://{OUTPUT_BUCKET}/{output_prefix}_report.json")
    console.print(f"  outputs  s3://{OUTPUT_BUCKET}/{output_prefix}<source key>/part-NNNNN.jsonl")
    console.print(f"  Web UI   {config.ui_url}/namespaces/default/workflows/{job_id}")
    next_steps(config, job_id, workers_left=not args.stop_workers)
    return code


if __name__ == "__main__":
    sys.exit(main())

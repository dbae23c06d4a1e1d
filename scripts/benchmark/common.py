"""What every case of the benchmark shares: sizes, the log, CPU accounting, running a job and
reading its history and output, the table rows."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from temporalio.client import Client

from s3batch.dev.workers import WorkerProcess

ROOT = Path(__file__).resolve().parents[2]
"""The checkout: workers run from it (so ``tests.slow_handlers`` loads by name)."""
BENCH_SCRIPT = ROOT / "scripts" / "bench.py"
"""The benchmark's entry point, which also runs the naive design's worker (``--naive-worker``)."""

SRC = "bench-src"
OUT = "bench-out"
MB = 1_000_000
JOB_TIMEOUT = 900
"""Seconds a single job may take before the case is reported as an error (a hung job must not hang
the benchmark: a worker that cannot run the workflow retries its task forever)."""
_T0 = time.monotonic()


def log(message: str) -> None:
    print(f"[bench {time.monotonic() - _T0:7.1f}s] {message}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------ sizes


@dataclass
class Sizes:
    """Everything that differs between the full run and ``--quick``."""

    big_rows: int = 1_000_000
    """Rows of the big CSV of cases 1, 2 and 6 (~85 MB)."""
    chunk_records: int = 10_000
    """s3batch's chunk_records, and the plain script's rows per PUT."""
    reps: int = 2
    """Repetitions of each timed side of cases 1, 2 and 4 (alternating order); medians reported."""
    small_files: int = 10_000
    small_rows: int = 11
    """Rows per small file (~1 KB)."""
    small_concurrency: int = 16
    multi_files: int = 4
    multi_rows: int = 250_000
    multi_slots: int = 2
    """Activity slots per worker in case 4: with 4 files, two workers must split them 2 + 2."""
    memory_mb: tuple[int, ...] = (100, 1000)
    crash_rows: int = 1_000_000
    crash_chunk: int = 10_000
    crash_handler: str = "passthrough"
    crash_delay: float = 0.0
    """Seconds of sleep per 1,000 records (quick mode only: makes a tiny file slow enough to kill)."""
    heartbeat_timeout: int = 5
    kill_fraction: float = 0.3
    history_files: int = 20_000
    resp_rows: int = 120_000
    resp_chunk: int = 1_000
    resp_delay: float = 0.5
    """Case 8: seconds of handler time per chunk (``slow_passthrough``): 120 chunks, ~60 s in flight,
    long enough for a cancel to land even at the baseline's 24 s throttle."""
    resp_window: float = 15.0
    """Case 8: seconds of progress sampling (every 0.2 s) before the cancel."""
    resp_cancels: int = 5
    """Case 8: cancels measured with the worker's own throttle (the baseline: one)."""
    resp_baseline: bool = True
    """Case 8: also measure the worker with the SDK's default throttle (24 s)."""
    scale_rows: tuple[int, ...] = (10_000, 100_000, 1_000_000)
    """Case 13: rows of the one file of each size step."""
    scale_files: tuple[int, ...] = (100, 1_000, 5_000)
    """Case 13: how many ~1 KB files in each count step."""
    latency_files: int = 2_000
    """Case 15: ~1 KB files read and written through the latency proxy."""
    latency_s: float = 0.020
    """Case 15: seconds the proxy holds each S3 request (real S3 answers a small GET in 10-30 ms)."""


QUICK = Sizes(
    big_rows=20_000,
    chunk_records=2_000,
    reps=1,
    small_files=60,
    small_concurrency=8,
    multi_files=2,
    multi_rows=10_000,
    multi_slots=1,
    memory_mb=(2, 6),
    crash_rows=30_000,
    crash_chunk=1_000,
    crash_handler="slow_passthrough",
    crash_delay=0.3,
    heartbeat_timeout=2,
    history_files=120,
    scale_rows=(1_000, 5_000),
    scale_files=(10, 30),
    resp_rows=30_000,
    resp_delay=0.2,
    resp_window=4.0,
    resp_cancels=2,
    resp_baseline=False,
    latency_files=40,
)


def peak_rss_mb(w: WorkerProcess) -> float | None:
    """VmHWM (peak resident set) of a live worker, in MB."""
    kib = w.peak_rss_kib()
    return kib * 1024 / MB if kib is not None else None


_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_snapshot() -> tuple[float, float]:
    """(CPU seconds used by the whole machine, CPU seconds used by this benchmark's process tree)."""
    busy = machine_cpu() * _TICK
    stats: dict[int, tuple[int, int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                raw = f.read()
        except OSError:
            continue
        rest = raw.rsplit(")", 1)[1].split()
        ppid = int(rest[1])
        ticks = int(rest[11]) + int(rest[12]) + int(rest[13]) + int(rest[14])  # utime stime cutime cstime
        stats[int(entry)] = (ppid, ticks)
    ours = {os.getpid()}
    changed = True
    while changed:
        changed = False
        for pid, (ppid, _) in stats.items():
            if ppid in ours and pid not in ours:
                ours.add(pid)
                changed = True
    mine = sum(stats[p][1] for p in ours if p in stats)
    return busy / _TICK, mine / _TICK


def machine_cpu() -> float:
    """CPU seconds the whole machine has been busy (every core; idle and iowait not counted)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / _TICK


def add_busy_row(b: Bench, case: str, one: float, two: float) -> None:
    """The info row of a case of more cores or workers: the cores the whole machine kept busy on each side, and
    the most the side with more can gain when the baseline side already kept ``one`` of them busy."""
    cores = len(os.sched_getaffinity(0))
    b.add(case, f"cores busy on the whole machine during the job, of {cores}; the speedup that leaves at most",
          f"{two:.2f}", f"{one:.2f}", f"{cores / one:.2f}x" if one else "", "", "info")


def add_cpu_row(b: Bench, case: str, plain_seconds: float, cpu_seconds: float) -> None:
    """The info row of a case against the plain script: the best ratio the CPU that s3batch's side used (its
    worker and the S3 server, which share the machine's cores) allows: plain seconds / (CPU / cores)."""
    cores = os.cpu_count() or 1
    floor = cpu_seconds / cores
    b.add(case, f"the best ratio that CPU allows on {cores} shared cores: plain s / (CPU / cores)",
          f"{floor:.2f} s", f"{plain_seconds:.2f} s", f"{plain_seconds / floor:.2f}x" if floor else "", "", "info")


class CaseClock:
    """Wall time, load average and CPU used by other processes (other engineers' tests) during a case."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.load0 = os.getloadavg()[0]
        self.cpu0 = _cpu_snapshot()

    def summary(self) -> dict[str, Any]:
        wall = time.monotonic() - self.t0
        busy1, mine1 = _cpu_snapshot()
        busy = busy1 - self.cpu0[0]
        mine = mine1 - self.cpu0[1]
        return {
            "wall_s": round(wall, 1),
            "loadavg_1m_start": round(self.load0, 2),
            "loadavg_1m_end": round(os.getloadavg()[0], 2),
            "cores_busy_bench": round(mine / wall, 2) if wall else None,
            "cores_busy_others": round(max(0.0, busy - mine) / wall, 2) if wall else None,
        }


# ------------------------------------------------------------------------------- temporal helpers


def has_grouping() -> bool:
    from s3batch.models import S3BatchInput

    return "group_max_files" in S3BatchInput.model_fields


async def run_job(client: Client, task_queue: str, *, prefix: str, out_prefix: str, **options: Any) -> dict[str, Any]:
    """Start an S3BatchWorkflow and wait for its result; wall time is start -> result."""
    from s3batch.workflows.batch import S3BatchWorkflow

    from s3batch.models import S3BatchInput

    job = S3BatchInput(bucket=SRC, prefix=prefix, output_bucket=OUT, output_prefix=out_prefix, **options)
    wid = f"bench-{uuid.uuid4().hex[:10]}"
    t0 = time.perf_counter()
    handle = await client.start_workflow(S3BatchWorkflow.run, job, id=wid, task_queue=task_queue)
    try:
        result = await asyncio.wait_for(handle.result(), JOB_TIMEOUT)
    except TimeoutError:
        with contextlib.suppress(Exception):
            await handle.terminate("benchmark timeout")
        raise TimeoutError(f"job {wid} did not finish in {JOB_TIMEOUT}s (see the worker logs)") from None
    seconds = time.perf_counter() - t0
    return {
        "workflow_id": wid,
        "first_run_id": handle.first_execution_run_id or handle.result_run_id,
        "seconds": seconds,
        "totals": result.totals.model_dump(),
        "status": result.status,
        "report_key": result.report_key,
    }


FILE_ACTIVITIES = {"s3batch.process_file", "s3batch.process_group"}
"""Activities that process files: one big file, or a group of small ones."""


async def history_chain(client: Client, wid: str, first_run_id: str | None) -> list[dict[str, Any]]:
    """Every run of a continue-as-new chain: events, bytes, file activities (process_file or
    process_group) and the longest of them in seconds."""
    runs = []
    run_id = first_run_id
    while run_id:
        history = await client.get_workflow_handle(wid, run_id=run_id).fetch_history()
        events = history.events
        size = sum(e.ByteSize() for e in events)
        starts: dict[int, float] = {}
        types: dict[int, str] = {}
        activity_seconds = 0.0
        activities = 0
        for e in events:
            t = e.event_time.ToMicroseconds() / 1e6
            if e.HasField("activity_task_scheduled_event_attributes"):
                types[e.event_id] = e.activity_task_scheduled_event_attributes.activity_type.name
            elif e.HasField("activity_task_started_event_attributes"):
                starts[e.event_id] = t
            elif e.HasField("activity_task_completed_event_attributes"):
                a = e.activity_task_completed_event_attributes
                if types.get(a.scheduled_event_id) in FILE_ACTIVITIES:
                    activities += 1
                    activity_seconds = max(activity_seconds, t - starts.get(a.started_event_id, t))
        runs.append({"run_id": run_id, "events": len(events), "bytes": size, "file_activities": activities,
                     "longest_file_activity_s": round(activity_seconds, 3)})
        last = events[-1]
        run_id = (last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
                  if last.HasField("workflow_execution_continued_as_new_event_attributes") else None)
    return runs


def committed_records(s3: Any, file_prefix: str) -> tuple[int, int]:
    """(contiguous committed parts, next_record of the last one) of one s3batch output file."""
    from s3batch.checkpoint import CHECKPOINT_METADATA, Checkpoint

    parts = records = 0
    while True:
        try:
            head = s3.head_object(Bucket=OUT, Key=f"{file_prefix}part-{parts:05d}.jsonl")
        except s3.exceptions.ClientError:
            return parts, records
        raw = head.get("Metadata", {}).get(CHECKPOINT_METADATA)
        records = Checkpoint.model_validate_json(raw).next_record if raw else records
        parts += 1


def part_exists(s3: Any, key: str) -> bool:
    try:
        s3.head_object(Bucket=OUT, Key=key)
        return True
    except s3.exceptions.ClientError:
        return False


def count_parts(s3: Any, file_prefix: str) -> int:
    n = 0
    while part_exists(s3, f"{file_prefix}part-{n:05d}.jsonl"):
        n += 1
    return n


# --------------------------------------------------------------------------------------- results


@dataclass
class Row:
    case: str
    metric: str
    s3batch: str
    baseline: str = ""
    ratio: str = ""
    target: str = ""
    verdict: str = ""


@dataclass
class Bench:
    args: argparse.Namespace
    sizes: Sizes
    run_dir: Path
    s3: Any
    client: Client
    main_queue: str
    rows: list[Row] = field(default_factory=list)
    results: dict[str, Any] = field(default_factory=dict)
    workers: list[WorkerProcess] = field(default_factory=list)

    def worker(self, name: str, task_queue: str, slots: int, *, naive: bool = False,
               env: dict[str, str] | None = None) -> WorkerProcess:
        """A worker process (s3batch's, or this script's naive design) with ``slots`` activity slots,
        run from the checkout (so ``tests.slow_handlers`` can be loaded by name)."""
        w = WorkerProcess(task_queue, self.run_dir, name, cwd=ROOT,
                          script=BENCH_SCRIPT if naive else None,
                          args=("--naive-worker", task_queue) if naive else (),
                          env={"S3BATCH_MAX_CONCURRENT_FILES": str(slots), **(env or {})})
        w.ready_timeout = 60
        self.workers.append(w)
        return w

    def add(self, *args: str) -> None:
        self.rows.append(Row(*args))


def fmt_rate(x: float) -> str:
    return f"{x / 1000:,.1f}k" if x >= 1000 else f"{x:,.1f}"


def verdict(ok: bool | None, *, stretch: bool | None = None) -> str:
    if ok is None:
        return "n/a"
    if not ok:
        return "MISSED"
    return "met (stretch met)" if stretch else "met"


def median(values: list[float]) -> float:
    return statistics.median(values)


async def wait_until(predicate: Callable[[], Any], timeout: float, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = await asyncio.to_thread(predicate)
        if value:
            return value
        await asyncio.sleep(interval)
    raise TimeoutError("condition not reached in time")


async def attempt_started(handle: Any, attempt: int) -> bool:
    desc = await handle.describe()
    return any(p.attempt >= attempt and p.state == 2 for p in desc.raw_description.pending_activities)

"""Cases 11 and 12: one big file in two byte-range splits (``split_bytes``, ``s3batch.activities.splits``).

- 11: one worker of two processes (``S3BATCH_WORKER_PROCESSES=2``), allowed two cores vs one (every
  thread of the supervisor and of its worker processes pinned to CPU 0 with ``sched_setaffinity``).
- 12: two workers vs one, each worker one process with one slot (so each split runs on its own worker;
  the one worker runs the two splits one after the other).

The same job on both sides of a case, its sides alternated between repetitions, medians compared.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path

from s3batch.dev.workers import WorkerProcess
from scripts.benchmark.common import (
    SRC,
    Bench,
    CaseClock,
    add_busy_row,
    fmt_rate,
    log,
    machine_cpu,
    median,
    run_job,
    verdict,
)

BIG_KEY = "big/customers.csv"
"""The big CSV of cases 1, 2 and 6 (``scripts.benchmark.data``)."""


def pin(pid: int, cpus: set[int]) -> int:
    """Pin every thread of process ``pid`` and of its child processes to ``cpus`` (threads started later
    inherit it); returns the threads pinned."""
    pinned = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        os.sched_setaffinity(int(task.name), cpus)
        pinned += 1
        children = (task / "children").read_text().split()
        pinned += sum(pin(int(child), cpus) for child in children)
    return pinned


def _split_bytes(b: Bench) -> int:
    """``split_bytes`` that cuts the big file in two."""
    size = b.s3.head_object(Bucket=SRC, Key=BIG_KEY)["ContentLength"]
    return max(size // 2 + 1, 64 * 1024)


async def _timed(
    b: Bench, case: str, sides: dict[str, Callable[[str, str], list[WorkerProcess]]]
) -> tuple[dict[str, float], dict[str, float]]:
    """Median seconds of the big-file job on each side (workers started by ``sides[side](name, queue)``), and
    the median cores the whole machine kept busy during it (workers, S3 and Temporal servers, anything else)."""
    z = b.sizes
    split = _split_bytes(b)
    seconds: dict[str, list[float]] = {side: [] for side in sides}
    busy: dict[str, list[float]] = {side: [] for side in sides}
    for rep in range(z.reps):
        order = list(sides) if rep % 2 == 0 else list(reversed(sides))
        for side in order:
            queue = f"bench-{case}-{side}-{uuid.uuid4().hex[:6]}"
            workers = sides[side](f"{case}-{side}-r{rep}", queue)
            cpu0 = machine_cpu()
            r = await run_job(b.client, queue, prefix="big/", out_prefix=f"{case}/r{rep}/{side}/",
                              chunk_records=z.chunk_records, max_concurrent_files=2, split_bytes=split)
            busy[side].append((machine_cpu() - cpu0) / r["seconds"])
            for w in workers:
                w.stop()
            assert r["totals"]["records_written"] == z.big_rows, r["totals"]
            seconds[side].append(r["seconds"])
            log(f"case {case} rep {rep}: {side} {r['seconds']:.2f}s ({z.big_rows / r['seconds']:,.0f} rows/s)")
    return {side: median(v) for side, v in seconds.items()}, {side: median(v) for side, v in busy.items()}


async def case_cores(b: Bench) -> None:
    """Cases 11 (one worker, 2 cores vs 1) and 12 (2 workers vs 1), both on the big file in two splits."""
    z = b.sizes
    if len(os.sched_getaffinity(0)) < 2:
        b.add("11. one big file, 2 cores vs 1", "rows/s", "n/a", "n/a", "", ">= 1.7x", "n/a")
        b.add("12. one big file, 2 workers vs 1", "rows/s", "n/a", "n/a", "", ">= 1.7x", "n/a")
        return
    clock = CaseClock()

    def processes(cores: set[int] | None) -> Callable[[str, str], list[WorkerProcess]]:
        def start(name: str, queue: str) -> list[WorkerProcess]:
            w = b.worker(name, queue, 2, env={"S3BATCH_WORKER_PROCESSES": "2"}).wait_ready()
            if cores is not None:
                pin(w.proc.pid, cores)
            return [w]

        return start

    cores, busy = await _timed(b, "11", {"one": processes({0}), "two": processes(None)})
    s1, s2 = cores["one"], cores["two"]
    b.results["11_cores"] = {"rows": z.big_rows, "one_core_seconds": s1, "two_cores_seconds": s2,
                             "speedup": s1 / s2, "machine_cores_busy": busy, "load": clock.summary()}
    b.add("11. one big file, 2 cores vs 1", "rows/s, one worker of 2 processes, 2 splits",
          fmt_rate(z.big_rows / s2) + " (2 cores)", fmt_rate(z.big_rows / s1) + " (1 core)", f"{s1 / s2:.2f}x",
          ">= 1.7x", verdict(s1 / s2 >= 1.7))
    add_busy_row(b, "11. one big file, 2 cores vs 1", busy["one"], busy["two"])

    def workers(n: int) -> Callable[[str, str], list[WorkerProcess]]:
        def start(name: str, queue: str) -> list[WorkerProcess]:
            started = [b.worker(f"{name}-{i}", queue, 1, env={"S3BATCH_WORKER_PROCESSES": "1"}) for i in range(n)]
            return [w.wait_ready() for w in started]

        return start

    clock = CaseClock()
    many, busy = await _timed(b, "12", {"one": workers(1), "two": workers(2)})
    w1, w2 = many["one"], many["two"]
    b.results["12_workers"] = {"rows": z.big_rows, "one_worker_seconds": w1, "two_workers_seconds": w2,
                               "speedup": w1 / w2, "machine_cores_busy": busy, "load": clock.summary()}
    b.add("12. one big file, 2 workers vs 1", "rows/s, 2 splits, workers of one process and slot",
          fmt_rate(z.big_rows / w2) + " (2 workers)", fmt_rate(z.big_rows / w1) + " (1 worker)", f"{w1 / w2:.2f}x",
          ">= 1.7x", verdict(w1 / w2 >= 1.7))
    add_busy_row(b, "12. one big file, 2 workers vs 1", busy["one"], busy["two"])

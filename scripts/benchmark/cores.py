"""Case 11: one big file, one worker process allowed two cores vs one (every thread of the process pinned
to CPU 0 with ``sched_setaffinity``). Splits of one file across processes or workers are not built
yet; what a second core gives one file today comes from the threads beside the chunk loop: the
source read ahead (``s3batch.formats.readahead``), the parts written one chunk behind
(``activities/write_behind.py``) and pyarrow's kernels, which release the GIL.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from scripts.benchmark.common import Bench, CaseClock, fmt_rate, log, median, run_job, verdict


def pin(pid: int, cpus: set[int]) -> int:
    """Pin every thread of process ``pid`` to ``cpus`` (threads it starts later inherit it); returns the
    threads pinned."""
    tasks = list(Path(f"/proc/{pid}/task").iterdir())
    for task in tasks:
        os.sched_setaffinity(int(task.name), cpus)
    return len(tasks)


async def case_cores(b: Bench) -> None:
    z = b.sizes
    clock = CaseClock()
    if len(os.sched_getaffinity(0)) < 2:
        b.add("11. one big file, 2 cores vs 1", "rows/s", "n/a", "n/a", "", ">= 1.7x", "n/a")
        return
    seconds: dict[str, list[float]] = {"one": [], "two": []}
    for rep in range(z.reps):
        for side in ("one", "two") if rep % 2 == 0 else ("two", "one"):
            queue = f"bench-11-{side}-{uuid.uuid4().hex[:6]}"
            w = b.worker(f"11-{side}-r{rep}", queue, 1).wait_ready()
            if side == "one":
                pin(w.proc.pid, {0})
            r = await run_job(b.client, queue, prefix="big/", out_prefix=f"11/r{rep}/{side}/",
                              chunk_records=z.chunk_records, max_concurrent_files=1)
            w.stop()
            assert r["totals"]["records_written"] == z.big_rows, r["totals"]
            seconds[side].append(r["seconds"])
            log(f"case 11 rep {rep}: {side} core(s) {r['seconds']:.2f}s ({z.big_rows / r['seconds']:,.0f} rows/s)")
    s1, s2 = median(seconds["one"]), median(seconds["two"])
    b.results["11_cores"] = {"rows": z.big_rows, "one_core_seconds": seconds["one"],
                             "two_cores_seconds": seconds["two"], "speedup": s1 / s2, "load": clock.summary()}
    b.add("11. one big file, 2 cores vs 1", "rows/s, one worker process (no splits yet)",
          fmt_rate(z.big_rows / s2) + " (2 cores)", fmt_rate(z.big_rows / s1) + " (1 core)", f"{s1 / s2:.2f}x",
          ">= 1.7x", verdict(s1 / s2 >= 1.7))

"""Case 13: how the cost grows, with file size (one file of 10,000 to 1,000,000 rows) and with the number
of files (100 to 5,000 files of ~1 KB), s3batch against the plain script or loop of cases 1 and 3, each
pair in the same run. Every s3batch figure includes the job's Temporal overhead (check, listing, workflow
tasks, report), so the small end shows the fixed cost of a job and the large end the rate. The table in
docs/explanation/performance.md ("How the cost grows") comes from this case.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

from scripts.benchmark.baselines import plain_script, plain_small_loop
from scripts.benchmark.common import Bench, CaseClock, fmt_rate, log, run_job, verdict
from scripts.benchmark.data import ensure_small_files, put_csv
from scripts.benchmark.floor import floor_seconds, job_phases

ONE_FILE_PAIRS = 5
"""The smallest file's plain script and job, in turn, this many times: its ratio (issue 31's target) is of
medians (one job takes 0.1-0.2 s, and one of them can be twice another)."""


async def case_scaling(b: Bench) -> None:
    """Case 13: rows/s by file size, files/s by number of files."""
    z = b.sizes
    clock = CaseClock()
    by_size = []
    for rows in z.scale_rows:
        key = f"scale/rows-{rows}/customers.csv"
        size = put_csv(b.s3, key, rows)
        one_file = rows == z.scale_rows[0]
        plains, jobs = [], []
        for n in range(ONE_FILE_PAIRS if one_file else 1):  # the target's file: the median of pairs in turn
            t0 = time.perf_counter()
            count = await asyncio.to_thread(plain_script, b.s3, key, f"13/plain/{rows}/{n}/", z.chunk_records)
            plains.append(time.perf_counter() - t0)
            assert count == rows, (count, rows)
            r = await run_job(b.client, b.main_queue, prefix=f"scale/rows-{rows}/",
                              out_prefix=f"13/s3batch/{rows}/{n}/", chunk_records=z.chunk_records,
                              max_concurrent_files=1)
            assert r["totals"]["records_written"] == rows, r["totals"]
            jobs.append(r)
        plain, seconds = statistics.median(plains), statistics.median(j["seconds"] for j in jobs)
        entry = {"rows": rows, "bytes": size, "plain_seconds": plain, "s3batch_seconds": seconds}
        by_size.append(entry)
        log(f"case 13: {rows:,} rows: plain {plain:.3f}s, s3batch {seconds:.3f}s (median of {len(jobs)})")
        name = f"13. cost vs file size: {rows:,} rows ({size / 1e6:.1f} MB)"
        ratio = plain / seconds
        if one_file:  # issue 31's target, and what a workflow of Temporal allows for it here
            b.add(name, f"rows/s, one file (median of {len(jobs)} jobs, each after the plain script)",
                  fmt_rate(rows / seconds), fmt_rate(rows / plain), f"{ratio:.2f}x", ">= 1x", verdict(ratio >= 1))
            await _add_floor_rows(b, name, entry, jobs[-1]["workflow_id"])
        else:
            b.add(name, "rows/s, one file", fmt_rate(rows / seconds), fmt_rate(rows / plain), f"{ratio:.2f}x", "",
                  "info")
    by_count = []
    for count in z.scale_files:
        group = f"scale-{count}"
        ensure_small_files(b.s3, group, count, z.small_rows)
        t0 = time.perf_counter()
        files, _, _ = await asyncio.to_thread(plain_small_loop, b.s3, f"small/{group}/", f"13/plain/{group}/")
        plain = time.perf_counter() - t0
        r = await run_job(b.client, b.main_queue, prefix=f"small/{group}/", out_prefix=f"13/s3batch/{group}/",
                          chunk_records=z.chunk_records, max_concurrent_files=z.small_concurrency)
        assert r["totals"]["files_succeeded"] == files == count, (r["totals"], files, count)
        by_count.append({"files": count, "plain_seconds": plain, "s3batch_seconds": r["seconds"]})
        log(f"case 13: {count:,} files: plain {plain:.2f}s, s3batch {r['seconds']:.2f}s")
        b.add(f"13. cost vs number of files: {count:,} x ~1 KB", "files/s",
              fmt_rate(count / r["seconds"]), fmt_rate(count / plain), f"{plain / r['seconds']:.2f}x", "", "info")
    b.results["13_scaling"] = {"by_size": by_size, "by_count": by_count, "load": clock.summary()}


async def _add_floor_rows(b: Bench, name: str, entry: dict[str, Any], workflow_id: str) -> None:
    """Where the one-file job's time went, the floor of a workflow of one activity, and the best ratio that floor
    allows with s3batch's file activity as it is: plain / (floor + the file activity)."""
    phases = await job_phases(b.client, workflow_id)
    floor = await floor_seconds(b.client, f"{b.main_queue}-floor")
    acts = phases["activities"]
    work = acts.get("s3batch.process_file", 0.0)
    entry.update(phases=phases, floor_seconds=floor)
    ms = {k: f"{v * 1000:.0f}" for k, v in (("check", phases["first_task"]), ("file", work), ("tasks", phases["tasks"]),
                                            ("report", acts.get("s3batch.write_report", 0.0)),
                                            ("dispatch", phases["dispatch"]), ("job", phases["history"]))}
    b.add(name, "the job's history, ms: first workflow task (check, listing) + file activity + report activity + "
          "later workflow tasks + their dispatch, of the whole history",
          f"{ms['check']} + {ms['file']} + {ms['report']} + {ms['tasks']} + {ms['dispatch']} of {ms['job']}",
          "", "", "", "info")
    b.add(name, "the best ratio a workflow allows here: plain s / (a workflow of one no-op activity + the file "
          "activity)", f"{floor:.3f} + {work:.3f} s", f"{entry['plain_seconds']:.3f} s",
          f"{entry['plain_seconds'] / (floor + work):.2f}x" if floor + work else "", "", "info")

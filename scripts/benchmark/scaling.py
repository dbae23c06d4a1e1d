"""Case 13: how the cost grows, with file size (one file of 10,000 to 1,000,000 rows) and with the number
of files (100 to 5,000 files of ~1 KB), s3batch against the plain script or loop of cases 1 and 3, each
pair in the same run. Every s3batch figure includes the job's Temporal overhead (check, listing, workflow
tasks, report), so the small end shows the fixed cost of a job and the large end the rate. The table in
docs/explanation/performance.md ("How the cost grows") comes from this case.
"""

from __future__ import annotations

import asyncio
import time

from scripts.benchmark.baselines import plain_script, plain_small_loop
from scripts.benchmark.common import Bench, CaseClock, fmt_rate, log, run_job
from scripts.benchmark.data import ensure_small_files, put_csv


async def case_scaling(b: Bench) -> None:
    """Case 13: rows/s by file size, files/s by number of files."""
    z = b.sizes
    clock = CaseClock()
    by_size = []
    for rows in z.scale_rows:
        key = f"scale/rows-{rows}/customers.csv"
        size = put_csv(b.s3, key, rows)
        t0 = time.perf_counter()
        n = await asyncio.to_thread(plain_script, b.s3, key, f"13/plain/{rows}/", z.chunk_records)
        plain = time.perf_counter() - t0
        assert n == rows, (n, rows)
        r = await run_job(b.client, b.main_queue, prefix=f"scale/rows-{rows}/", out_prefix=f"13/s3batch/{rows}/",
                          chunk_records=z.chunk_records, max_concurrent_files=1)
        assert r["totals"]["records_written"] == rows, r["totals"]
        by_size.append({"rows": rows, "bytes": size, "plain_seconds": plain, "s3batch_seconds": r["seconds"]})
        log(f"case 13: {rows:,} rows: plain {plain:.2f}s, s3batch {r['seconds']:.2f}s")
        b.add(f"13. cost vs file size: {rows:,} rows ({size / 1e6:.1f} MB)", "rows/s, one file",
              fmt_rate(rows / r["seconds"]), fmt_rate(rows / plain), f"{plain / r['seconds']:.2f}x", "", "info")
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

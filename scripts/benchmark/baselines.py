"""What s3batch is compared with: the plain script a user would write, and a naive Temporal design
(one activity per file, no checkpoint: case 6), whose worker ``bench.py --naive-worker QUEUE`` runs."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import orjson
from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.common import RetryPolicy

from scripts.benchmark.common import OUT, SRC


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
            rows += small_file(s3, item["Key"], out_prefix)
            files += 1
            size += item["Size"]
    return files, rows, size


def small_file(s3: Any, key: str, out_prefix: str) -> int:
    """One file of the plain loop: GET, csv.reader, json.dumps per row, PUT. Returns its rows."""
    text = s3.get_object(Bucket=SRC, Key=key)["Body"].read().decode()
    reader = csv.reader(io.StringIO(text, newline=""))
    header = next(reader)
    lines = [json.dumps(dict(zip(header, row, strict=True))) for row in reader]
    s3.put_object(Bucket=OUT, Key=f"{out_prefix}{key}.jsonl", Body=("\n".join(lines) + "\n").encode())
    return len(lines)


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

"""Measure an incremental job's ledger end to end (issue 16): RUNS runs of one job, one after the other,
over a prefix of 10,000 small objects with a few added and overwritten between runs, on a local stack
of its own (Temporal dev server + SeaweedFS, in a temporary folder) and an in-process worker.

    .venv/bin/python scripts/measure_ledger.py [--runs 50] [--objects 10000] [--window 30]

Prints, after the first run and every 10 runs, the size of ``ledger.json`` and its entries, and the time per run; at the
end, whether every object version was processed exactly once (the ``succeeded`` entries of the runs'
reports, as ``(key, ETag)``, against the versions uploaded). Exits 1 when one was missed or doubled.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from s3batch.workflows.batch import S3BatchWorkflow
from temporalio.client import Client
from temporalio.worker import Worker

from s3batch.dev.stack import Stack, StackConfig, ensure_buckets, s3_client
from s3batch.incremental import run_output_prefix
from s3batch.models import S3BatchInput
from s3batch.plugin import S3BatchPlugin
from s3batch.s3io import make_client

SRC, OUT, TQ = "measure-src", "measure-out", "measure-ledger"
ADDED, OVERWRITTEN = 5, 5  # objects between two runs


def put(s3: Any, versions: dict[tuple[str, str], int], key: str, body: bytes) -> None:
    etag = s3.put_object(Bucket=SRC, Key=key, Body=body)["ETag"].strip('"')
    versions[(key, etag)] = 0


def processed(s3: Any, job_id: str) -> list[tuple[str, str]]:
    """``(key, etag)`` of the files the run's report says succeeded."""
    key = f"{run_output_prefix('m/', job_id)}_report.json"
    report = json.loads(s3.get_object(Bucket=OUT, Key=key)["Body"].read())
    return [(f["key"], f["etag"]) for f in report["files"] if f["status"] == "succeeded"]


async def measure(stack: Stack, runs: int, objects: int, window: int) -> int:
    s3 = s3_client(stack.config)
    ensure_buckets(s3, SRC, OUT)
    versions: dict[tuple[str, str], int] = {}
    started = time.monotonic()
    with ThreadPoolExecutor(32) as pool:
        list(pool.map(lambda i: put(s3, versions, f"in/{i:05d}.jsonl", b'{"n": %d}\n' % i), range(objects)))
    print(f"uploaded {objects} objects in {time.monotonic() - started:.1f} s (32 threads)")
    client = await Client.connect(stack.config.temporal_address, plugins=[S3BatchPlugin(make_client())])
    job = S3BatchInput.model_validate(
        {"bucket": SRC, "prefix": "in/", "output_bucket": OUT, "output_prefix": "m/", "handler": "passthrough",
         "incremental": {"window_seconds": window}}
    )
    print("| runs | ledger.json bytes | near | retry | s/run (these 10) | files processed (these 10) |")
    print("|---|---|---|---|---|---|")
    times, done = [], []
    pool = ThreadPoolExecutor(16)
    async with Worker(client, task_queue=TQ, max_concurrent_activities=16, activity_executor=pool):
        for n in range(1, runs + 1):
            if n > 1:  # between runs: a few new objects and a few overwritten ones
                for i in range(ADDED):
                    put(s3, versions, f"in/new-{n:03d}-{i}.jsonl", b'{"new": %d}\n' % n)
                for i in range(OVERWRITTEN):
                    put(s3, versions, f"in/{(n * 97 + i * 1013) % objects:05d}.jsonl", b'{"run": %d}\n' % n)
            job_id = f"measure-{n:03d}"
            t0 = time.monotonic()
            await client.execute_workflow(S3BatchWorkflow.run, job, id=job_id, task_queue=TQ)
            times.append(time.monotonic() - t0)
            done.append(len(processed(s3, job_id)))
            for version in processed(s3, job_id):
                versions[version] = versions.get(version, 0) + 1
            if n == 1 or n % 10 == 0 or n == runs:
                ledger_body = s3.get_object(Bucket=OUT, Key="m/ledger/ledger.json")["Body"].read()
                ledger = json.loads(ledger_body)
                last = slice(-(n % 10 or 10), None) if n > 1 else slice(0, 1)
                print(f"| {n} | {len(ledger_body):,} | {len(ledger['near'])} | {len(ledger['retry'])} | "
                      f"{statistics.mean(times[last]):.2f} (first {times[0]:.1f}) | {sum(done[last])} |", flush=True)
    pool.shutdown()
    counts = collections.Counter(versions.values())
    print(f"{len(versions)} object versions uploaded; processed once: {counts[1]}, never: {counts[0]}, "
          f"more than once: {sum(v for k, v in counts.items() if k > 1)}")
    return 0 if set(counts) == {1} else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--objects", type=int, default=10_000)
    parser.add_argument("--window", type=int, default=30, help="incremental.window_seconds of the job")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="s3batch-measure-") as root:
        stack = Stack(StackConfig.random_ports(Path(root)))
        stack.start()
        os.environ.update(stack.config.env())  # make_client() and the worker use this stack
        try:
            return asyncio.run(measure(stack, args.runs, args.objects, args.window))
        finally:
            stack.stop()


if __name__ == "__main__":
    raise SystemExit(main())

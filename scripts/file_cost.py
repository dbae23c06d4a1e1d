"""The cost of a file, exactly (issue 31; the tables in docs/explanation/performance.md, "The cost of a file").

For a group of small files (~1 KB CSV, the benchmark's case 3) and for one 10,000-row file (0.8 MB, case 13),
run in this process as a worker runs them (``process_group`` / ``process_file`` under ``ActivityEnvironment``,
on a local stack started here): every S3 request by kind (the boto3 client's and the data path's,
``s3batch.objects``), the heartbeat calls, and the CPU by stage (cProfile's own CPU time of each function, each
thread's own: ``time.thread_time``, summed by the package it is in). cProfile slows Python code several times,
so the stages' shares are what count, and the CPU per file without the profiler is given beside them::

    .venv/bin/python scripts/file_cost.py                  # 500 small files, the 0.8 MB file
    S3BATCH_DATA_CLIENT=boto3 .venv/bin/python scripts/file_cost.py   # every request through boto3
"""

from __future__ import annotations

import contextlib
import cProfile
import json
import pstats
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

STAGES = [  # (stage, what a function's file path contains); the first that matches
    ("S3 client: boto3/botocore", ("botocore", "boto3", "urllib3", "http/client", "s3transfer", "email/",
                                   "ssl.py", "socket.py", "hmac.py", "dateutil", "xml/")),
    ("S3 client: obstore", ("obstore",)),
    ("Temporal SDK (heartbeats, context, metrics)", ("temporalio",)),
    ("pydantic (models, validation, JSON)", ("pydantic",)),
    ("logging", ("logging",)),
    ("pyarrow", ("pyarrow",)),
    ("s3batch: reading and parsing", ("s3batch/formats", "s3batch/reading", "s3batch/s3io", "csv.py", "_pyio",
                                      "codecs", "encodings/")),
    ("s3batch: handler, chunk, commit", ("s3batch/activities/handling", "s3batch/activities/taking",
                                         "s3batch/handlers", "s3batch/checkpoint", "s3batch/sinks",
                                         "s3batch/columns", "s3batch/rejects")),
    ("s3batch: file set-up and group", ("s3batch/",)),
    ("threads, locks, queues", ("threading", "concurrent/futures", "queue", "contextvars")),
    ("asyncio (the SDK's event loop)", ("asyncio/",)),
]


def stage_of(filename: str) -> str:
    for stage, needles in STAGES:
        if any(n in filename for n in needles):
            return stage
    return "other (interpreter, stdlib)" if filename != "~" else "builtins (C calls)"


def profile_by_stage(stats: pstats.Stats) -> dict[str, float]:
    """Own time (seconds) by stage; a built-in's time goes to the stage of the function that called it."""
    out: Counter[str] = Counter()
    for (filename, _, _name), (_, _, tottime, _, callers) in stats.stats.items():  # type: ignore[attr-defined]
        stage = stage_of(filename)
        if filename == "~" and callers:
            caller = max(callers.items(), key=lambda c: c[1][2])[0]
            stage = stage_of(caller[0])
        out[stage] += tottime
    return dict(out)


def stores_of(client: Any) -> Any:
    """The data path's obstore stores of ``client`` (None: every request through boto3, or a commit before them)."""
    try:
        from s3batch.objects import data_stores
    except ImportError:
        return None
    return data_stores(client)


def counted_client() -> tuple[Any, Counter[str]]:
    from s3batch.s3io import make_client

    client = make_client()
    calls: Counter[str] = Counter()
    client.meta.events.register("before-call.s3.*", lambda event_name, **_: calls.update([event_name.split(".")[-1]]))
    return client, calls


def measure(name: str, files: int, run: Any, client: Any, calls: Counter[str]) -> dict[str, Any]:
    """Run ``run(env)`` once unprofiled (CPU), once profiled (stages); the requests and heartbeats per file."""
    from temporalio.testing import ActivityEnvironment

    stores = stores_of(client)
    beats: list[Any] = []
    env = ActivityEnvironment()
    env.on_heartbeat = lambda *details: beats.append(details)
    cpu0, t0 = time.process_time(), time.perf_counter()
    run(env, "a")
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
    requests = Counter(calls)
    if stores is not None:
        requests.update(stores.counts)
    heartbeats = len(beats)
    profiler = cProfile.Profile(time.thread_time)
    with threads_profiled() as others:
        profiler.enable()
        run(env, "b")
        profiler.disable()
    stats = pstats.Stats(profiler)
    for other in others:
        stats.add(other)
    stages = profile_by_stage(stats)
    total = sum(stages.values())
    top = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:60]  # type: ignore[attr-defined]
    return {
        "case": name,
        "files": files,
        "cpu_ms_per_file": round(1000 * cpu / files, 3),
        "wall_ms_per_file": round(1000 * wall / files, 3),
        "s3_requests_per_file": {k: round(v / files, 3) for k, v in sorted(requests.items())},
        "heartbeat_calls_per_file": round(heartbeats / files, 3),
        "cpu_share_by_stage": {k: round(v / total, 3) for k, v in sorted(stages.items(), key=lambda kv: -kv[1])},
        "top_functions_own_share": [
            [f"{Path(f).name}:{line} {fn}", round(v[2] / total, 3)] for (f, line, fn), v in top
        ],
    }


@contextlib.contextmanager
def threads_profiled() -> Iterator[list[cProfile.Profile]]:
    """Profile each file of a group on its own thread too (cProfile sees one thread): ``_GroupRun._one``
    wrapped, its profiles collected into the list yielded."""
    from s3batch.activities import files

    found: list[cProfile.Profile] = []
    original = files._GroupRun._one

    def one(self: Any, index: int) -> None:
        profile = cProfile.Profile(time.thread_time)
        profile.enable()
        try:
            original(self, index)
        finally:
            profile.disable()
            found.append(profile)

    files._GroupRun._one = one  # type: ignore[method-assign]
    try:
        yield found
    finally:
        files._GroupRun._one = original  # type: ignore[method-assign]


def main() -> None:
    from s3batch.dev.stack import Stack, StackConfig, ensure_buckets, s3_client
    from s3batch.messages import ObjectRef, ProcessFileInput, ProcessGroupInput

    small = int(sys.argv[1]) if len(sys.argv) > 1 else 500
    import os

    with tempfile.TemporaryDirectory() as tmp:
        stack = Stack(StackConfig.random_ports(Path(tmp)))
        stack.start()
        try:
            os.environ.update(stack.config.env())
            from s3batch.activities.s3_activities import S3Activities

            from scripts.benchmark.data import customers_csv

            s3 = s3_client(stack.config)
            ensure_buckets(s3, "cost-src", "cost-out")
            objs = []
            for i in range(small):
                body = b"".join(customers_csv(11, start_id=11 * i + 1))
                s3.put_object(Bucket="cost-src", Key=f"small/f{i:05d}.csv", Body=body)
            big = b"".join(customers_csv(10_000))
            s3.put_object(Bucket="cost-src", Key="big/rows-10000.csv", Body=big)
            for page in s3.get_paginator("list_objects_v2").paginate(Bucket="cost-src"):
                objs += [ObjectRef(key=o["Key"], etag=o["ETag"].strip('"'), size=o["Size"]) for o in page["Contents"]]
            smalls = [o for o in objs if o.key.startswith("small/")]
            bigobj = next(o for o in objs if o.key.startswith("big/"))
            client, calls = counted_client()
            activities = S3Activities(client)

            def item(obj: ObjectRef, out: str) -> ProcessFileInput:
                return ProcessFileInput(job_id="cost", bucket="cost-src", obj=obj, output_bucket="cost-out",
                                        output_prefix=out, format="auto", handler="passthrough",
                                        chunk_records=10_000, max_record_bytes=8 * 1024 * 1024)

            def groups(env: Any, tag: str) -> None:
                calls.clear()
                for start in range(0, len(smalls), 100):  # the workflow's default group_max_files
                    batch = smalls[start : start + 100]
                    first = item(batch[0], f"{tag}/")
                    env.run(activities.process_group, ProcessGroupInput(file=first, more=batch[1:]))

            def one(env: Any, tag: str) -> None:
                calls.clear()
                env.run(activities.process_file, item(bigobj, f"{tag}/"))

            out = []
            for name, files, run in ((f"{small} small files (~1 KB, groups of 100)", small, groups),
                                     ("one 10,000-row file (0.8 MB)", 1, one)):
                stores = stores_of(client)
                if stores is not None:
                    stores.counts.clear()
                out.append(measure(name, files, run, client, calls))
            print(json.dumps(out, indent=1))
        finally:
            stack.stop()


if __name__ == "__main__":
    main()

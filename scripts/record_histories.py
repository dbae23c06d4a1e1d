"""Record workflow histories of an s3batch release into tests/histories/, for tests/test_replay.py.

Starts a local stack of its own (random ports, state in a temporary directory), a worker of the
chosen release (by default the previous release, built by ``s3batch.dev.releases``; ``--current`` records
the working tree), runs small real jobs that cover the workflow's code paths, and writes every run's
history (``fetch_history().to_json()``) to ``tests/histories/<release>_<scenario>[_runN].json``.
The servers and the worker are stopped when it ends.

    .venv/bin/python scripts/record_histories.py                  # the previous release (v0.1.0)
    .venv/bin/python scripts/record_histories.py --ref v0.2.0     # another tag or commit
    .venv/bin/python scripts/record_histories.py --current        # the working tree
    .venv/bin/python scripts/record_histories.py --only cancel    # some scenarios only

The files hold keys, ETags, counters and error messages of tiny synthetic inputs; worker identities
(``pid@host``) and stack traces are blanked, and the script refuses to write a history that contains
the stack's credentials or a local path.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import re
import socket
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter

from s3batch.dev.releases import PREVIOUS_RELEASE, ReleaseWorker, build_release
from s3batch.dev.stack import ACCESS_KEY, SECRET_KEY, Stack, StackConfig, ensure_buckets, s3_client
from s3batch.dev.workers import WorkerProcess

ROOT = Path(__file__).resolve().parent.parent
HISTORIES = ROOT / "tests" / "histories"
WORKFLOW = "S3BatchWorkflow"
HANDLER_MODULES = "tests.slow_handlers,tests.fault_handlers"
"""Loaded by the worker subprocess (from this checkout, or from the release's own files): the
recorder itself imports nothing from tests/."""


def csv_rows(rows: int, *, start: int = 0, marker: int | None = None) -> bytes:
    """A synthetic CSV; the row ``marker`` carries ``BOOM`` (``explode_on_marker`` fails its chunk)."""
    body = "".join(f"{i},{'BOOM' if i == marker else f'n{i}'}\n" for i in range(start, start + rows))
    return ("id,name\n" + body).encode()


@dataclass
class Ctx:
    client: Client
    s3: Any
    task_queue: str
    tag: str

    def buckets(self, name: str) -> tuple[str, str]:
        src, out = f"rec-{name[:20].replace('_', '-')}-{self.tag}", f"rec-out-{name[:16].replace('_', '-')}-{self.tag}"
        ensure_buckets(self.s3, src, out)
        return src, out

    def put(self, bucket: str, files: dict[str, bytes]) -> None:
        for key, body in files.items():
            self.s3.put_object(Bucket=bucket, Key=key, Body=body)

    async def start(self, name: str, job: dict[str, Any], state: dict[str, Any] | None = None) -> WorkflowHandle:
        # Plain JSON arguments, by workflow name: the same call starts a job on any release.
        args: list[Any] = [job] if state is None else [job, state]
        return await self.client.start_workflow(
            WORKFLOW, args=args, id=f"history-{name}-{self.tag}", task_queue=self.task_queue, result_type=dict
        )


async def until(handle: WorkflowHandle, check: Callable[[dict[str, Any]], bool], timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        progress = await handle.query("progress", result_type=dict)
        if check(progress):
            return progress
        if time.monotonic() > deadline:
            raise TimeoutError(f"{handle.id}: condition not reached in {timeout}s; progress {progress}")
        await asyncio.sleep(0.05)


async def result(handle: WorkflowHandle, timeout: float = 120) -> str:
    """How the job ended: ``succeeded``, or the failure type (``JobFailed``, ``cancelled``)."""
    try:
        await asyncio.wait_for(handle.result(), timeout)
    except WorkflowFailureError as err:
        cause = err.cause
        return getattr(cause, "type", None) or type(cause).__name__
    return "succeeded"


def _job(src: str, out: str, **options: Any) -> dict[str, Any]:
    return {"bucket": src, "prefix": "in/", "output_bucket": out, "output_prefix": "o/", **options}


# ------------------------------------------------------------------------------------ scenarios


async def continue_as_new(ctx: Ctx) -> tuple[WorkflowHandle, str]:
    """Seven files of three chunks, three files per run: three runs joined by continue-as-new."""
    src, out = ctx.buckets("can")
    ctx.put(src, {f"in/{i:02d}.csv": csv_rows(300) for i in range(7)})
    job = _job(src, out, chunk_records=100, group_max_files=1, max_concurrent_files=2)
    handle = await ctx.start("continue_as_new", job, {"files_per_run": 3})
    return handle, "succeeded"


async def groups(ctx: Ctx) -> tuple[WorkflowHandle, str]:
    """Ten small files processed in groups of up to four, two activities at a time."""
    src, out = ctx.buckets("groups")
    ctx.put(src, {f"in/{i:02d}.csv": csv_rows(20, start=i * 20) for i in range(10)})
    ctx.put(src, {"in/10.jsonl": b'{"id": 1}\n{"id": 2}\nnot json\n'})
    job = _job(src, out, group_max_files=4, max_concurrent_files=2)
    return await ctx.start("groups", job), "succeeded"


async def controls(ctx: Ctx) -> tuple[WorkflowHandle, str]:
    """Pause while a file is in flight, stay paused, resume, then raise the concurrency to three."""
    src, out = ctx.buckets("controls")
    ctx.put(src, {f"in/{i:02d}.csv": csv_rows(1_000) for i in range(6)})
    job = _job(src, out, handler="slow_passthrough", chunk_records=100, group_max_files=1, max_concurrent_files=1)
    handle = await ctx.start("controls", job)
    await until(handle, lambda p: p["files_in_flight"] == 1)
    await handle.execute_update("pause", result_type=dict)
    await until(handle, lambda p: p["files_in_flight"] == 0)
    await asyncio.sleep(1.0)
    await handle.execute_update("resume", result_type=dict)
    await handle.execute_update("set_concurrency", 3, result_type=dict)
    return handle, "succeeded"


async def failed_file(ctx: Ctx) -> tuple[WorkflowHandle, str]:
    """A file whose handler fails on every attempt and a CSV whose header is not UTF-8: the job
    processes the rest and fails (``max_failed_files=0``)."""
    src, out = ctx.buckets("failed")
    ctx.put(
        src,
        {
            "in/a-good.csv": csv_rows(250),
            "in/b-boom.csv": csv_rows(250, marker=120),
            "in/c-bad-header.csv": b"\xff\xfeid,name\n1,x\n",
        },
    )
    job = _job(src, out, handler="explode_on_marker", chunk_records=100, group_max_files=1, max_attempts=2)
    return await ctx.start("failed_file", job), "JobFailed"


async def redrive(ctx: Ctx) -> tuple[WorkflowHandle, str]:
    """The failed job's failed files again (``only_failed_of``), after the handler's bad row was
    fixed: one file now succeeds, the bad header fails again (allowed by ``max_failed_files``)."""
    src, out = f"rec-failed-{ctx.tag}", f"rec-out-failed-{ctx.tag}"
    copy = "o/_s3batch/redriven-report.json"
    ctx.s3.copy_object(Bucket=out, Key=copy, CopySource={"Bucket": out, "Key": "o/_report.json"})
    ctx.put(src, {"in/b-boom.csv": csv_rows(250)})
    job = _job(
        src,
        out,
        handler="explode_on_marker",
        chunk_records=100,
        group_max_files=1,
        max_attempts=2,
        max_failed_files=1,
        only_failed_of=f"s3://{out}/{copy}",
    )
    return await ctx.start("redrive", job), "succeeded"


async def group_fails(ctx: Ctx) -> tuple[WorkflowHandle, str]:
    """A group whose handler fails on one file: the group's attempts run out, its files are retried
    one per activity; the bad one fails alone and the job succeeds (``max_failed_files=1``)."""
    src, out = ctx.buckets("group-fails")
    files = {f"in/{i:02d}.csv": csv_rows(10, start=i * 10) for i in range(5)}
    files["in/02.csv"] = csv_rows(10, start=20, marker=25)
    ctx.put(src, files)
    job = _job(src, out, handler="explode_on_marker", max_attempts=2, max_failed_files=1, group_max_files=10)
    return await ctx.start("group_fails", job), "succeeded"


async def cancel(ctx: Ctx) -> tuple[WorkflowHandle, str]:
    """Cancelled while two files are in flight (and others not started): they stop at a chunk
    boundary, the report is written, the workflow ends cancelled."""
    src, out = ctx.buckets("cancel")
    ctx.put(src, {f"in/{i:02d}.csv": csv_rows(3_000) for i in range(5)})
    job = _job(src, out, handler="slow_passthrough", chunk_records=100, group_max_files=1, max_concurrent_files=2)
    handle = await ctx.start("cancel", job)
    await until(handle, lambda p: p["files_in_flight"] == 2 and p["records_written"] >= 200)
    await handle.cancel()
    return handle, "CancelledError"


async def straggler(ctx: Ctx) -> tuple[WorkflowHandle, str]:
    """One big slow file and six small ones, three files per run: each full run hands the big file
    over to the next (patch marker, grace timer, activity cancel)."""
    src, out = ctx.buckets("straggler")
    ctx.put(src, {"in/00-big.csv": csv_rows(3_000), **{f"in/{i:02d}.csv": csv_rows(20) for i in range(1, 7)}})
    job = _job(src, out, handler="slow_passthrough", chunk_records=100, group_max_files=1, max_concurrent_files=3)
    return await ctx.start("straggler", job, {"files_per_run": 3}), "succeeded"


async def splits(ctx: Ctx) -> tuple[WorkflowHandle, str]:
    """A big file in three byte-range splits at once (patch marker, three activities, one result), and a
    small file after them."""
    src, out = ctx.buckets("splits")
    ctx.put(src, {"in/00-big.csv": csv_rows(12_000), "in/01.csv": csv_rows(20)})
    job = _job(src, out, chunk_records=1_000, split_bytes=64 * 1024, max_concurrent_files=3)
    return await ctx.start("splits", job), "succeeded"


async def splits_quoted(ctx: Ctx) -> tuple[WorkflowHandle, str]:
    """A file whose quoted line breaks fall at a split's boundary: that split fails (not retried), the
    others are stopped, and the file is processed whole (one more activity); the job succeeds."""
    src, out = ctx.buckets("splits-quoted")
    body = "id,note\n" + "".join(f'{i},"one\ntwo {i}"\n' for i in range(8_000))
    ctx.put(src, {"in/quoted.csv": body.encode()})
    job = _job(src, out, chunk_records=500, split_bytes=64 * 1024, max_concurrent_files=3)
    return await ctx.start("splits_quoted", job), "succeeded"


async def straggler_splits(ctx: Ctx) -> tuple[WorkflowHandle, str]:
    """A big slow file in two byte-range splits and six small files, three files per run: each full run
    hands the splits over to the next (patch marker, grace timer, two activity cancels), which starts the
    same two splits again."""
    src, out = ctx.buckets("straggler-splits")
    big = csv_rows(12_000)
    ctx.put(src, {"in/00-big.csv": big, **{f"in/{i:02d}.csv": csv_rows(20) for i in range(1, 7)}})
    job = _job(src, out, handler="slow_passthrough", chunk_records=100, group_max_files=1, max_concurrent_files=3,
               split_bytes=len(big) // 2 + 1)
    return await ctx.start("straggler_splits", job, {"files_per_run": 3}), "succeeded"


SCENARIOS: dict[str, Callable[[Ctx], Awaitable[tuple[WorkflowHandle, str]]]] = {
    "continue_as_new": continue_as_new,
    "groups": groups,
    "controls": controls,
    "failed_file": failed_file,
    "redrive": redrive,
    "group_fails": group_fails,
    "cancel": cancel,
    "straggler": straggler,
    "splits": splits,
    "splits_quoted": splits_quoted,
    "straggler_splits": straggler_splits,
}


# ------------------------------------------------------------------------------------ recording


async def run_histories(client: Client, handle: WorkflowHandle) -> list[tuple[str, Any]]:
    """(run ID, history) of every run of the job, first run first, following continue-as-new."""
    runs: list[tuple[str, Any]] = []
    run_id = handle.first_execution_run_id or handle.result_run_id
    while run_id:
        history = await client.get_workflow_handle(handle.id, run_id=run_id).fetch_history()
        runs.append((run_id, history))
        last = history.events[-1]
        if last.event_type != EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
            break
        run_id = last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
    return runs


def scrubbed(history_json: str) -> str:
    """The history with worker identities and sticky queue names (``pid@host``) and stack traces
    (local paths) blanked."""

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            if node.get("kind") == "TASK_QUEUE_KIND_STICKY":  # a worker's own queue: "pid@host-uuid"
                return {**node, "name": "sticky-queue-of-a-worker"}
            return {
                k: ("s3batch-recorder" if k == "identity" else "" if k == "stackTrace" else walk(v))
                for k, v in node.items()
            }
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    return json.dumps(walk(json.loads(history_json)), indent=1) + "\n"


def check_clean(text: str, name: str, forbidden: list[str]) -> None:
    """Refuse a history holding any of ``forbidden``, in its JSON or in its (base64) payloads."""

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("data"), str) and "metadata" in node:
                check(base64.b64decode(node["data"]).decode(errors="replace"), f"{where}.data (decoded)")
            for key, value in node.items():
                walk(value, f"{where}.{key}")
        elif isinstance(node, list):
            for index, value in enumerate(node):
                walk(value, f"{where}[{index}]")
        elif isinstance(node, str):
            check(node, where)

    def check(value: str, where: str) -> None:
        for bad in forbidden:
            if bad and bad in value:
                raise RuntimeError(f"{name}: {where} contains {bad!r} (a credential, host or local path)")

    walk(json.loads(text), "history")


def release_label(args: argparse.Namespace) -> str:
    label = "current" if args.current else args.ref
    return re.sub(r"[^A-Za-z0-9.]+", "-", label)


async def record(args: argparse.Namespace, stack: Stack, tmp: Path) -> list[Path]:
    os.environ.update(stack.config.env())
    # Histories must be readable without a key.
    for name in (
        "S3BATCH_ENCRYPTION_KEY",
        "S3BATCH_ENCRYPTION_KEYS",
        "S3BATCH_ENCRYPTION_KEY_FILE",
        "S3BATCH_ENCRYPTION_ALLOW_PLAINTEXT",
    ):
        os.environ.pop(name, None)
    task_queue = f"record-{uuid.uuid4().hex[:8]}"
    env = {"S3BATCH_HANDLER_MODULES": HANDLER_MODULES, "S3BATCH_TEST_HANDLER_DELAY": "0.05"}
    if args.current:
        worker: Any = WorkerProcess(task_queue, tmp, "current", cwd=ROOT, env=env)
    else:
        release = build_release(args.ref)
        print(f"release {args.ref} ({release.commit[:12]}) ready in {release.build_seconds:.1f}s")
        worker = ReleaseWorker(release, task_queue, tmp, args.ref, **env)
    written: list[Path] = []
    try:
        worker.wait_ready()
        client = await Client.connect(
            stack.config.temporal_address, data_converter=pydantic_data_converter, identity="s3batch-recorder"
        )
        ctx = Ctx(client, s3_client(stack.config), task_queue, uuid.uuid4().hex[:6])
        label = release_label(args)
        forbidden = [SECRET_KEY, ACCESS_KEY, str(ROOT), tempfile.gettempdir() + "/", f"@{socket.gethostname()}"]
        for name in args.only or list(SCENARIOS):
            started = time.monotonic()
            handle, expected = await SCENARIOS[name](ctx)
            outcome = await result(handle)
            if outcome != expected:
                raise RuntimeError(f"{name}: the job ended {outcome}, expected {expected}")
            runs = await run_histories(client, handle)
            for index, (_run_id, history) in enumerate(runs, 1):
                suffix = f"_run{index}" if len(runs) > 1 else ""
                path = args.out / f"{label}_{name}{suffix}.json"
                text = scrubbed(history.to_json())
                check_clean(text, path.name, forbidden)
                path.write_text(text)
                written.append(path)
                print(f"  {path.name}: {len(history.events)} events")
            print(f"{name}: {outcome}, {len(runs)} run(s), {time.monotonic() - started:.1f}s")
    except BaseException:
        print(f"--- worker log ---\n{worker.log()[-4000:]}", file=sys.stderr)
        raise
    finally:
        worker.stop()
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    which = parser.add_mutually_exclusive_group()
    which.add_argument(
        "--ref", default=PREVIOUS_RELEASE, help=f"git tag or commit to record (default {PREVIOUS_RELEASE})"
    )
    which.add_argument("--current", action="store_true", help="record with the working tree instead")
    parser.add_argument("--only", nargs="+", choices=list(SCENARIOS), help="record only these scenarios")
    parser.add_argument("--out", type=Path, default=HISTORIES, help="where to write (default tests/histories)")
    args = parser.parse_args(argv)
    if args.only and "redrive" in args.only and "failed_file" not in args.only:
        parser.error("redrive redrives the failed_file job: record both")
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="s3batch-record-") as tmp:
        stack = Stack(StackConfig.random_ports(Path(tmp) / "stack"))
        try:
            stack.start()
            written = asyncio.run(record(args, stack, Path(tmp)))
        finally:
            stack.stop()
    print(f"wrote {len(written)} histories to {args.out}")


if __name__ == "__main__":
    main()

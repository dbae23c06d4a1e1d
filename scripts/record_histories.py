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
    .venv/bin/python scripts/record_histories.py --current --label v0.3.0-dev --only all_rejected

The jobs are in ``scripts/record_scenarios.py``. The files hold keys, ETags, counters and error messages of
tiny synthetic inputs; worker identities (``pid@host``) and stack traces are blanked, and the script refuses
to write a history that contains the stack's credentials, a local path or a record's value (``CANARY``, in
the records of the newer scenarios' files). With ``--current`` it also refuses a scenario whose runs lack
the patch markers it is there to record (``PATCHES``).
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
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter

from s3batch.dev.releases import PREVIOUS_RELEASE, ReleaseWorker, build_release
from s3batch.dev.stack import ACCESS_KEY, SECRET_KEY, Stack, StackConfig, s3_client
from s3batch.dev.workers import WorkerProcess

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from scripts.record_scenarios import CANARY, CURRENT_ONLY, PATCHES, SCENARIOS, Ctx, result  # noqa: E402

HISTORIES = ROOT / "tests" / "histories"
HANDLER_MODULES = "tests.slow_handlers,tests.fault_handlers"
"""Loaded by the worker subprocess (from this checkout, or from the release's own files): the
recorder itself imports nothing from tests/."""


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
    label = args.label or ("current" if args.current else args.ref)
    return re.sub(r"[^A-Za-z0-9.]+", "-", label)


def patch_markers(history: Any) -> set[str]:
    """The ``workflow.patched`` IDs whose markers a run's history holds."""
    found = set()
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
            attrs = event.marker_recorded_event_attributes
            if attrs.marker_name == "core_patch":
                found.add(json.loads(attrs.details["patch-data"].payloads[0].data)["id"])
    return found


async def record_one(ctx: Ctx, name: str, args: argparse.Namespace, forbidden: list[str]) -> list[Path]:
    """Run scenario ``name`` and write each run's history; fails if the job did not end as expected or, for
    the working tree, if the runs miss a patch marker the scenario is there to record."""
    started = time.monotonic()
    handle, expected = await SCENARIOS[name](ctx)
    outcome = await result(handle)
    if outcome != expected:
        raise RuntimeError(f"{name}: the job ended {outcome}, expected {expected}")
    runs = await run_histories(ctx.client, handle)
    missing = PATCHES.get(name, set()) - set().union(*(patch_markers(h) for _, h in runs)) if args.current else set()
    if missing:
        raise RuntimeError(f"{name}: no marker of {sorted(missing)} in its runs: the job missed the path it records")
    written = []
    for index, (_run_id, history) in enumerate(runs, 1):
        suffix = f"_run{index}" if len(runs) > 1 else ""
        path = args.out / f"{release_label(args)}_{name}{suffix}.json"
        text = scrubbed(history.to_json())
        check_clean(text, path.name, forbidden)
        path.write_text(text)
        written.append(path)
        print(f"  {path.name}: {len(history.events)} events")
    print(f"{name}: {outcome}, {len(runs)} run(s), {time.monotonic() - started:.1f}s")
    return written


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
    (tmp / "gates").mkdir()
    env = {
        "S3BATCH_HANDLER_MODULES": HANDLER_MODULES,
        "S3BATCH_TEST_HANDLER_DELAY": "0.05",
        "S3BATCH_TEST_GATE_DIR": str(tmp / "gates"),
    }
    if args.current:
        worker: Any = WorkerProcess(task_queue, tmp, "current", cwd=ROOT, env=env)
    else:
        release = build_release(args.ref)
        print(f"release {args.ref} ({release.commit[:12]}) ready in {release.build_seconds:.1f}s")
        worker = ReleaseWorker(release, task_queue, tmp, args.ref, **env)
    names = args.only or [n for n in SCENARIOS if args.current or n not in CURRENT_ONLY]
    written: list[Path] = []
    try:
        worker.wait_ready()
        client = await Client.connect(
            stack.config.temporal_address, data_converter=pydantic_data_converter, identity="s3batch-recorder"
        )
        ctx = Ctx(client, s3_client(stack.config), task_queue, uuid.uuid4().hex[:6], tmp, env)
        forbidden = [SECRET_KEY, ACCESS_KEY, str(ROOT), tempfile.gettempdir() + "/", f"@{socket.gethostname()}", CANARY]
        for name in names:
            written += await record_one(ctx, name, args, forbidden)
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
    parser.add_argument(
        "--label", help="the release label the files are named with (default: the --ref, or 'current'), e.g. v0.3.0-dev"
    )
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

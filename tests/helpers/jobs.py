"""Starting jobs on the test stack and waiting on their progress."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from s3batch.workflows.batch import S3BatchWorkflow
from temporalio.client import Client, WorkflowHandle
from temporalio.exceptions import ActivityError, ApplicationError

from s3batch.messages import Progress, S3BatchResult
from s3batch.models import S3BatchInput
from tests.helpers import wait_for

SLOW_HEARTBEAT_TIMEOUT = 20
"""Generous: the SDK sends a heartbeat every 0.8 x the timeout, so a 2 s timeout failed a file on a
0.4 s stall of a loaded machine. (The test worker reports checkpoints every second regardless.)"""


def slow_job(src: str, out: str, **kw: Any) -> S3BatchInput:
    """A job over ``in/`` of ``src`` with the ``slow_passthrough`` handler: 100-record chunks at 50 ms
    each, so a 1,000-row file is in flight ~0.5 s; one file per activity; ``kw`` overrides."""
    options: dict[str, Any] = {
        "prefix": "in/",
        "output_bucket": out,
        "output_prefix": "o/",
        "handler": "slow_passthrough",
        "chunk_records": 100,
        "group_max_files": 1,
        "heartbeat_timeout_seconds": SLOW_HEARTBEAT_TIMEOUT,
    }
    return S3BatchInput(bucket=src, **{**options, **kw})


def new_id(tag: str) -> str:
    """A fresh workflow ID ``<tag>-<8 hex digits>``."""
    return f"{tag}-{uuid.uuid4().hex[:8]}"


async def start(client: Client, task_queue: str, spec: S3BatchInput, tag: str) -> WorkflowHandle[Any, S3BatchResult]:
    """Start a job (ID ``<tag>-<8 hex digits>``); its handle."""
    return await client.start_workflow(S3BatchWorkflow.run, spec, id=new_id(tag), task_queue=task_queue)


async def execute(client: Client, task_queue: str, spec: S3BatchInput, tag: str = "job") -> S3BatchResult:
    """Run a job to its end; its result (a failed job raises ``WorkflowFailureError``)."""
    return await client.execute_workflow(S3BatchWorkflow.run, spec, id=new_id(tag), task_queue=task_queue)


async def progress(handle: WorkflowHandle[Any, Any]) -> Progress:
    return await handle.query(S3BatchWorkflow.progress)


async def until(check: Callable[[Progress], bool], handle: WorkflowHandle[Any, Any], timeout: float = 60) -> Progress:
    """The job's progress once ``check`` holds (queried every 50 ms, at most ``timeout`` seconds)."""

    async def holds() -> Progress | None:
        p = await progress(handle)
        return p if check(p) else None

    return await wait_for(holds, timeout, f"a progress of {handle.id} that passes the check")


def job_error(err: BaseException) -> ApplicationError:
    """The error a failed job's step raised, under the wrappers Temporal adds: the workflow failure, and an
    ``ActivityError`` where the step was an activity (a local activity's error is the job's failure itself)."""
    cause = getattr(err, "cause", None)
    while isinstance(cause, ActivityError) and cause.cause is not None:
        cause = cause.cause
    assert isinstance(cause, ApplicationError), f"the job failed with {cause!r}, not an ApplicationError"
    return cause

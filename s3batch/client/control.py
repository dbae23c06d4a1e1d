"""Controls of a running job: pause, resume, set its concurrency (workflow updates), cancel.

The updates are the workflow's own: ``temporal workflow update execute --name pause --workflow-id
ID`` does the same (``set_concurrency`` takes ``--input N``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, TypeVar

from temporalio.api.errordetails.v1 import WorkflowNotReadyFailure
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from s3batch.client.errors import ControlRejected, JobNotRunning
from s3batch.client.jobs import describe_run, status_word
from s3batch.messages import Progress

T = TypeVar("T")

NOT_READY_WAIT = 30.0
"""How long an update waits for a job whose workflow task is being retried (seconds)."""


def not_ready(err: RPCError) -> bool:
    """Whether the server refused an update because the job's last workflow task failed and is being retried: an
    update (or an activity's end) arrived while that task was ending the job, or its worker died in it. The job is
    running; the update is taken once a task of it completes."""
    details = err.grpc_status.details
    return bool(details) and details[0].Is(WorkflowNotReadyFailure.DESCRIPTOR)


async def update_when_ready(handle: WorkflowHandle[Any, Any], name: str, args: list[Any], result_type: type[T]) -> T:
    """Run the update ``name`` of a running job, trying again for up to :data:`NOT_READY_WAIT` seconds while the
    server says the job is not ready for it (:func:`not_ready`). Any other error is raised as it is."""
    deadline = time.monotonic() + NOT_READY_WAIT
    delay = 0.1
    while True:
        try:
            return await handle.execute_update(name, args=args, result_type=result_type)
        except RPCError as err:
            if not not_ready(err) or time.monotonic() + delay > deadline:
                raise
        await asyncio.sleep(delay)
        delay = min(delay * 2, 2.0)


def _rejection(err: WorkflowUpdateFailedError) -> str:
    """Why the workflow refused an update, from the update failure's cause."""
    cause = err.cause
    return cause.message if isinstance(cause, ApplicationError) else str(cause)


async def _update(client: Client, workflow_id: str, name: str, *args: Any) -> Progress:
    """Send one control update to a running job and return its progress afterwards.

    Raises:
        JobNotFound: No job has this ID.
        JobNotRunning: The job finished.
        ControlRejected: The job refused the update (e.g. a concurrency out of range).
    """
    handle, _ = await describe_run(client, workflow_id)
    try:
        return await update_when_ready(handle, name, list(args), Progress)
    except WorkflowUpdateFailedError as err:
        raise ControlRejected(f"{name} rejected: {_rejection(err)}") from None
    except RPCError as err:
        if err.status in (RPCStatusCode.NOT_FOUND, RPCStatusCode.FAILED_PRECONDITION):
            raise JobNotRunning(f"job {workflow_id!r} is not running: {err.message}") from None
        raise


async def pause(client: Client, workflow_id: str) -> Progress:
    """Start no new file; the files in flight finish. Returns the job's progress afterwards."""
    return await _update(client, workflow_id, "pause")


async def resume(client: Client, workflow_id: str) -> Progress:
    """Start files again after :func:`pause`. Returns the job's progress afterwards."""
    return await _update(client, workflow_id, "resume")


async def set_concurrency(client: Client, workflow_id: str, n: int) -> Progress:
    """Process at most ``n`` files at once (1 to 1000). Returns the job's progress afterwards."""
    return await _update(client, workflow_id, "set_concurrency", n)


async def cancel(client: Client, workflow_id: str) -> None:
    """Ask a running job to stop gracefully: files in flight stop at their next chunk boundary,
    then the report is written with them as cancelled.

    Raises:
        JobNotFound: No job has this ID.
        JobNotRunning: The job finished (the server would accept the request and ignore it).
    """
    handle, desc = await describe_run(client, workflow_id)
    if desc.status != WorkflowExecutionStatus.RUNNING:
        status = status_word(desc.status)
        raise JobNotRunning(f"job {workflow_id!r} is not running (it ended: {status}): nothing to cancel")
    try:
        await handle.cancel()
    except RPCError as err:
        if err.status in (RPCStatusCode.NOT_FOUND, RPCStatusCode.FAILED_PRECONDITION):
            raise JobNotRunning(f"job {workflow_id!r} is not running: {err.message}") from None
        raise

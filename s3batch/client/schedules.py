"""Schedules of incremental jobs (issue 16): a Temporal Schedule starts the job on each tick.

Each run's workflow ID is the schedule's (``s3batch-schedule-NAME``) with the tick's time appended by
Temporal (``s3batch-schedule-NAME-2026-12-01T13:00:00Z``); an incremental job writes under
``{output_prefix}runs/{that ID}/``. The overlap policy is SKIP by default: a tick while the previous
run still runs starts nothing. The Web UI shows them under Schedules.
"""

from __future__ import annotations

import datetime
from typing import Any

from temporalio.api.common.v1 import Payload
from temporalio.api.workflowservice.v1 import ListScheduleMatchingTimesRequest
from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleBackfill,
    ScheduleHandle,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleState,
)
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from s3batch.client.errors import InvalidRequest, JobNotFound, WrongJobState
from s3batch.config import Settings
from s3batch.models import S3BatchInput

WORKFLOW = "S3BatchWorkflow"
OVERLAPS = {p.name.lower(): p for p in ScheduleOverlapPolicy if p.name != "UNSPECIFIED"}


def schedule_id(name: str) -> str:
    return f"s3batch-{name}"


def run_workflow_id(name: str) -> str:
    """The workflow ID the schedule gives its runs (Temporal appends ``-{tick time}``)."""
    return f"s3batch-schedule-{name}"


def tick_workflow_id(name: str, tick: datetime.datetime) -> str:
    """The workflow ID of the run of ``tick`` (Temporal appends the tick's time, to the second, in UTC)."""
    return f"{run_workflow_id(name)}-{tick.astimezone(datetime.UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}"


def incremental(job: S3BatchInput) -> S3BatchInput:
    """``job`` with ``incremental`` set (``{}``: the default ledger) when it has none: a scheduled job is
    incremental, or each tick would process the whole prefix again."""
    if job.incremental is not None:
        return job
    return S3BatchInput.model_validate({**job.model_dump(mode="json", exclude_unset=True), "incremental": {}})


async def create(
    client: Client,
    name: str,
    job: S3BatchInput,
    *,
    every: datetime.timedelta | None = None,
    cron: str | None = None,
    overlap: str = "skip",
    task_queue: str | None = None,
    paused: bool = False,
) -> ScheduleHandle:
    """Create the schedule ``s3batch-NAME`` that starts ``job`` (made incremental) every ``every`` or
    on the ``cron`` expression. Its runs carry the job's summary (source -> output, a payload: encrypted
    with a key) as jobs started by ``s3batch start`` do; the workflow indexes them (``S3BatchSource``)."""
    spec = ScheduleSpec(
        intervals=[ScheduleIntervalSpec(every=every)] if every is not None else [],
        cron_expressions=[cron] if cron is not None else [],
    )
    action = ScheduleActionStartWorkflow(
        WORKFLOW,
        args=[incremental(job).model_dump(mode="json", exclude_unset=True)],
        id=run_workflow_id(name),
        task_queue=task_queue or Settings().task_queue,
        static_summary=f"s3://{job.bucket}/{job.prefix} -> s3://{job.output_bucket}/{job.output_prefix}",
    )
    schedule = Schedule(
        action=action,
        spec=spec,
        policy=SchedulePolicy(overlap=OVERLAPS[overlap]),
        state=ScheduleState(paused=paused, note="created by s3batch schedule create"),
    )
    return await client.create_schedule(schedule_id(name), schedule)


async def list_all(client: Client) -> list[dict[str, Any]]:
    """The s3batch schedules: name, paused, next and recent run times, and the job's source and output
    (:func:`job_of`)."""
    found = []
    async for entry in await client.list_schedules():
        if not entry.id.startswith("s3batch-"):
            continue
        info, schedule = entry.info, entry.schedule
        recent = [getattr(a.action, "workflow_id", "") for a in (info.recent_actions if info else [])]
        found.append(
            {
                "name": entry.id.removeprefix("s3batch-"),
                "id": entry.id,
                "paused": bool(schedule and schedule.state.paused),
                "next": [t.isoformat() for t in (info.next_action_times if info else [])][:1],
                "recent": recent[-3:],
                "job": await job_of(client, entry.id),
            }
        )
    return found


async def job_of(client: Client, schedule: str) -> str:
    """``s3://bucket/prefix/ -> s3://output/prefix/`` of the job a schedule starts, decoded with the
    client's converter (its encryption key); a placeholder when this client cannot decode it."""
    try:
        action = (await client.get_schedule_handle(schedule).describe()).schedule.action
        if not isinstance(action, ScheduleActionStartWorkflow) or not action.args:
            return "(no s3batch job)"
        raw = [a for a in action.args if isinstance(a, Payload)]
        [job] = await client.data_converter.decode(raw[:1], [S3BatchInput])
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:  # deleted while listing
            return "(deleted)"
        raise
    except (ApplicationError, KeyError, RuntimeError, ValueError):  # KeyError: an encoding unknown without the codec
        # An encrypted job read without its key (or not an s3batch input): say so, never guess.
        return "(cannot be decoded here: encrypted with another key, or no key set)"
    return f"s3://{job.bucket}/{job.prefix} -> s3://{job.output_bucket}/{job.output_prefix}"


async def pause(client: Client, name: str, note: str = "paused by s3batch") -> None:
    await client.get_schedule_handle(schedule_id(name)).pause(note=note)


async def unpause(client: Client, name: str, note: str = "unpaused by s3batch") -> None:
    await client.get_schedule_handle(schedule_id(name)).unpause(note=note)


async def trigger(client: Client, name: str) -> None:
    """Start a run now (under the schedule's overlap policy)."""
    await client.get_schedule_handle(schedule_id(name)).trigger()


async def delete(client: Client, name: str) -> None:
    """Delete the schedule (runs already started go on)."""
    await client.get_schedule_handle(schedule_id(name)).delete()


async def ticks(client: Client, name: str, start: datetime.datetime, end: datetime.datetime) -> list[datetime.datetime]:
    """The schedule's ticks between ``start`` and ``end`` (as the server computes them for a backfill).

    Raises:
        JobNotFound: There is no schedule ``s3batch-NAME``.
    """
    request = ListScheduleMatchingTimesRequest(namespace=client.namespace, schedule_id=schedule_id(name))
    request.start_time.FromDatetime(start)
    request.end_time.FromDatetime(end)
    try:
        response = await client.workflow_service.list_schedule_matching_times(request)
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise JobNotFound(
                f"no schedule {schedule_id(name)} in namespace {client.namespace} (see `s3batch schedule list`)"
            ) from None
        raise
    return [t.ToDatetime(datetime.UTC) for t in response.start_time]


async def backfill(client: Client, name: str, start: datetime.datetime, end: datetime.datetime) -> list[str]:
    """Run the ticks the schedule would have had between ``start`` and ``end`` (all of them, one after
    the other: overlap BUFFER_ALL), e.g. after a pause. Each is an incremental run of the ledger, whose
    workflow ID is :func:`tick_workflow_id`. Returns those IDs, in tick order.

    Raises:
        JobNotFound: There is no schedule ``s3batch-NAME``.
        InvalidRequest: The window holds no tick of the schedule, or ends in the future.
        WrongJobState: A tick of the window already ran (nothing was started).
    """
    now = datetime.datetime.now(datetime.UTC)
    if end > now:
        raise InvalidRequest(
            f"--end {end.isoformat()} is in the future (now {now.isoformat(timespec='seconds')}): a backfill runs "
            "past ticks, the schedule runs the others; nothing was started"
        )
    found = await ticks(client, name, start, end)
    if not found:
        raise InvalidRequest(
            f"schedule {schedule_id(name)} has no tick between {start.isoformat()} and {end.isoformat()}: "
            "nothing was started; give a window that holds at least one of its ticks (`s3batch schedule list` "
            "shows the next one)"
        )
    ids = [tick_workflow_id(name, t) for t in found]
    # A second run of a tick would reuse its workflow ID, hence its output prefix (overwriting the first
    # run's report) and its name in the ledger (which takes its write for a retry of the first run's and
    # records nothing of it).
    query = f"WorkflowId STARTS_WITH '{run_workflow_id(name)}-'"
    ran = sorted(set(ids) & {wf.id async for wf in client.list_workflows(query)})
    if ran:
        shown = ", ".join(ran[:3]) + (f" and {len(ran) - 3} more" if len(ran) > 3 else "")
        raise WrongJobState(
            f"{len(ran)} tick(s) of this window already ran: {shown}; a tick runs once (its workflow ID names its "
            "output prefix), so nothing was started: give a window without them"
        )
    await client.get_schedule_handle(schedule_id(name)).backfill(
        ScheduleBackfill(start_at=start, end_at=end, overlap=ScheduleOverlapPolicy.BUFFER_ALL)
    )
    return ids

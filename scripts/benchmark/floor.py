"""Case 13's one-file job, taken apart: where its time goes (from its history), and the least any durable job of
one activity costs on the same server (a workflow whose one activity does nothing), so that the best ratio a
workflow of Temporal allows for the file is in the table beside the ratio s3batch reaches.

The floor's worker runs in the benchmark's process, on a task queue of its own, with the SDK's defaults (its
workflow sandboxed, a thread pool for its activity, as s3batch's worker). Its workflow and activity carry no
data: what it measures is the job's round trips (start, a workflow task, the activity's dispatch and
completion, a workflow task, the result), none of s3batch's steps.
"""

from __future__ import annotations

import statistics
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

from temporalio import activity, workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.worker import Worker

FLOOR_RUNS = 15
"""Floor workflows timed (after two to warm up); the median is the floor."""


@activity.defn(name="bench.nothing")
def nothing(tag: str) -> str:
    """The floor's activity: returns at once."""
    return tag


@workflow.defn(name="BenchFloor")
class FloorWorkflow:
    """The least durable job: one activity, then the result."""

    @workflow.run
    async def run(self, tag: str) -> str:
        return await workflow.execute_activity(nothing, tag, start_to_close_timeout=timedelta(minutes=1))


async def floor_seconds(client: Client, task_queue: str) -> float:
    """The median seconds from start to result of :class:`FloorWorkflow` on a worker of this process."""
    times = []
    with ThreadPoolExecutor(4) as pool:
        async with Worker(client, task_queue=task_queue, workflows=[FloorWorkflow], activities=[nothing],
                          activity_executor=pool):
            for n in range(FLOOR_RUNS + 2):
                t0 = time.perf_counter()
                await client.execute_workflow(FloorWorkflow.run, "x", id=f"floor-{uuid.uuid4().hex[:10]}",
                                              task_queue=task_queue)
                if n >= 2:
                    times.append(time.perf_counter() - t0)
    return statistics.median(times)


async def job_phases(client: Client, workflow_id: str) -> dict[str, Any]:
    """Where a one-run job's time went, in seconds, from its history's event times: ``first_task`` (from the
    workflow task's start to its completion: the check and the listing, local activities in it), ``tasks``
    (the later workflow tasks, each from its start to its completion), ``dispatch`` (each workflow task from
    scheduled to started), and each activity from scheduled to completed by type (``activities``)."""
    events = (await client.get_workflow_handle(workflow_id).fetch_history()).events
    at = {e.event_id: e.event_time.ToMicroseconds() / 1e6 for e in events}
    phases: dict[str, Any] = {"first_task": 0.0, "tasks": 0.0, "dispatch": 0.0, "activities": {}}
    types: dict[int, str] = {}
    for e in events:
        kind = e.event_type
        if kind == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            phases["dispatch"] += at[e.event_id] - at[e.workflow_task_started_event_attributes.scheduled_event_id]
        elif kind == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            took = at[e.event_id] - at[e.workflow_task_completed_event_attributes.started_event_id]
            phases["tasks" if phases["first_task"] else "first_task"] += took
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            types[e.event_id] = e.activity_task_scheduled_event_attributes.activity_type.name
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            scheduled = e.activity_task_completed_event_attributes.scheduled_event_id
            name = types[scheduled]
            phases["activities"][name] = phases["activities"].get(name, 0.0) + at[e.event_id] - at[scheduled]
    phases["history"] = at[events[-1].event_id] - at[events[0].event_id]
    return phases

"""A job's workflow history, every run of it."""

from __future__ import annotations

from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client


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

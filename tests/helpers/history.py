"""A job's workflow history: every run of it, the activities a run scheduled and asked to stop, replaying its runs,
all its text."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

from google.protobuf.json_format import MessageToDict
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecution, WorkflowHandle
from temporalio.worker import Replayer

from s3batch.plugin import S3BatchPlugin


async def _runs(client: Client, workflow_id: str) -> AsyncIterator[tuple[WorkflowExecution, list[Any]]]:
    """Each run of a workflow (continue-as-new included), oldest first, with its events."""
    runs = [e async for e in client.list_workflows(f"WorkflowId = '{workflow_id}'")]
    for run_ in sorted(runs, key=lambda r: r.start_time):
        history = await client.get_workflow_handle(workflow_id, run_id=run_.run_id).fetch_history()
        yield run_, list(history.events)


async def history_events(client: Client, workflow_id: str) -> list[Any]:
    """Every event of every run of a workflow (continue-as-new included), oldest run first."""
    return [e async for _, events in _runs(client, workflow_id) for e in events]


async def history_outline(client: Client, workflow_id: str) -> str:
    """Every run of a workflow, an event a line (ID, type, the worker of a workflow task, an activity's type, a
    marker's name, a timer's ID, a failure's message): what a test that failed once in CI prints, to be read
    afterwards."""
    lines: list[str] = []
    async for run_, events in _runs(client, workflow_id):
        lines.append(f"run {run_.run_id} ({run_.status.name if run_.status else 'running'})")
        for e in events:
            attributes = MessageToDict(e)
            detail = next((v for k, v in attributes.items() if k.endswith("Attributes")), {})
            keys = ("identity", "activityType", "markerName", "timerId", "failure", "cause")
            said = [str(detail[k])[:160] for k in keys if k in detail]
            lines.append(f"  {e.event_id} {EventType.Name(e.event_type).removeprefix('EVENT_TYPE_')} {' '.join(said)}")
    return "\n".join(lines)


def scheduled_activities(events: list[Any]) -> list[str]:
    """Activity type names in the order they were scheduled, local activities (the check and the listing pages of a
    prefix, a manifest or a redrive) included: those are in the history as the markers of their results."""
    names = []
    for e in events:
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            names.append(e.activity_task_scheduled_event_attributes.activity_type.name)
        elif (ran := local_activity(e)) is not None:
            names.append(str(ran["activity_type"]))
    return names


def local_activity(event: Any) -> dict[str, Any] | None:
    """What the marker of a local activity says of it (``activity_type``, its last ``attempt``...: the marker's
    ``data`` detail, JSON); None for any other event."""
    if event.event_type != EventType.EVENT_TYPE_MARKER_RECORDED:
        return None
    marker = event.marker_recorded_event_attributes
    if marker.marker_name != "core_local_activity":
        return None
    data: dict[str, Any] = json.loads(marker.details["data"].payloads[0].data)
    return data


async def runs_of(client: Client, handle: WorkflowHandle[Any, Any]) -> list[list[Any]]:
    """The events of each run of a job so far, first run first, following continue-as-new."""
    runs: list[list[Any]] = []
    run_id = handle.first_execution_run_id or handle.result_run_id
    while run_id:
        events = (await client.get_workflow_handle(handle.id, run_id=run_id).fetch_history()).events
        runs.append(list(events))
        last = events[-1]
        if last.event_type != EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
            break
        run_id = last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
    return runs


def activity_summaries(client: Client, events: list[Any]) -> dict[int, str]:
    """The summary of each activity a run scheduled (a file activity's: its file's key, and its split), by
    event ID."""
    converter = client.data_converter.payload_converter
    found: dict[int, str] = {}
    for e in events:
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED and e.HasField("user_metadata"):
            found[e.event_id] = converter.from_payload(e.user_metadata.summary, str)
    return found


def cancel_requested(events: list[Any]) -> set[int]:
    """Scheduled-event IDs of the activities a run asked to stop."""
    return {
        e.activity_task_cancel_requested_event_attributes.scheduled_event_id
        for e in events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_CANCEL_REQUESTED
    }


async def assert_runs_replay(client: Client, handle: WorkflowHandle[Any, Any], runs: list[list[Any]]) -> None:
    """Every run of the job (``runs``: :func:`runs_of`'s) replays with the current workflow code."""
    chain_ids = [handle.first_execution_run_id or handle.result_run_id]
    for events in runs[:-1]:
        chain_ids.append(events[-1].workflow_execution_continued_as_new_event_attributes.new_execution_run_id)
    replayer = Replayer(workflows=[], plugins=[S3BatchPlugin(encryption_key=b"")])
    for run_id in chain_ids:
        history = await client.get_workflow_handle(handle.id, run_id=run_id).fetch_history()
        assert (await replayer.replay_workflow(history)).replay_failure is None, run_id


def _strings(value: Any) -> Iterator[str]:
    """Every string in a history event as a dict, with payload data base64-decoded."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield k
            if k == "data" and isinstance(v, str):
                yield base64.b64decode(v).decode(errors="replace")
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)
    elif isinstance(value, str):
        yield value


async def history_text(client: Client, workflow_id: str) -> str:
    """Every string of every event of a workflow's history (payloads decoded), for searching."""
    events = await history_events(client, workflow_id)
    return "\n".join(s for e in events for s in _strings(MessageToDict(e)))

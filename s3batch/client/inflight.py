"""The files a running job is processing, from the server's pending activities: the objects from
the activities' input (in the run's history), the checkpoints from their heartbeat details."""

from __future__ import annotations

import datetime
from typing import Any

from temporalio.api.enums.v1 import PendingActivityState
from temporalio.client import Client

from s3batch.checkpoint import Checkpoint, HeartbeatDetails
from s3batch.client.views import InFlightFile
from s3batch.messages import ObjectRef, ProcessFileInput, SplitRange

PROCESS_FILE_ACTIVITY = "s3batch.process_file"
PROCESS_GROUP_ACTIVITY = "s3batch.process_group"
FILE_ACTIVITIES = (PROCESS_FILE_ACTIVITY, PROCESS_GROUP_ACTIVITY)
"""Activity types that process files (one, or a group of small ones): their pending attempts are
the files in flight."""

ObjectsCache = dict[tuple[str, str], tuple[list[ObjectRef], SplitRange | None]]
"""The objects of file activities (and the split of a big file one processes), by run and activity ID
(see :func:`in_flight_files`)."""


def _input_objects(activity_type: str, value: Any) -> tuple[list[ObjectRef], SplitRange | None]:
    """The objects of one file activity's input (a group activity processes several), and its split."""
    if activity_type == PROCESS_GROUP_ACTIVITY:
        first = ProcessFileInput.model_validate(value["file"])
        return [first.obj, *(ObjectRef.model_validate(obj) for obj in value["more"])], None
    req = ProcessFileInput.model_validate(value)
    return [req.obj], req.split


def _heartbeat(details: list[Any]) -> tuple[Checkpoint | None, int, int | None]:
    """A file activity's last checkpoint, which file of its group it is about (0 for a single file) and the
    bytes of the group's files finished (None where not sent); no checkpoint before its first heartbeat."""
    heartbeat = HeartbeatDetails.of(details)
    return heartbeat.read(), heartbeat.group_index or 0, heartbeat.group_done


async def _read_objects(client: Client, workflow_id: str, run_id: str, wanted: set[str], cache: ObjectsCache) -> None:
    """Fill ``cache`` with the objects of the ``wanted`` activities, from their scheduled events."""
    async for event in client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history_events():
        if not event.HasField("activity_task_scheduled_event_attributes"):
            continue
        attrs = event.activity_task_scheduled_event_attributes
        if attrs.activity_id in wanted and attrs.input.payloads:
            [value] = await client.data_converter.decode(attrs.input.payloads[:1])
            cache[(run_id, attrs.activity_id)] = _input_objects(attrs.activity_type.name, value)


async def in_flight_files(
    client: Client, workflow_id: str, run_id: str, raw: Any, objects_cache: ObjectsCache | None = None
) -> list[InFlightFile]:
    """The files in flight, from the pending activities of a workflow description (``raw``: its
    ``raw_description``), sorted by key.

    The server lists pending activities without their input; the objects (keys and sizes) are read
    from the ``ActivityTaskScheduled`` events of the same run (a run holds at most a few thousand
    events). ``objects_cache`` spares a caller that polls (``s3batch watch``) reading the history
    again while the same activities are pending.
    """
    pending = [p for p in raw.pending_activities if p.activity_type.name in FILE_ACTIVITIES]
    if not pending:
        return []
    cache = objects_cache if objects_cache is not None else {}
    wanted = {p.activity_id for p in pending if (run_id, p.activity_id) not in cache}
    if wanted:
        await _read_objects(client, workflow_id, run_id, wanted, cache)
    files = []
    for p in pending:
        payloads = p.heartbeat_details.payloads
        checkpoint, index, group_done = _heartbeat(await client.data_converter.decode(payloads) if payloads else [])
        group, split = cache.get((run_id, p.activity_id), ([], None))
        files.append(
            InFlightFile(
                key=group[index].key if index < len(group) else None,
                activity_id=p.activity_id,
                attempt=p.attempt,
                state=PendingActivityState.Name(p.state).removeprefix("PENDING_ACTIVITY_STATE_").lower(),
                last_heartbeat=(
                    p.last_heartbeat_time.ToDatetime(tzinfo=datetime.UTC) if p.HasField("last_heartbeat_time") else None
                ),
                checkpoint=checkpoint,
                last_failure=p.last_failure.message if p.HasField("last_failure") else None,
                group_files=len(group),
                group_index=index,
                sizes=[obj.size for obj in group],
                group_done=group_done,
                split=split,
            )
        )
    return sorted(files, key=lambda f: f.key or "")

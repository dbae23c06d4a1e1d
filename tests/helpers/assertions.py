"""Assertions shared by the tests: a file's output is its source's records exactly once, in order;
a job refused its input."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError

from tests.helpers.data import csv_rows
from tests.helpers.history import history_events, scheduled_activities
from tests.helpers.output import read_jsonl


def output_check(s3: Any, bucket: str, file_prefix: str, rows: int, pad: int = 0) -> dict[str, Any]:
    """Compare a file's output with the records of ``make_csv(rows, pad)``: lost and doubled records
    (by the ``id`` column), order, and the exact contents (the figures of a reliability row)."""
    records = read_jsonl(s3, bucket, file_prefix)
    ids = [int(r["id"]) for r in records]
    distinct = set(ids)
    return {
        "records_in": rows,
        "records_out": len(ids),
        "duplicates": len(ids) - len(distinct),
        "lost": len(set(range(rows)) - distinct),
        "in_order": ids == list(range(rows)),
        "exact": records == csv_rows(rows, pad),
    }


def assert_exact(check: dict[str, Any]) -> None:
    """An ``output_check`` found every record exactly once, in order, with its exact contents."""
    assert check["lost"] == 0, f"{check['lost']} records lost"
    assert check["duplicates"] == 0, f"{check['duplicates']} records doubled"
    assert check["in_order"], "records out of order"
    assert check["records_out"] == check["records_in"]
    assert check["exact"], "output records differ from the source records"


def assert_exactly_once(s3: Any, bucket: str, file_prefix: str, rows: int, pad: int = 0) -> None:
    """The output under ``file_prefix`` is the records of ``make_csv(rows, pad)``, each exactly once, in order."""
    assert_exact(output_check(s3, bucket, file_prefix, rows, pad))


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

"""Replay the recorded histories of running jobs (tests/histories/) with the current workflow code.

A worker of a new version takes over the jobs its predecessors left running, and replays their
histories before it goes on. If the workflow code now issues other commands (another activity, a
different order, a timer more or less) at a point where the history records something else, the
replay raises a non-determinism error: on a real deployment, that job's workflow task would fail
and the job would hang. Such a change must go behind ``workflow.patched(...)``. No server is
needed: histories are replayed in-process.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from s3batch.workflows import patches
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from s3batch.plugin import S3BatchPlugin

HISTORIES = Path(__file__).parent / "histories"
FILES = sorted(HISTORIES.glob("*.json"))
CLOSED = {
    f"EVENT_TYPE_WORKFLOW_EXECUTION_{end}" for end in ("COMPLETED", "FAILED", "CANCELED", "CONTINUED_AS_NEW")
}


def test_histories_are_recorded() -> None:
    # A glob that found nothing would turn the replay tests into no tests at all.
    assert len(FILES) >= 9, f"expected the recorded histories in {HISTORIES} (scripts/record_histories.py)"


def replayer() -> Replayer:
    # The plugin, as workers get it: it registers S3BatchWorkflow and the pydantic data converter.
    # No encryption key: the recorded histories are plain.
    return Replayer(workflows=[], plugins=[S3BatchPlugin(encryption_key=b"")])


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
async def test_recorded_history_replays(path: Path) -> None:
    text = path.read_text()
    events = json.loads(text)["events"]
    started = events[0]["workflowExecutionStartedEventAttributes"]
    assert started["workflowType"]["name"] == "S3BatchWorkflow"
    # A recording whose own tasks failed, or of a job still running, would guard nothing.
    assert not [e for e in events if e["eventType"] == "EVENT_TYPE_WORKFLOW_TASK_FAILED"], path.name
    assert events[-1]["eventType"] in CLOSED, f"{path.name} ends with {events[-1]['eventType']}"
    history = WorkflowHistory.from_json(f"replay-{path.stem}", text)
    # Raises (a NondeterminismError, or the failure of the replayed task) if the current code does
    # not issue the same commands as the code that recorded the history.
    result = await replayer().replay_workflow(history)
    assert result.replay_failure is None


def _markers(path: Path) -> set[str]:
    found = set()
    for event in json.loads(path.read_text())["events"]:
        attrs = event.get("markerRecordedEventAttributes")
        if attrs and attrs["markerName"] == "core_patch":
            found.add(json.loads(base64.b64decode(attrs["details"]["patch-data"]["payloads"][0]["data"]))["id"])
    return found


def test_every_patch_has_a_recorded_history() -> None:
    # A patch no recorded history takes guards nothing: a later change of its new branch (or of its old one)
    # would pass CI and break the jobs on it. Record a scenario for it (scripts/record_scenarios.py).
    ids = {value for name, value in vars(patches).items() if name.isupper() and isinstance(value, str)}
    recorded = set().union(*map(_markers, FILES))
    assert len(ids) >= 11 and not ids - recorded, f"no recorded history holds the marker of {sorted(ids - recorded)}"

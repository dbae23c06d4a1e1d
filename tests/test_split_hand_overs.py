"""A big file in byte-range splits handed over at continue-as-new twice while its splits are in flight (issue 29):
each later run starts the same splits (the file keeps its split count, where a count made afresh would differ),
each resuming from its own checkpoint; the books then hold every record exactly once, the report's totals are
its entries', and the file is done. Also with the first and the second hand-over finding one split waiting for
its retry (the cancel ends it at once, reporting nothing), in its retry, or failing as the cancel reaches it (the
server retries no activity asked to stop: the file was recorded failed before the ``hand-over-failed-attempt``
patch; those two cases failed on 2401f60, the others passed as built).

Real Temporal dev server and SeaweedFS (the conftest fixtures, an in-process worker). The job runs 3 files at
once at first: the big file, which would take 4 splits (``split_bytes`` a quarter of it), starts in the 3 free
slots; the test then sets the concurrency to 4, so a count made afresh in a later run would be 4. Each run starts
2 files: the big one and a small one. The handler holds every split of the big file at chunk ``HOLDS[0]`` in its
first leg and ``HOLDS[1]`` in its second, until the test has seen the run ask the splits to stop: the hand-overs
find them in flight, at a known place. When a run hands over is the test's to say: in the first run, once the
splits are in place, the concurrency goes to 4 and the run's small file starts (the run is full, and hands over
a moment after that file ends); in the second, the run's small file is held until the splits are in place.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from s3batch.workflows.batch import S3BatchWorkflow
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.exceptions import RetryState
from temporalio.worker import Worker

from s3batch.formats.common import Record
from s3batch.handlers import HandlerResult, chunk_context, chunk_handler
from s3batch.messages import JobState, S3BatchResult
from tests.helpers import wait_for
from tests.helpers.assertions import assert_exactly_once
from tests.helpers.data import make_csv, put_files
from tests.helpers.history import activity_summaries, assert_runs_replay, cancel_requested, runs_of
from tests.helpers.jobs import new_id, progress, slow_job
from tests.helpers.output import report

BIG = "in/a-big.csv"
BIG_ROWS = 4_500
"""3 splits of about 15 chunks of 100 records each."""
BIG_PAD = 60
"""Filler bytes a record: a quarter of the file is over the least ``split_bytes`` (64 KiB)."""
SMALLS = [f"in/s{i}.csv" for i in range(4)]
SMALL_ROWS = 50
HOLDS = (2, 8)
"""The chunk (counted within its split) at which each split of the big file is held in its first leg, and in its
second: until the run handing it over has asked it to stop."""
FAULTY = 1
"""The split a fault is put on (the second)."""
DELAY = 0.02
"""Seconds a chunk."""


@dataclass
class Script:
    """What the handler does to one job (by its source bucket), and what it saw.

    Each split of the big file is held at chunk ``HOLDS[leg]`` until ``released[leg]``; then, while
    ``stopping[leg]``, its next chunk waits until the split has learnt that it is asked to stop (the heartbeat
    of the chunk just committed brings that back), so it stops there: never runs on to its next hold or its end.

    ``faults[leg]``, the fault of split :data:`FAULTY` in its leg ``leg`` (0: the first hand-over finds it, 1: the
    second): ``backoff``: its first 3 attempts fail at the held chunk (the hand-over finds it waiting 4 s for its
    4th: the cancel ends it at once, with no result); ``retrying``: its first attempt fails there (the hand-over
    finds its 2nd attempt held); ``failing``: its first attempt fails once released, just after the run asked it
    to stop (before it learnt so, unless the cancel reached it first: then it stops as the others do).
    """

    faults: tuple[str, str]
    released: tuple[threading.Event, ...] = field(default_factory=lambda: (threading.Event(), threading.Event()))
    """Per leg: the held splits go on."""
    stopping: list[bool] = field(default_factory=lambda: [False, False])
    """Per leg: the splits are being handed over (set with ``released``, cleared once the next run has them)."""
    smalls: threading.Event = field(default_factory=threading.Event)
    """The small files after the first go on."""
    held: set[tuple[int, int, int]] = field(default_factory=set)
    """(leg, split, attempt) of each split held."""
    failed: set[tuple[int, int, int]] = field(default_factory=set)
    """(leg, split, attempt) of each attempt the script failed."""

    def chunk(self, chunk: int, split: int, attempt: int) -> None:
        if chunk in HOLDS:
            self._hold(HOLDS.index(chunk), split, attempt)
        elif chunk - 1 in HOLDS and self.stopping[HOLDS.index(chunk - 1)]:
            deadline = time.monotonic() + 30
            while not activity.is_cancelled() and self.stopping[HOLDS.index(chunk - 1)] and time.monotonic() < deadline:
                time.sleep(0.01)

    def _hold(self, leg: int, split: int, attempt: int) -> None:
        fault = self.faults[leg] if split == FAULTY and not self.released[leg].is_set() else ""  # not once handed over
        if (fault == "backoff" and attempt <= 3) or (fault == "retrying" and attempt == 1):
            self._fail(leg, split, attempt)
        self.held.add((leg, split, attempt))
        self.released[leg].wait(60)
        if fault == "failing" and attempt == 1:
            self._fail(leg, split, attempt)

    def _fail(self, leg: int, split: int, attempt: int) -> None:
        self.failed.add((leg, split, attempt))
        raise RuntimeError("a transient fault (the test's)")

    def in_place(self, leg: int) -> bool:
        """The splits are where the hand-over of leg ``leg`` must find them."""
        fault = self.faults[leg]
        others = all((leg, s, 1) in self.held for s in range(3) if s != FAULTY)
        if fault in ("", "failing"):
            return others and (leg, FAULTY, 1) in self.held
        if fault == "backoff":
            return others and (leg, FAULTY, 3) in self.failed
        return others and (leg, FAULTY, 2) in self.held  # retrying

    def release(self, leg: int) -> None:
        self.stopping[leg] = True
        self.released[leg].set()

    def release_all(self) -> None:
        self.stopping[:] = [False, False]
        for event in (*self.released, self.smalls):
            event.set()


SCRIPTS: dict[str, Script] = {}


@chunk_handler("split_hand_overs")
def split_hand_overs(records: Sequence[Record]) -> HandlerResult:
    """Passthrough, :data:`DELAY` a chunk; the big file's splits and the small files as their job's script says."""
    context = chunk_context()
    script = SCRIPTS.get(context.bucket)
    if script is not None and context.key == BIG and context.split is not None:
        script.chunk(context.chunk, context.split, context.attempt)
    elif script is not None and context.key in SMALLS[1:]:
        script.smalls.wait(60)
    time.sleep(DELAY)
    return HandlerResult([r.value for r in records], [])


async def _stopped_runs(client: Client, runs: list[list[Any]]) -> list[int]:
    """The runs (by index) that asked every split of the big file they started to stop."""
    found = []
    for index, events in enumerate(runs):
        big = {sid for sid, summary in activity_summaries(client, events).items() if summary.startswith(BIG)}
        if big and big <= cancel_requested(events):
            found.append(index)
    return found


async def _states(client: Client, runs: list[list[Any]]) -> list[JobState]:
    """The state each run after the first started with (carried over by continue-as-new)."""
    states = []
    for events in runs[1:]:
        started = events[0]
        assert started.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED
        args = started.workflow_execution_started_event_attributes.input.payloads
        _, state = await client.data_converter.decode(args)
        states.append(JobState.model_validate(state))
    return states


def _handed_over(states: list[JobState]) -> list[JobState]:
    """The states of the runs the big file was handed to."""
    return [st for st in states if BIG in [o.key for o in st.pending]]


FAULTS = [("", ""), ("backoff", "retrying"), ("retrying", "backoff"), ("failing", "failing")]
"""The faults the first and the second hand-over find (each fault at each hand-over, in 3 jobs)."""


@pytest.mark.parametrize("faults", FAULTS, ids=["in-flight", *(f"{a}-then-{b}" for a, b in FAULTS[1:])])
async def test_a_file_in_splits_handed_over_twice_keeps_its_splits_and_its_books(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, worker: Worker, faults: tuple[str, str]
) -> None:
    src, out = buckets
    put_files(s3, src, {BIG: make_csv(BIG_ROWS, BIG_PAD), **{key: make_csv(SMALL_ROWS) for key in SMALLS}})
    size = s3.head_object(Bucket=src, Key=BIG)["ContentLength"]
    job = slow_job(src, out, handler="split_hand_overs", max_concurrent_files=3, split_bytes=size // 4 + 1)
    script = SCRIPTS[src] = Script(faults)
    try:
        handle = await client.start_workflow(
            S3BatchWorkflow.run,
            args=[job.model_dump(mode="json"), {"files_per_run": 2}],
            id=new_id("split-hand-overs"),
            task_queue=task_queue,
            result_type=S3BatchResult,
        )
        for n in (0, 1):
            await wait_for(lambda n=n: script.in_place(n), 60, f"the big file's splits in place for hand-over {n + 1}")
            if n == 0:
                await handle.execute_update(S3BatchWorkflow.set_concurrency, 4)  # the run's small file starts
            else:
                script.smalls.set()  # the run's small file ends

            async def passed(n: int = n, handed: bool = False) -> bool:
                now = await progress(handle)
                assert not now.files_failed, f"a file failed at hand-over {n + 1}: {now}"
                runs = await runs_of(client, handle)
                if handed:
                    return len(_handed_over(await _states(client, runs))) > n
                return len(await _stopped_runs(client, runs)) > n

            await wait_for(passed, 60, f"hand-over {n + 1}: a run asking the big file's splits to stop", 0.2)
            script.release(n)
            await wait_for(lambda n=n: passed(n, True), 60, f"hand-over {n + 1}: the next run given the file", 0.2)
            script.stopping[n] = False
    finally:
        script.release_all()
        del SCRIPTS[src]
    result = await handle.result()

    # The books: every file done once, the totals its entries', every record exactly once.
    rep = report(s3, out)
    entries = {e["key"]: e for e in rep["files"]}
    assert sorted(e["key"] for e in rep["files"]) == sorted([BIG, *SMALLS]), "each file exactly once in the report"
    big = entries[BIG]
    assert big["status"] == "succeeded" and big["splits"] == 3, big
    assert big["records"] == big["records_written"] == BIG_ROWS and big["rejected"] == 0, big
    assert big["resumed_from_record"] > 0, big  # its last splits resumed from their checkpoints
    totals = rep["totals"]
    for name in ("records", "records_written", "rejected"):
        assert totals[name] == sum(e[name] for e in entries.values()), name
    assert totals["records_written"] == BIG_ROWS + SMALL_ROWS * len(SMALLS)
    assert (totals["files_succeeded"], totals["files_failed"], totals["files_cancelled"]) == (1 + len(SMALLS), 0, 0)
    assert result.status == "succeeded" and result.totals.records_written == totals["records_written"]
    assert_exactly_once(s3, out, f"o/{BIG}/", BIG_ROWS, BIG_PAD)
    for key in SMALLS:
        assert_exactly_once(s3, out, f"o/{key}/", SMALL_ROWS)

    # Its split count: every activity of the big file, in every run, is one of the same 3 splits; each run it was
    # handed to started with the count in its state.
    runs = await runs_of(client, handle)
    legs = [s for events in runs for s in activity_summaries(client, events).values() if s.startswith(BIG)]
    assert set(legs) == {f"{BIG} (split {i} of 3)" for i in (1, 2, 3)}, legs
    states = await _states(client, runs)
    handed = _handed_over(states)
    assert len(handed) >= 2, f"the big file was handed over {len(handed)} time(s)"
    for st in handed:  # each run the file was handed to starts it first, in the same 3 splits
        assert st.split_counts == {BIG: 3} and st.pending[0].key == BIG, st
    assert not any(st.whole for st in states)
    # The fault took place (the split's attempt failed, or was ended waiting for its retry, with the run asking
    # it to stop); a failure was not retried by the server, and did not fail the file.
    assert all((leg, FAULTY, 1) in script.failed for leg, fault in enumerate(faults) if fault), script.failed
    failed = [e for events in runs for e in events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED]
    assert {e.activity_task_failed_event_attributes.retry_state for e in failed} <= {RetryState.CANCEL_REQUESTED.value}
    await assert_runs_replay(client, handle, runs)

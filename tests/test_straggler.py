"""A straggler at continue-as-new: a run that has started its files hands the big file still in flight
to the next run (stopped at a chunk boundary, resumed from its committed checkpoint), so the next
run's small files fill the other slots instead of waiting for it (issue 11, point 4).

Real Temporal dev server and SeaweedFS; the big file is slow by its handler (50 ms a chunk of 100
records), the job continues as new every 3 files.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import pytest
from s3batch.workflows.batch import S3BatchWorkflow
from s3batch.workflows.books import Books
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    CancelledError,
    RetryState,
    TimeoutError,
    TimeoutType,
)
from temporalio.worker import Worker

from s3batch.config import Settings
from s3batch.dev.postgres import PostgresServer, server_bindir
from s3batch.dev.stack import Stack
from s3batch.formats.common import Record
from s3batch.handlers import HandlerResult, chunk_context, chunk_handler
from s3batch.messages import FileResult, JobState, ObjectRef, S3BatchResult
from s3batch.plugin import S3BatchPlugin
from s3batch.s3io import make_client
from tests.helpers import wait_for
from tests.helpers.assertions import assert_exactly_once
from tests.helpers.data import make_csv, put_files
from tests.helpers.history import activity_summaries, assert_runs_replay, cancel_requested, runs_of
from tests.helpers.jobs import new_id, slow_job
from tests.helpers.output import read_jsonl, report

BIG = "in/a-big.csv"
"""Listed first, so the first run starts it with its first small files."""
BIG_ROWS = 8_000
"""80 chunks of 100 records at 50 ms each: several seconds, longer than a run of small files."""
SMALL_ROWS = 50
SMALLS = [f"in/s{i:02d}.csv" for i in range(9)]
FILES_PER_RUN = 3

GATES: dict[str, tuple[int, threading.Event]] = {}
"""Per source bucket: the chunk of the big file at which the handler waits until the event is set."""
REACHED: set[str] = set()
"""Source buckets whose big file reached its gate (a loaded machine may start it too late for the first run's
hand-over to find it there)."""
FAIL_AFTER_GATE: set[str] = set()
"""Source buckets whose big file's first attempt fails once through its gate (a fault a retry passes)."""


@chunk_handler("straggler_slow")
def straggler_slow(records: Sequence[Record]) -> HandlerResult:
    """Passthrough, 50 ms a chunk; the big file's chunk of its bucket's gate waits for the gate."""
    context = chunk_context()
    gate = GATES.get(context.bucket)
    if gate is not None and context.key == BIG and context.chunk == gate[0]:
        REACHED.add(context.bucket)
        gate[1].wait(120)
        if context.bucket in FAIL_AFTER_GATE and context.attempt == 1:
            raise RuntimeError("a transient fault (the test's)")
    time.sleep(0.05)
    return HandlerResult([r.value for r in records], [])


def _put_job_files(s3: Any, src: str) -> None:
    put_files(s3, src, {BIG: make_csv(BIG_ROWS), **{key: make_csv(SMALL_ROWS) for key in SMALLS}})


def _spec(src: str, out: str, **kw: Any) -> dict[str, Any]:
    spec = slow_job(src, out, handler="straggler_slow", max_concurrent_files=4, **kw)
    return spec.model_dump(mode="json")


async def _start(
    client: Client, task_queue: str, src: str, out: str, tag: str, job: dict[str, Any] | None = None, **knobs: Any
) -> WorkflowHandle[Any, Any]:
    """The job (``_spec`` unless given), continuing as new every ``FILES_PER_RUN`` files (the state's
    tuning knobs, and ``knobs``)."""
    return await client.start_workflow(
        S3BatchWorkflow.run,
        args=[job or _spec(src, out), {"files_per_run": FILES_PER_RUN, **knobs}],
        id=new_id(tag),
        task_queue=task_queue,
        result_type=S3BatchResult,
    )


async def _hand_over_requested(handle: WorkflowHandle[Any, Any]) -> bool:
    """The job's current run has asked an activity to stop (a hand-over)."""
    return bool(cancel_requested(list((await handle.fetch_history()).events)))


def _check_every_file_once(result: S3BatchResult, s3: Any, out: str) -> dict[str, dict[str, Any]]:
    """The job succeeded with every file's records written exactly once and its report's books right;
    the report's entries by key."""
    assert result.status == "succeeded"
    assert result.totals.files_succeeded == 1 + len(SMALLS)
    assert result.totals.records_written == BIG_ROWS + SMALL_ROWS * len(SMALLS)
    assert_exactly_once(s3, out, f"o/{BIG}/", BIG_ROWS)
    for key in SMALLS:
        assert_exactly_once(s3, out, f"o/{key}/", SMALL_ROWS)
    return _check_report_books(report(s3, out))


def _check_report_books(rep: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """One report entry per listed file, and the totals are the sums of the entries; entries by key."""
    entries = {e["key"]: e for e in rep["files"]}
    assert sorted(e["key"] for e in rep["files"]) == sorted([BIG, *SMALLS]), "each file exactly once in the report"
    totals = rep["totals"]
    assert totals["files_listed"] == 1 + len(SMALLS)
    for field in ("records", "records_written", "rejected"):
        assert totals[field] == sum(e[field] for e in entries.values()), field
    by_status = {s: sum(1 for e in entries.values() if e["status"] == s) for s in ("succeeded", "cancelled")}
    assert totals["files_succeeded"] == by_status["succeeded"]
    assert totals["files_cancelled"] == by_status["cancelled"]
    return entries


async def test_straggler_is_handed_over_and_the_next_runs_fill_the_slots(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, worker: Worker
) -> None:
    src, out = buckets
    _put_job_files(s3, src)
    handle = await _start(client, task_queue, src, out, "straggler")
    result = await handle.result()

    entries = _check_every_file_once(result, s3, out)
    # Its last leg resumed from the checkpoint committed before the hand-over (found on S3: a new
    # activity has no heartbeat of its own), never from the start.
    assert entries[BIG]["resumed_from_record"] > 0, entries[BIG]

    runs = await runs_of(client, handle)
    legs = []  # (run, stopped for a hand-over) of each activity of the big file
    for index, events in enumerate(runs):
        stopped = cancel_requested(events)
        legs += [(index, sid in stopped) for sid, key in (activity_summaries(client, events)).items() if key == BIG]
    assert len({run for run, _ in legs}) >= 2, f"the big file ran in one run only: {legs}"
    # Each leg but the last was asked to stop (the last may have been too, finishing its last chunk).
    assert all(stopped for _, stopped in legs[:-1]), legs
    # Small files started in the runs after the first hand-over, beside the big file: the slots were used.
    first_hand_over = legs[0][0]
    later = [key for events in runs[first_hand_over + 1 :] for key in (activity_summaries(client, events)).values()]
    assert set(SMALLS) & set(later), "no small file ran beside the handed-over big file"

    # The new history (a hand-over: marker, timer, activity cancel) replays with the current code.
    await assert_runs_replay(client, handle, runs)


async def test_a_straggler_in_splits_is_handed_over_and_the_next_run_resumes_the_same_splits(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, worker: Worker
) -> None:
    """A big file over ``split_bytes`` runs in two splits (two slots); once the run is full its splits
    stop at a chunk boundary like any straggler, and the next run starts the same two splits, each
    resuming from its own checkpoint (before, the run waited for them with its other slots idle)."""
    src, out = buckets
    _put_job_files(s3, src)
    size = s3.head_object(Bucket=src, Key=BIG)["ContentLength"]
    job = _spec(src, out, split_bytes=size // 2 + 1)
    gate = threading.Event()
    GATES[src] = (3, gate)  # each split waits in its chunk 3 until the run asks them to stop: never done too soon
    try:
        handle = await _start(client, task_queue, src, out, "straggler-splits", job=job)

        what = "the first run asking the splits to stop (a hand-over)"
        await wait_for(lambda: _hand_over_requested(handle), 60, what)
    finally:
        gate.set()
        del GATES[src]
    result = await handle.result()

    entries = _check_every_file_once(result, s3, out)
    big = entries[BIG]
    assert big["splits"] == 2 and big["records"] == BIG_ROWS, big
    assert big["resumed_from_record"] > 0, big  # its splits resumed from their checkpoints, not from the start

    runs = await runs_of(client, handle)
    legs = []  # (run, split, stopped for a hand-over) of each activity of the big file
    for index, events in enumerate(runs):
        stopped = cancel_requested(events)
        for sid, summary in (activity_summaries(client, events)).items():
            if summary.startswith(BIG):
                legs.append((index, summary[len(BIG) :], sid in stopped))
    assert {split for _, split, _ in legs} == {" (split 1 of 2)", " (split 2 of 2)"}, legs  # the same two
    legged = sorted({run for run, _, _ in legs})
    assert len(legged) >= 2, f"the big file's splits ran in one run only: {legs}"
    assert all(stopped for run, _, stopped in legs if run < legged[-1]), legs  # stopped in every run but its last
    later = [key for events in runs[legged[0] + 1 :] for key in (activity_summaries(client, events)).values()]
    assert set(SMALLS) & set(later), "no small file ran beside the handed-over splits"
    await assert_runs_replay(client, handle, runs)


async def test_cancel_during_a_hand_over_reports_the_big_file_cancelled_with_its_committed_records(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, worker: Worker
) -> None:
    src, out = buckets
    _put_job_files(s3, src)
    gate_chunk, gate = 3, threading.Event()
    GATES[src] = (gate_chunk, gate)  # the big file waits in its chunk 3: the hand-over must wait for it
    try:
        handle = await _start(client, task_queue, src, out, "strag-cancel")

        what = "the first run asking the big file to stop (a hand-over)"
        await wait_for(lambda: _hand_over_requested(handle), 60, what)
        await handle.cancel()

        async def cancel_recorded() -> bool:
            events = (await handle.fetch_history()).events
            return any(e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED for e in events)

        await wait_for(cancel_recorded, 30, "the job's cancel request in the run handing over")
    finally:
        gate.set()
        del GATES[src]
    with pytest.raises(WorkflowFailureError) as failure:
        await handle.result()
    assert isinstance(failure.value.cause, CancelledError)

    runs = await runs_of(client, handle)
    assert len(runs) == 1, "the job was cancelled in the run handing over: it never continued as new"
    rep = report(s3, out)
    assert rep["status"] == "cancelled"
    entries = _check_report_books(rep)
    big = entries[BIG]
    # It stopped at a chunk boundary after the gated chunk (once the cancellation reached it with a
    # heartbeat's response): its records are those of its committed chunks, each exactly once, in order.
    # (Started late on a loaded machine, it may have stopped for the hand-over before reaching the gate.)
    assert big["status"] == "cancelled", big
    floor = (gate_chunk + 1) * 100 if src in REACHED else 0
    assert floor <= big["records"] < BIG_ROWS and big["records"] % 100 == 0, big
    ids = [int(r["id"]) for r in read_jsonl(s3, out, f"o/{BIG}/")]
    assert ids == list(range(big["records"]))
    for key in SMALLS:
        if entries[key]["status"] == "succeeded":
            assert_exactly_once(s3, out, f"o/{key}/", SMALL_ROWS)
        else:
            assert entries[key]["status"] == "not_started" and not read_jsonl(s3, out, f"o/{key}/"), entries[key]
    assert sum(e["status"] == "succeeded" for e in entries.values()) == FILES_PER_RUN - 1


async def test_a_straggler_whose_attempt_fails_as_the_hand_over_stops_it_is_handed_over_not_failed(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, worker: Worker
) -> None:
    """The big file's attempt fails (a fault a retry passes) just after the run asked it to stop, before it learnt
    so: the server retries no activity it was asked to stop, but the file did not fail: it is handed over like any
    straggler, and the next run resumes it (before: recorded failed with 9 attempts left, the job failed)."""
    src, out = buckets
    _put_job_files(s3, src)
    gate = threading.Event()
    GATES[src] = (3, gate)  # held in its chunk 3 until the run asks it to stop, then fails there
    FAIL_AFTER_GATE.add(src)
    job = slow_job(src, out, handler="straggler_slow", max_concurrent_files=1).model_dump(mode="json")
    try:
        handle = await _start(client, task_queue, src, out, "strag-fails", job=job)
        # Held there before the small files start (its last heartbeat sent long before the hand-over asks it to
        # stop: it cannot learn so before it fails).
        await wait_for(lambda: src in REACHED, 60, "the big file held in its chunk 3")
        await handle.execute_update(S3BatchWorkflow.set_concurrency, 4)
        await wait_for(lambda: _hand_over_requested(handle), 60, "the first run asking the big file to stop")
    finally:
        gate.set()
        del GATES[src]
    result = await handle.result()
    FAIL_AFTER_GATE.discard(src)

    entries = _check_every_file_once(result, s3, out)
    assert entries[BIG]["status"] == "succeeded" and entries[BIG]["resumed_from_record"] > 0, entries[BIG]
    runs = await runs_of(client, handle)
    # Its attempt failed in the run that handed it over, and the server did not retry it.
    failed = [e for e in runs[0] if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED]
    assert [e.activity_task_failed_event_attributes.retry_state for e in failed] == [
        RetryState.CANCEL_REQUESTED.value
    ], failed
    await assert_runs_replay(client, handle, runs)


async def test_without_the_hand_over_a_full_run_waits_for_its_big_file(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, worker: Worker
) -> None:
    # The state's tuning knob hand_over=false (the benchmark's baseline): v0.1's behaviour.
    src, out = buckets
    _put_job_files(s3, src)
    handle = await _start(client, task_queue, src, out, "no-hand-over", hand_over=False)
    result = await handle.result()
    assert result.status == "succeeded" and result.totals.files_succeeded == 1 + len(SMALLS)
    runs = await runs_of(client, handle)
    assert not any(cancel_requested(events) for events in runs), "a file was asked to stop"
    legs = [key for events in runs for key in (activity_summaries(client, events)).values() if key == BIG]
    assert legs == [BIG], "the big file ran in one activity"
    assert report(s3, out)["files"] and _check_report_books(report(s3, out))[BIG]["resumed_from_record"] == 0
    assert_exactly_once(s3, out, f"o/{BIG}/", BIG_ROWS)


@pytest.fixture(scope="module")
def pg() -> Iterator[PostgresServer]:
    bindir = server_bindir()
    if bindir is None:
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) not found: pg_config --bindir, /usr/lib/postgresql")
    server = PostgresServer(bindir)
    try:
        server.start()
    except (RuntimeError, KeyError) as err:  # KeyError: no postgres user to run it as root
        server.remove()
        pytest.skip(f"cannot start a PostgreSQL server here: {err}")
    try:
        yield server
    finally:
        server.remove()


@pytest.fixture
async def pg_worker(stack: Stack, pg: PostgresServer, task_queue: str) -> AsyncIterator[Worker]:
    """An in-process worker whose settings know connection ``test``."""
    plain = await Client.connect(stack.config.temporal_address)
    settings = Settings.explicit(postgres_dsns={"test": pg.dsn})
    plugin = S3BatchPlugin(make_client(), settings=settings, register_search_attributes=False)
    async with Worker(plain, task_queue=task_queue, plugins=[plugin], max_concurrent_activities=4) as w:
        yield w


def _rows_csv(first: int, count: int) -> bytes:
    return ("id,name,note\n" + "".join(f"{i},n{i},\n" for i in range(first, first + count))).encode()


async def test_a_handed_over_file_into_postgres_resumes_from_the_checkpoint_in_the_database(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, pg: PostgresServer, pg_worker: Worker
) -> None:
    # The PostgreSQL sink keeps its checkpoint in the database, beside the rows: the next run's
    # activity (no heartbeat, no parts on S3) must find it there, and write no row twice.
    src, out = buckets
    table = f"items_{uuid.uuid4().hex[:8]}"
    pg.execute(f"CREATE TABLE public.{table} (id integer PRIMARY KEY, name text NOT NULL, note text)")
    files = {BIG: _rows_csv(0, BIG_ROWS)}
    files.update({key: _rows_csv(100_000 + i * SMALL_ROWS, SMALL_ROWS) for i, key in enumerate(SMALLS)})
    put_files(s3, src, files)
    sink = {"type": "postgres", "connection": "test", "table": f"public.{table}"}
    handle = await _start(client, task_queue, src, out, "strag-pg", job=_spec(src, out, sink=sink))
    result = await handle.result()
    assert result.status == "succeeded" and result.totals.files_succeeded == 1 + len(SMALLS)
    total = BIG_ROWS + SMALL_ROWS * len(SMALLS)
    assert result.totals.records_written == total
    ids = [int(r[0]) for r in pg.execute(f"SELECT id FROM public.{table} ORDER BY id")]  # type: ignore[call-overload]
    assert ids == [*range(BIG_ROWS), *range(100_000, 100_000 + SMALL_ROWS * len(SMALLS))], "each row exactly once"
    runs = await runs_of(client, handle)
    legs = [i for i, ev in enumerate(runs) for key in (activity_summaries(client, ev)).values() if key == BIG]
    assert len(set(legs)) >= 2, f"the big file ran in one run only: {legs}"
    big = _check_report_books(report(s3, out))[BIG]
    assert big["resumed_from_record"] > 0 and big["records_written"] == BIG_ROWS, big


def _ref(key: str) -> ObjectRef:
    return ObjectRef(key=key, etag="e", size=10)


def _stopped(key: str, chunks: int) -> FileResult:
    return FileResult(key=key, etag="e", status="cancelled", chunks=chunks)


def test_a_file_whose_leg_commits_no_chunk_is_not_handed_over_again() -> None:
    st = JobState()
    books = Books(st)
    big, small = _ref("big"), _ref("small")
    st.totals.files_listed = 2
    books.in_flight = {"big": big, "small": small}
    assert books.may_hand_over()
    done = FileResult(key="small", etag="e", status="succeeded", records=3, records_written=3)
    books.hand_over([big, small], [_stopped("big", 4), done], "src")
    # The big file waits at the front of the next run's files; the small one is recorded once.
    assert [o.key for o in st.pending] == ["big"] and st.handed_over == {"big": 4} and st.kept is None
    assert [r.key for r in books.results] == ["small"] and st.totals.files_succeeded == 1
    # A second leg that committed chunks: handed over again.
    st.pending.clear()
    books.in_flight = {"big": big}
    books.hand_over([big], [_stopped("big", 9)], "src")
    assert st.handed_over == {"big": 9} and st.kept is None
    # A leg that committed nothing (stopped before its first chunk): the file is kept to its end.
    st.pending.clear()
    books.hand_over([big], [_stopped("big", 9)], "src")
    assert st.kept == ["big"]
    books.in_flight = {"big": big}
    assert not books.may_hand_over()
    # Its result, once it comes, is recorded once and clears the hand-over state.
    st.pending.clear()
    books.record(FileResult(key="big", etag="e", status="succeeded"))
    books.in_flight = {}
    books.check()
    assert st.handed_over is None and st.kept is None
    assert st.model_dump(mode="json").keys().isdisjoint({"handed_over", "kept"}), "left out of the state when unset"


def test_a_file_handed_over_in_splits_runs_in_the_same_splits_until_its_result_or_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import logging
    import types

    import s3batch.workflows.splits as splits
    from s3batch.workflows.splits import process_whole, split_count

    monkeypatch.setattr(splits, "workflow", types.SimpleNamespace(logger=logging.getLogger("test")))  # no workflow here

    from s3batch.models import S3BatchInput

    st = JobState()
    books = Books(st)
    spec = S3BatchInput(bucket="src", output_bucket="out", split_bytes=100_000)
    big = ObjectRef(key="big.csv", etag="e", size=1_000_000)
    assert split_count(spec, st, big, 3) == 3
    st.totals.files_listed = 1
    books.in_flight = {"big.csv": big}
    books.hand_over([big], [_stopped("big.csv", 5)], "src", splits=3)
    assert st.split_counts == {"big.csv": 3} and [o.key for o in st.pending] == ["big.csv"]
    # The next run starts the same three splits, whatever slots are free (each resumes from its checkpoint).
    assert split_count(spec, st, big, 8) == 3 and split_count(spec, st, big, 1) == 3
    # Found not splittable there: processed whole from then on.
    process_whole(st, big)
    assert st.split_counts is None and split_count(spec, st, big, 8) == 1
    # Handed over again, then its result: the state forgets it.
    st.whole = None
    st.pending.clear()
    books.hand_over([big], [_stopped("big.csv", 9)], "src", splits=2)
    assert st.split_counts == {"big.csv": 2}
    st.pending.clear()
    books.record(FileResult(key="big.csv", etag="e", status="succeeded", splits=2))
    books.in_flight = {}
    books.check()
    assert st.split_counts is None and "split_counts" not in st.model_dump(mode="json")


def _timed_out() -> ActivityError:
    err = ActivityError(
        "activity Heartbeat timeout", scheduled_event_id=5, started_event_id=6, identity="w", activity_type="t",
        activity_id="1", retry_state=RetryState.TIMEOUT,
    )
    err.__cause__ = TimeoutError("activity Heartbeat timeout", type=TimeoutType.HEARTBEAT, last_heartbeat_details=[])
    return err


def test_a_file_whose_worker_is_lost_during_a_hand_over_is_handed_over_not_failed() -> None:
    # The server retries no activity it was asked to cancel: when the file's worker died, the stop
    # ends in a heartbeat timeout. The file did not fail: the next run resumes it (SIGKILL test in
    # tests/test_faults.py, continue-as-new due).
    books = Books(JobState())
    big = _ref("big")
    [stopped] = books.failed([big], _timed_out(), 10, stopped=True, handing_over=True)
    assert stopped.status == "cancelled"
    # Outside a hand-over a timeout that ran out of attempts is a failure, as before.
    [failed] = books.failed([big], _timed_out(), 10, stopped=False, handing_over=False)
    assert failed.status == "failed"


def _failed_as_stopped(*, non_retryable: bool) -> ActivityError:
    err = ActivityError(
        "activity error", scheduled_event_id=5, started_event_id=6, identity="w", activity_type="t",
        activity_id="1", retry_state=RetryState.CANCEL_REQUESTED,
    )
    err.__cause__ = ApplicationError("handler raised RuntimeError", type="HandlerError", non_retryable=non_retryable)
    return err


def test_an_attempt_that_fails_as_a_hand_over_stops_it_is_stopped_not_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    # The server retries no activity it was asked to cancel: an attempt failing meanwhile ends it (retry state
    # CANCEL_REQUESTED). A hand-over hands it over, a job's cancel reports it cancelled (its committed output read
    # back: the patch stopped-attempt, found by the soak); failed for good, it is failed as before.
    import types

    import s3batch.workflows.books as books_module

    monkeypatch.setattr(books_module, "workflow", types.SimpleNamespace(patched=lambda _patch: True))  # no workflow
    books = Books(JobState())
    big = _ref("big")
    [stopped] = books.failed([big], _failed_as_stopped(non_retryable=False), 10, stopped=True, handing_over=True)
    assert stopped.status == "cancelled"
    [failed] = books.failed([big], _failed_as_stopped(non_retryable=True), 10, stopped=True, handing_over=True)
    assert failed.status == "failed"
    [stopped] = books.failed([big], _failed_as_stopped(non_retryable=False), 10, stopped=True, handing_over=False)
    assert stopped.status == "cancelled"
    [failed] = books.failed([big], _failed_as_stopped(non_retryable=True), 10, stopped=True, handing_over=False)
    assert failed.status == "failed"


def test_a_job_stopped_with_a_handed_over_file_pending_reports_it_cancelled() -> None:
    st = JobState(pending=[_ref("big"), _ref("never")], handed_over={"big": 2})
    st.totals.files_listed = 2
    books = Books(st)
    books.close_pending()
    assert [(r.key, r.status) for r in books.results] == [("big", "cancelled"), ("never", "not_started")]
    books.check()


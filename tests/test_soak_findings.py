"""What the soak found (issue 34: ``make soak``, ``scripts/soak``), each pinned by a small deterministic test.

1. A short activity (the job's check, a listing page, a report segment, the report, an incremental job's ledger)
   running on a worker that died held its job for its whole 5-minute start-to-close timeout: nothing noticed the
   worker was gone (seed 1: a job stuck in ``check_job`` 5 minutes after a SIGKILL). They now heartbeat while
   they run (``activities/boundary.keep_alive``), given the job's heartbeat timeout (patch
   ``short-activities-heartbeat``).
2. An incremental run whose ledger PUT landed but whose answer was lost (a connection reset) failed: botocore
   sent the conditional PUT again, it found the ledger that very write had made (412), and the run failed with
   ``SourceChanged`` although its report said ``succeeded`` and the ledger had recorded it (seed 1, a proxy
   resetting PUTs). The run now sees that the ledger is its own.
3. ``s3batch redrive`` (``client.prepare_redrive``) of a job over a manifest crashed with pydantic's
   ``ValidationError`` (the redrive's input, ``only_failed_of`` with a ``manifest``, is refused by the contract): a
   cancelled manifest job of the soak could not be redriven. It now says that a manifest job is not redriven and
   what to do instead (``NothingToRedrive``, exit 3, as a redrive of its rejected records already did).
4. A file in flight when its job was cancelled, whose attempt then failed for a reason a retry may pass or timed out
   (S3 down, its worker killed or frozen), was reported wrong though its output was committed: the files of a group
   ``not_started`` (put back to run one by one, then never started), a file alone or in splits ``failed`` with no
   counts (seed 2: a cancelled Parquet job's 4 files ``not_started`` with 7,762 records in their parts; a file in
   splits ``failed``, 0 written, 16,947 in its parts). They are now ``cancelled``, their committed output read back
   into the report (patch ``stopped-attempt``), as a cancel that finds a file waiting for a retry reports it. Pinned
   with stub activities under the real workflow (each shape, each way of being cut short).
5. A file that failed after committing part of its output (its source overwritten between two attempts, deleted,
   its attempts used up) was reported with 0 records written (seed 67: an incremental run's file ``failed``, 0
   written, 32 records in its part): the report understated its job's output. The report now reads a failed file's
   committed output back, as it does a cancelled one's (this run's files, and those of earlier runs in the report's
   segments).
6. The redrive of a cancelled job reported a file in splits with 38,416 records written and 5,458 already written
   (seed 1205, a file of 43,874 records): the split that had ended in the cancelled job counted as found done by an
   earlier job, the others (resumed from their checkpoints) with their counts so far. A file is found done only when
   every split is; otherwise all of its records count as written, as for a file resumed whole.
7. A big CSV in splits, one of which began inside a quoted record (a line break in a field at its boundary), in a
   job cancelled while its splits ran (seed 67, the 2-minute soak in CI): the file was reported ``failed`` with
   its splits' output counted, a fragment of a record rejected among it (line 6123, 2 fields) and records read
   two ways (the 60-minute soak, seed 60512: records written twice). Not a failure of the file: it is now
   ``cancelled``, ``split_void``, and what its splits wrote is removed with the report (a redrive processes it
   whole). A file put back to run whole after its splits failed at a boundary and stopped there is so too.
8. A cancelled file's rejects files held more rejects than its report counted (seed 1205: 16 against 11 in a
   table import; 1 against 0 in S3 parts): the rejects file of a chunk is written before the chunk commits (in
   the table's transaction, before the part that commits it), and an attempt cut short between the two left it.
   The report now removes what lies past a stopped file's committed checkpoint, so its folder holds exactly
   what its entry counts.
9. A worker frozen (SIGSTOP) past its heartbeat timeout while its job was cancelled wrote a part when it woke, after
   the job had ended and its report counted the file's output (seed 67 in CI: the job ended 1.5 s before SIGCONT):
   a cancelled job's output held more than its report. An attempt silent past its heartbeat timeout now stops
   before its next commit (``SilentAttempt``, retryable): the server has timed it out by then.
10. A big CSV in splits, one of which began inside a quoted record, whose splits were stopped (a cancel of the job,
    a sibling's failure) before the split in front of that boundary reached its end, where it would have found it:
    the file ended ``failed`` or ``cancelled`` with a fragment of a record among its rejects, one reject fewer than
    its report counted (the 60-minute soak, seed 60512, jobs 163 and 261). A stopped file whose splits did not all
    check their boundaries is now ``split_void`` too (a redrive processes it from its start; a hand-over is not:
    the next run resumes the splits, which check them). Its failure is that of the split that failed on its own
    (before: the first in order, which could be a sibling it stopped).
11. A job cancelled while its final report was being written ended ``cancelled`` with a report saying
    ``succeeded`` (seed 79 in CI): the cancel stopped the report activity and a ``cancelled`` report was written,
    then the first attempt, on a worker frozen meanwhile, woke and wrote its ``succeeded`` report over it. A job
    that has begun to close now closes with the status it began with, whatever cancel arrives meanwhile (patch
    ``final-report-stands``).
12. An attempt frozen before its first line ran (seed 60512: 18 s at its start)
    woke after the server had given its group to the next attempt and its job had ended, and wrote a rejects file
    past the report (its rejects files held 1,423 rejects, its report 1,000). An attempt's lease now starts when the
    server started it, so such an attempt is silent past its heartbeat timeout and writes nothing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from s3batch.activities.boundary import boundary
from s3batch.workflows.batch import S3BatchWorkflow
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment
from temporalio.worker import Worker

from s3batch import client as api
from s3batch import layout
from s3batch.checkpoint import CHECKPOINT_METADATA, Checkpoint
from s3batch.dev.faultproxy import FaultProxy, Rule
from s3batch.dev.stack import Stack
from s3batch.errors import SPLIT_BOUNDARY
from s3batch.handlers import HandlerResult, register
from s3batch.messages import (
    FileResult,
    FinalReportInput,
    JobCheck,
    ListObjectsInput,
    ListObjectsResult,
    ObjectRef,
    ProcessFileInput,
    ProcessGroupInput,
    Totals,
)
from s3batch.models import JobSpec, S3BatchInput
from tests.helpers import wait_for
from tests.helpers.data import make_csv, put_files
from tests.helpers.jobs import new_id
from tests.helpers.output import read_jsonl


def test_a_short_activity_heartbeats_while_it_runs_when_given_a_heartbeat_timeout() -> None:
    env = ActivityEnvironment()
    beats: list[tuple[Any, ...]] = []
    env.on_heartbeat = lambda *details: beats.append(details)

    @boundary(keepalive=True)
    def short() -> str:
        time.sleep(1.0)
        return "done"

    assert env.run(short) == "done"
    assert beats == [], "no heartbeat timeout, no heartbeat (a job started before the patch)"
    env.info = dataclasses.replace(env.info, heartbeat_timeout=timedelta(seconds=0.4))
    assert env.run(short) == "done"
    assert len(beats) >= 2, beats  # every 0.2 s (at least) for 1 s


async def test_a_check_whose_worker_was_killed_is_retried_after_the_heartbeat_timeout(
    stack: Stack, client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, workers: Any
) -> None:
    src, out = buckets
    s3.put_object(Bucket=src, Key="in/a.csv", Body=make_csv(10))
    with FaultProxy(stack.config.s3_port) as proxy:
        # The check's first request, the LIST of the source prefix, is held: the check is in flight, on worker a.
        held = proxy.add(Rule("delay", method="GET", path=rf"^/{src}\?.*list-type=2", times=1, delay=120))
        a = workers("a", AWS_ENDPOINT_URL_S3=proxy.url)
        spec = S3BatchInput(bucket=src, prefix="in/", output_bucket=out, output_prefix="o/",
                            heartbeat_timeout_seconds=3)
        handle = await client.start_workflow(S3BatchWorkflow.run, spec, id=new_id("killcheck"), task_queue=task_queue)
        await wait_for(lambda: held.fired == 1, 60, "the check's LIST held by the proxy")
        a.kill()
        killed = time.monotonic()
        workers("b")
        result = await asyncio.wait_for(handle.result(), 90)
    took = time.monotonic() - killed
    assert result.status == "succeeded"
    assert len(read_jsonl(s3, out, "o/in/a.csv/")) == 10
    # Before: the check stayed "started" on the dead worker for its 5-minute start-to-close timeout.
    assert took < 60, f"the job ended {took:.0f} s after its check's worker was killed"


async def test_an_incremental_run_whose_ledger_write_answer_was_lost_succeeds(
    stack: Stack, client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, workers: Any, tmp_path: Path
) -> None:
    src, out = buckets
    put_files(s3, src, {f"in/f{i}.jsonl": f'{{"v": {i}}}\n'.encode() for i in range(3)})
    spec = S3BatchInput.model_validate({"bucket": src, "prefix": "in/", "output_bucket": out, "output_prefix": "inc/",
                                        "incremental": {}})
    with FaultProxy(stack.config.s3_port) as proxy:
        # The ledger's PUT reaches S3, then its connection is reset before the answer: botocore sends it again.
        lost = proxy.add(Rule("reset", method="PUT", path=r"/inc/ledger/ledger\.json$", times=1))
        workers("a", AWS_ENDPOINT_URL_S3=proxy.url)
        first = new_id("ledger-lost")
        result = await client.execute_workflow(S3BatchWorkflow.run, spec, id=first, task_queue=task_queue)
        puts = [e.status for e in proxy.entries("PUT", r"/inc/ledger/ledger\.json$")]
        assert lost.fired == 1
        assert puts == [None, 412], puts  # the write, its answer lost; botocore's retry, refused by its own ledger
        assert result.status == "succeeded"  # before: failed with SourceChanged
        ledger = json.loads(s3.get_object(Bucket=out, Key="inc/ledger/ledger.json")["Body"].read())
        assert ledger["last_run"] == first
        next_id = new_id("ledger-next")
        again = await client.execute_workflow(S3BatchWorkflow.run, spec, id=next_id, task_queue=task_queue)
    assert again.totals.files_listed == 0, "the next run finds every file recorded"


async def test_a_manifest_job_is_not_redriven_and_says_so(
    client: Client, worker: Worker, s3: Any, buckets: tuple[str, str], task_queue: str
) -> None:
    src, out = buckets
    s3.put_object(Bucket=src, Key="in/a.csv", Body=make_csv(5))
    s3.put_object(Bucket=src, Key="lists/today.csv", Body=f"{src},in/a.csv\n{src},in/gone.csv\n".encode())
    spec = S3BatchInput.model_validate({"manifest": f"s3://{src}/lists/today.csv", "output_bucket": out,
                                        "output_prefix": "m/"})
    job_id = new_id("manifest-redrive")
    with pytest.raises(WorkflowFailureError):  # in/gone.csv failed (NotFound), over max_failed_files 0
        await client.execute_workflow(S3BatchWorkflow.run, spec, id=job_id, task_queue=task_queue)
    with pytest.raises(api.NothingToRedrive, match=r"took its files from the manifest s3://.*/lists/today\.csv"):
        await api.prepare_redrive(client, job_id)  # before: pydantic's ValidationError


class CutShort:
    """Stub activities (the workflow is the real one): a file (group, split) activity runs, heartbeating, until the
    cancel of its job reaches it; then its attempt fails for a reason a retry may pass (``fails``: S3 went away) or
    goes silent past its heartbeat timeout (``silent``: its worker frozen), as the soak's faults made them."""

    def __init__(self, how: str, sizes: dict[str, int]) -> None:
        self.how, self.sizes = how, sizes
        self.running = 0
        self.report: FinalReportInput | None = None

    @activity.defn(name="s3batch.check_job")
    async def check_job(self, job: JobSpec) -> JobCheck:
        return JobCheck(search_attributes=False)

    @activity.defn(name="s3batch.list_objects")
    async def list_objects(self, req: ListObjectsInput) -> ListObjectsResult:
        objects = [ObjectRef(key=k, etag=f"e-{k}", size=n) for k, n in self.sizes.items()]
        return ListObjectsResult(objects=objects, next_token=None)

    async def _run_until_cancelled(self, how: str | None = None) -> Any:
        """``how``: this activity's way of ending (``self.how`` by default; ``boundary``: ``SplitBoundary``)."""
        self.running += 1
        try:
            while True:
                activity.heartbeat()
                await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            if how == "boundary":
                raise ApplicationError("SplitBoundary: a record crosses the boundary", {SPLIT_BOUNDARY: True},
                                       type="SplitBoundary", non_retryable=True) from None
            if (how or self.how) == "fails":
                raise ApplicationError("stub: S3 went away", type="S3Error") from None  # retryable
            await asyncio.sleep(5)  # silent past the heartbeat timeout
            raise

    @activity.defn(name="s3batch.process_file")
    async def process_file(self, req: ProcessFileInput) -> FileResult:
        return await self._run_until_cancelled()  # type: ignore[no-any-return]

    @activity.defn(name="s3batch.process_group")
    async def process_group(self, req: ProcessGroupInput) -> list[FileResult]:
        return await self._run_until_cancelled()  # type: ignore[no-any-return]

    @activity.defn(name="s3batch.write_report")
    async def write_report(self, req: FinalReportInput) -> str:
        self.report = req
        return "_report.json"

    def activities(self) -> list[Any]:
        return [self.check_job, self.list_objects, self.process_file, self.process_group, self.write_report]


async def _stub_job(
    stack: Stack, task_queue: str, stubs: CutShort, job: dict[str, Any], name: str, *, cancel_at: int | None = None
) -> None:
    """Run ``job`` under the real workflow on ``stubs`` (heartbeats sent every 0.2 s) until it fails: cancelled
    once ``cancel_at`` of its activities run, or failing on its own without ``cancel_at``."""
    client = await Client.connect(stack.config.temporal_address, data_converter=pydantic_data_converter)
    async with Worker(client, task_queue=task_queue, workflows=[S3BatchWorkflow], activities=stubs.activities(),
                      max_heartbeat_throttle_interval=timedelta(milliseconds=200),
                      default_heartbeat_throttle_interval=timedelta(milliseconds=200)):
        handle = await client.start_workflow("S3BatchWorkflow", job, id=new_id(name), task_queue=task_queue)
        if cancel_at is not None:
            await wait_for(lambda: stubs.running == cancel_at, 30, f"{cancel_at} file activities running")
            await handle.cancel()
        with pytest.raises(WorkflowFailureError):
            await asyncio.wait_for(handle.result(), 60)


@pytest.mark.parametrize("how", ["fails", "silent"])
@pytest.mark.parametrize(("sizes", "running"), [({"a.csv": 10, "b.csv": 10}, 1), ({"a.csv": 10}, 1),
                                                ({"a.csv": 200_000}, 2)], ids=["group", "alone", "splits"])
async def test_files_cut_short_after_a_cancel_are_cancelled_not_failed_or_never_started(
    stack: Stack, task_queue: str, how: str, sizes: dict[str, int], running: int
) -> None:
    stubs = CutShort(how, sizes)
    job = {"bucket": "src-bucket", "prefix": "in/", "output_bucket": "out-bucket", "output_prefix": "o/",
           "group_max_bytes": 1_000, "split_bytes": 65_536, "max_concurrent_files": 2, "heartbeat_timeout_seconds": 2}
    await _stub_job(stack, task_queue, stubs, job, "cut", cancel_at=running)
    assert stubs.report is not None
    # Before: a group's files not_started (put back to run alone, then never started), a file alone or in splits
    # failed with no counts. Now cancelled: the report activity reads their committed output back.
    assert {f.key: f.status for f in stubs.report.files} == dict.fromkeys(sizes, "cancelled")
    if running > 1:
        [entry] = stubs.report.files
        assert entry.splits == running
        # Neither split reached its end, where it checks where the next began: their output is void (finding 10).
        assert entry.split_void and "processes it from its start" in (entry.error or ""), entry


async def test_a_file_that_failed_after_committing_parts_reports_them(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, workers: Any
) -> None:
    src, out = buckets
    put_files(s3, src, {"in/f0.csv": make_csv(2_000), "in/f1.csv": make_csv(10)})
    env = {"S3BATCH_TEST_HANDLER_DELAY": "0.1"}
    a = workers("a", **env)
    spec = S3BatchInput(bucket=src, prefix="in/", output_bucket=out, output_prefix="o/", handler="slow_passthrough",
                        chunk_records=100, heartbeat_timeout_seconds=3, max_concurrent_files=1, group_max_files=1,
                        max_failed_files=1)
    handle = await client.start_workflow("S3BatchWorkflow", args=[spec.model_dump(mode="json"), {"files_per_run": 1}],
                                         id=new_id("failed-parts"), task_queue=task_queue)
    await wait_for(lambda: len(read_jsonl(s3, out, "o/in/f0.csv/")) >= 300, 60, "3 committed parts of f0.csv")
    a.kill()
    s3.put_object(Bucket=src, Key="in/f0.csv", Body=make_csv(5))  # its next attempt finds it changed: SourceChanged
    workers("b", **env)
    await asyncio.wait_for(handle.result(), 120)
    report = json.loads(s3.get_object(Bucket=out, Key="o/_report.json")["Body"].read())
    f0 = next(f for f in report["files"] if f["key"] == "in/f0.csv")
    written = len(read_jsonl(s3, out, "o/in/f0.csv/"))
    assert f0["status"] == "failed" and f0["error"].startswith("SourceChanged"), f0
    # f0 failed in the job's first run (files_per_run 1): its entry comes from that run's report segment.
    assert f0["records_written"] == written >= 300, (f0, written)  # before: 0
    assert f0["records"] == written and f0["chunks"] == written // 100
    assert report["totals"]["records_written"] == written + 10


def _split(index: int, written: int, already: int | None) -> FileResult:
    counts = written if already is None else already
    return FileResult(key="big.csv", etag="e", status="succeeded", records=counts, records_written=written,
                      chunks=1, attempts=1, already_written=already)  # fmt: skip


@pytest.mark.parametrize(
    ("splits", "written", "already"),
    [
        ([(0, 5_458), (19_000, None), (19_416, None)], 43_874, None),  # some found done: all written (a redrive)
        ([(0, 5_458), (0, 19_000)], 0, 24_458),  # every split found done: the file was
        ([(5_458, None), (19_000, None)], 24_458, None),  # none: as before
    ],
)
def test_a_file_in_splits_is_found_done_only_when_every_split_is(
    splits: list[tuple[int, int | None]], written: int, already: int | None
) -> None:
    from s3batch.workflows.splits import merged

    spec = S3BatchInput(bucket="src", output_bucket="out", split_bytes=64 * 1024)
    results = [_split(i, w, a) for i, (w, a) in enumerate(splits)]
    result = merged(spec, ObjectRef(key="big.csv", etag="e", size=200_000), results)
    assert (result.records_written, result.already_written) == (written, already)
    assert result.records == sum(r.records for r in results) == result.records_written + (result.already_written or 0)


class SplitCutAtABoundary(CutShort):
    """A file in splits whose split 0 finds, once the cancel of its job has reached it, that its last record runs
    past its end (``SplitBoundary``: split 1 began inside a quoted record), as the soak's seed 67 made it."""

    @activity.defn(name="s3batch.process_file")
    async def process_file(self, req: ProcessFileInput) -> FileResult:
        first = req.split is not None and req.split.index == 0
        return await self._run_until_cancelled("boundary" if first else None)  # type: ignore[no-any-return]


async def test_a_file_that_could_not_be_split_in_a_cancelled_job_is_cancelled_and_its_split_output_void(
    stack: Stack, task_queue: str
) -> None:
    stubs = SplitCutAtABoundary("fails", {"big.csv": 200_000})
    job = {"bucket": "src-bucket", "prefix": "in/", "output_bucket": "out-bucket", "output_prefix": "o/",
           "split_bytes": 65_536, "max_concurrent_files": 2, "heartbeat_timeout_seconds": 2}
    await _stub_job(stack, task_queue, stubs, job, "void", cancel_at=2)
    assert stubs.report is not None
    [entry] = stubs.report.files
    # Before: failed (SplitBoundary), its splits' output counted.
    assert (entry.status, entry.split_void) == ("cancelled", True), entry
    assert "processes it whole" in (entry.error or "")
    assert stubs.report.totals.files_cancelled == 1 and stubs.report.totals.files_failed == 0


class SplitFailsAlone(CutShort):
    """A file in two splits whose split 1 fails on its own for good (``TooManyRejects``: it may have begun inside
    a quoted record and read a fragment) while split 0, not at its end yet, runs; split 0, asked to stop, fails its
    attempt then (S3 went away), as the soak's seed 60512 made it."""

    @activity.defn(name="s3batch.process_file")
    async def process_file(self, req: ProcessFileInput) -> FileResult:
        if req.split is None or req.split.index == 0:
            return await self._run_until_cancelled()  # type: ignore[no-any-return]
        self.running += 1
        while self.running < 2:
            activity.heartbeat()
            await asyncio.sleep(0.05)
        raise ApplicationError("stub: 3 of 4 records rejected", type="TooManyRejects", non_retryable=True)


async def test_a_file_whose_splits_stopped_before_checking_their_boundaries_is_void(
    stack: Stack, task_queue: str
) -> None:
    stubs = SplitFailsAlone("fails", {"big.csv": 100_000})
    job = {"bucket": "src-bucket", "prefix": "in/", "output_bucket": "out-bucket", "output_prefix": "o/",
           "split_bytes": 65_536, "max_concurrent_files": 2, "heartbeat_timeout_seconds": 2}
    await _stub_job(stack, task_queue, stubs, job, "unchecked")  # its only file failed
    assert stubs.report is not None
    [entry] = stubs.report.files
    # Before: failed with split 0's cut attempt as its error (the first in order), its splits' output kept and
    # counted, a fragment of a record among split 1's rejects.
    assert entry.status == "failed" and (entry.error or "").startswith("TooManyRejects: stub"), entry
    assert entry.split_void and "processes it from its start" in (entry.error or ""), entry


def test_a_stopped_file_whose_splits_checked_every_boundary_keeps_their_output() -> None:
    from s3batch.workflows.books import Books
    from s3batch.workflows.splits import Ended, split_outcome

    from s3batch.messages import JobState

    spec = S3BatchInput(bucket="src", output_bucket="out", split_bytes=64 * 1024)
    obj = ObjectRef(key="big.csv", etag="e", size=200_000)
    done = FileResult(key="big.csv", etag="e", status="succeeded", records=5, records_written=5, chunks=1, attempts=1)
    stopped = done.model_copy(update={"status": "cancelled", "records": 3, "records_written": 3})
    books = Books(JobState())
    # Split 0 reached its end, so it found split 1 began at a record: split 1's committed output stands.
    [kept] = split_outcome(books, spec, obj, Ended([done, stopped], None, checked=True), stopped=True) or []
    assert (kept.status, kept.split_void, kept.records) == ("cancelled", None, 8)
    [void] = split_outcome(books, spec, obj, Ended([stopped, stopped], None, checked=False), stopped=True) or []
    assert (void.status, void.split_void) == ("cancelled", True)
    # A hand-over: the next run resumes the same splits, which check their boundaries as they reach them.
    over = Ended([stopped, stopped], None, checked=False)
    [handed] = split_outcome(books, spec, obj, over, stopped=True, handing_over=True) or []
    assert handed.split_void is None


class ReportHeldUp(CutShort):
    """A job of no file whose report activity runs until the test lets it end (its worker frozen, for the job)."""

    def __init__(self) -> None:
        super().__init__("fails", {})
        self.statuses: list[str] = []
        self.release = asyncio.Event()

    @activity.defn(name="s3batch.write_report")
    async def write_report(self, req: FinalReportInput) -> str:
        self.statuses.append(req.status)
        if len(self.statuses) == 1:
            await self.release.wait()  # no heartbeat: a cancel of it is never seen here, as on a frozen worker
        return "_report.json"

    def activities(self) -> list[Any]:
        return [self.check_job, self.list_objects, self.write_report]


async def test_a_cancel_arriving_while_the_final_report_is_written_does_not_change_it(
    stack: Stack, task_queue: str
) -> None:
    client = await Client.connect(stack.config.temporal_address, data_converter=pydantic_data_converter)
    stubs = ReportHeldUp()
    job = {"bucket": "src-bucket", "prefix": "in/", "output_bucket": "out-bucket", "output_prefix": "o/"}
    async with Worker(client, task_queue=task_queue, workflows=[S3BatchWorkflow], activities=stubs.activities()):
        handle = await client.start_workflow("S3BatchWorkflow", job, id=new_id("closing"), task_queue=task_queue)
        await wait_for(lambda: stubs.statuses, 30, "the report being written")
        await handle.cancel()
        await wait_for(lambda: _cancel_seen(handle), 30, "the cancel reaching the job")
        stubs.release.set()
        result = await asyncio.wait_for(handle.result(), 60)
    # Before: a second report, cancelled, over which the first attempt then wrote succeeded; the job cancelled.
    assert stubs.statuses == ["succeeded"] and result["status"] == "succeeded", (stubs.statuses, result)


async def _cancel_seen(handle: Any) -> bool:
    """The job's workflow task that received the cancel request has completed."""
    kinds = [e.event_type async for e in handle.fetch_history_events()]
    requested = EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED
    return requested in kinds and EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED in kinds[kinds.index(requested):]


def _checkpointed(s3: Any, bucket: str, key: str, cp: Checkpoint, body: bytes = b"{}\n") -> None:
    s3.put_object(Bucket=bucket, Key=key, Body=body, Metadata={CHECKPOINT_METADATA: cp.model_dump_json()})


def test_a_stopped_files_folder_is_pruned_to_what_it_committed(s3: Any, buckets: tuple[str, str]) -> None:
    from s3batch.activities.committed import fill_cancelled

    _, out = buckets
    fp = "f" * 16

    def cp(chunk: int, records: int, rejected: int) -> Checkpoint:
        return Checkpoint(etag="e1", fingerprint=fp, chunk=chunk, next_record=records,
                          records_written=records - rejected, rejected=rejected)

    # a.csv: parts 0-1 and the rejects of chunk 1 committed; the rejects of chunk 2 (its part never written) and a
    # part after the gap are not.
    a = layout.file_dir("o/", "a.csv")
    _checkpointed(s3, out, a + layout.part_name(0), cp(1, 10, 0))
    _checkpointed(s3, out, a + layout.part_name(1), cp(2, 20, 1))
    _checkpointed(s3, out, a + layout.rejects_name(1), cp(2, 20, 1))
    _checkpointed(s3, out, a + layout.rejects_name(2), cp(3, 30, 3))
    _checkpointed(s3, out, a + layout.part_name(4), cp(5, 50, 3))
    # b.csv: split_void: its splits' parts and rejects go; the part it wrote whole since stays, and counts.
    b = layout.file_dir("o/", "b.csv")
    _checkpointed(s3, out, b + layout.part_name(0, split=0), cp(1, 10, 0))
    _checkpointed(s3, out, b + layout.part_name(0, split=1), cp(1, 10, 1))
    _checkpointed(s3, out, b + layout.rejects_name(0, split=1), cp(1, 10, 1))
    _checkpointed(s3, out, b + layout.part_name(0), cp(1, 7, 0))
    # c.csv: a file that succeeded is left as it is.
    c = layout.file_dir("o/", "c.csv")
    _checkpointed(s3, out, c + layout.rejects_name(9), cp(10, 10, 0))
    files = [
        FileResult(key="a.csv", etag="e1", status="cancelled"),
        FileResult(key="b.csv", etag="e1", status="cancelled", split_void=True),
        FileResult(key="c.csv", etag="e1", status="succeeded", records=5, records_written=5, chunks=1),
    ]
    totals = Totals(files_listed=3, files_cancelled=2, files_succeeded=1, records=5, records_written=5)
    filled, totals = fill_cancelled(s3, out, "o/", files, totals, None)

    def names(folder: str) -> list[str]:
        return sorted(o["Key"][len(folder):] for o in s3.list_objects_v2(Bucket=out, Prefix=folder).get("Contents", []))

    assert names(a) == sorted([layout.part_name(0), layout.part_name(1), layout.rejects_name(1)])
    assert names(b) == [layout.part_name(0)]
    assert names(c) == [layout.rejects_name(9)]
    got = {f.key: (f.records, f.records_written, f.rejected, f.chunks) for f in filled}
    assert got == {"a.csv": (20, 19, 1, 2), "b.csv": (7, 7, 0, 1), "c.csv": (5, 5, 0, 1)}
    assert (totals.records, totals.records_written, totals.rejected) == (32, 31, 1)


class Freezing:
    """A passthrough handler that, at record ``at``, stops the attempt's thread for ``seconds`` (no heartbeat
    meanwhile: as a SIGSTOP of its worker does), then goes on."""

    def __init__(self, at: int, seconds: float) -> None:
        self.name, self.at, self.seconds = f"freezing-{new_id('h')}", at, seconds
        self.seen = 0
        register(self.name, self, replace=True)

    def __call__(self, records: Any) -> HandlerResult:
        if self.seen < self.at <= self.seen + len(records):
            time.sleep(self.seconds)
        self.seen += len(records)
        return HandlerResult([r.value for r in records], [])


def test_an_attempt_silent_past_its_heartbeat_timeout_commits_nothing_more(s3: Any, buckets: tuple[str, str]) -> None:
    from s3batch.activities.s3_activities import S3Activities

    src, out = buckets
    body = make_csv(1_000)
    s3.put_object(Bucket=src, Key="in/f.csv", Body=body)
    head = s3.head_object(Bucket=src, Key="in/f.csv")
    obj = ObjectRef(key="in/f.csv", etag=head["ETag"].strip('"'), size=head["ContentLength"])
    frozen = Freezing(at=450, seconds=1.5)  # in the second chunk (records 301-600)
    req = ProcessFileInput(job_id="job-z", bucket=src, obj=obj, output_bucket=out, output_prefix="o/",
                           handler=frozen.name, chunk_records=300, format="auto", max_record_bytes=1 << 20)
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, heartbeat_timeout=timedelta(seconds=1))
    with pytest.raises(ApplicationError) as raised:
        env.run(S3Activities(s3).process_file, req)
    assert raised.value.type == "SilentAttempt", raised.value
    assert "past its heartbeat timeout" in str(raised.value)
    parts = [o["Key"] for o in s3.list_objects_v2(Bucket=out, Prefix="o/in/f.csv/part-").get("Contents", [])]
    assert len(parts) == 1, f"the frozen chunk was committed after the freeze: {parts}"  # before: 2 or more


def test_an_attempt_frozen_before_it_began_commits_nothing(s3: Any, buckets: tuple[str, str]) -> None:
    """Finding 12: the server started the attempt 18 s before the worker ran its first line (frozen at its start):
    past its heartbeat timeout it writes no part and no rejects file, though it never heartbeated late itself."""
    from s3batch.activities.s3_activities import S3Activities

    src, out = buckets
    s3.put_object(Bucket=src, Key="in/r.csv", Body=make_csv(500) + b"1,2,3,4,5\n" * 400)  # rejects in chunk 2
    head = s3.head_object(Bucket=src, Key="in/r.csv")
    obj = ObjectRef(key="in/r.csv", etag=head["ETag"].strip('"'), size=head["ContentLength"])
    req = ProcessFileInput(job_id="job-f", bucket=src, obj=obj, output_bucket=out, output_prefix="o/",
                           handler="passthrough", chunk_records=300, format="auto", max_record_bytes=1 << 20)
    env = ActivityEnvironment()
    started = datetime.now(UTC) - timedelta(seconds=18)
    env.info = dataclasses.replace(env.info, heartbeat_timeout=timedelta(seconds=10), started_time=started)
    with pytest.raises(ApplicationError) as raised:
        env.run(S3Activities(s3).process_file, req)
    assert raised.value.type == "SilentAttempt", raised.value  # before: the file processed, its rejects written
    assert s3.list_objects_v2(Bucket=out, Prefix="o/in/r.csv/").get("KeyCount") == 0

    # An attempt started 2 s before it ran (a busy worker) is not silent: it processes the file.
    env.info = dataclasses.replace(env.info, started_time=datetime.now(UTC) - timedelta(seconds=2))
    result = env.run(S3Activities(s3).process_file, req)
    assert (result.status, result.records, result.rejected) == ("succeeded", 900, 400), result

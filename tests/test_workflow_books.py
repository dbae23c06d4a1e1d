"""The workflow's books, searched for counterexamples: the real ``S3BatchWorkflow`` on the real dev
server, with stub activities whose outcomes and delays are drawn at random (seeded).

Whatever happens (files and groups failing, big files in splits that fail or are cancelled, slow
listings, pauses, concurrency changes, cancellation, continue-as-new every few files), the job's report
must list every listed key exactly once, with the outcome the stubs decided, and the workflow must never
fail a task. The stubs stand in for S3
only: the workflow under test, its retries, timers and updates are the real ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from s3batch.workflows.batch import S3BatchWorkflow
from temporalio import activity
from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker

from s3batch.client.control import update_when_ready
from s3batch.dev.stack import Stack
from s3batch.errors import ACCOUNTING_ERROR
from s3batch.messages import (
    FileResult,
    FinalReportInput,
    JobCheck,
    ListObjectsInput,
    ListObjectsResult,
    ObjectRef,
    ProcessFileInput,
    ProcessGroupInput,
    ReportSegmentInput,
)
from s3batch.models import JobSpec
from tests.helpers.books import report_problems
from tests.helpers.history import history_events
from tests.helpers.workers import record_reliability

SMALL = 100
"""Size of a stub object that is grouped (the jobs below group objects under 1,000 bytes)."""
BIG = 200_000
"""Size of a stub object over the jobs' ``split_bytes``: processed in splits, one per free slot."""
MID = 100_000
"""Size of a stub object in two splits: with a slot left over, a full run may hand it over (its splits)."""


@dataclass
class Scenario:
    """What the stubs do for one job, drawn from a seed."""

    seed: int
    keys: list[str]
    pages: list[list[str]]
    sizes: dict[str, int]
    failing: set[str]
    """Files whose own activity fails for good."""
    group_failures: float
    """Chance that a group activity fails as a whole (the workflow then retries its files alone)."""
    list_delay: tuple[float, float]
    file_delay: tuple[float, float]
    files_per_run: int
    page_delay: dict[int, float] = field(default_factory=dict)
    """Extra seconds before the answer for some listing pages."""
    rng: random.Random = field(repr=False, default_factory=lambda: random.Random(0))

    @classmethod
    def draw(cls, seed: int) -> Scenario:
        rng = random.Random(seed)
        n = rng.randint(1, 30)
        keys = [f"in/{i:03d}-{rng.randrange(10**6):06d}.csv" for i in range(n)]
        keys.sort()
        pages: list[list[str]] = []
        rest = list(keys)
        while rest:
            size = rng.randint(1, 8)
            pages.append(rest[:size])
            rest = rest[size:]
        return cls(
            seed=seed,
            keys=keys,
            pages=pages,
            sizes={k: rng.choice([SMALL, SMALL, 5_000, BIG, MID]) for k in keys},
            failing={k for k in keys if rng.random() < 0.2},
            group_failures=rng.choice([0.0, 0.3, 0.7]),
            list_delay=(0.0, rng.choice([0.05, 0.5, 1.5])),
            file_delay=(0.0, rng.choice([0.05, 0.3, 1.0, 2.0])),
            files_per_run=rng.randint(2, 12),
            rng=random.Random(seed * 7919 + 1),
        )


class Stubs:
    """Stub activities under s3batch's activity names, keyed by output prefix (one job each)."""

    def __init__(self) -> None:
        self.scenarios: dict[str, Scenario] = {}
        self.segments: dict[tuple[str, int], list[FileResult]] = {}
        self.reports: dict[str, dict[str, Any]] = {}
        self.misbehave: dict[str, str] = {}
        """output prefix -> how the group stub breaks its contract ("drop" or "foreign")."""

    def _scenario(self, prefix: str) -> Scenario:
        return self.scenarios[prefix]

    async def _sleep(self, sc: Scenario, bounds: tuple[float, float]) -> None:
        delay = sc.rng.uniform(*bounds)
        end = asyncio.get_running_loop().time() + delay
        while True:
            activity.heartbeat()
            left = end - asyncio.get_running_loop().time()
            if left <= 0:
                return
            await asyncio.sleep(min(left, 0.05))

    @activity.defn(name="s3batch.check_job")
    async def check_job(self, job: JobSpec) -> JobCheck:
        return JobCheck(search_attributes=False)

    @activity.defn(name="s3batch.list_objects")
    async def list_objects(self, req: ListObjectsInput) -> ListObjectsResult:
        sc = self._scenario(req.prefix)
        await self._sleep(sc, sc.list_delay)
        page = int(req.continuation_token or 0)
        await asyncio.sleep(sc.page_delay.get(page, 0.0))
        keys = sc.pages[page] if sc.pages else []
        objects = [ObjectRef(key=k, etag=f"e-{k}", size=sc.sizes[k]) for k in keys]
        return ListObjectsResult(objects=objects, next_token=str(page + 1) if page + 1 < len(sc.pages) else None)

    def _result(self, sc: Scenario, req: ProcessFileInput) -> FileResult:
        key = req.obj.key
        if key in sc.failing:
            raise ApplicationError(f"stub: {key} is a bad file", type="BadFile", non_retryable=True)
        # A file's records, once: a file in splits has them in its first split.
        records = 3 if req.split is None or req.split.index == 0 else 0
        return FileResult(key=key, etag=req.obj.etag, status="succeeded", records=records, records_written=records)

    @activity.defn(name="s3batch.process_file")
    async def process_file(self, req: ProcessFileInput) -> FileResult:
        sc = self._scenario(req.output_prefix)
        await self._sleep(sc, sc.file_delay)
        return self._result(sc, req)

    @activity.defn(name="s3batch.process_group")
    async def process_group(self, req: ProcessGroupInput) -> list[FileResult]:
        prefix = req.file.output_prefix
        sc = self._scenario(prefix)
        if sc.rng.random() < sc.group_failures:
            await self._sleep(sc, sc.file_delay)
            raise ApplicationError("stub: the whole group fails", type="BadFile", non_retryable=True)
        results: list[FileResult] = []
        items = req.items()
        try:
            for item in items:
                await self._sleep(sc, (sc.file_delay[0] / 4, sc.file_delay[1] / 4))
                try:
                    results.append(self._result(sc, item))
                except ApplicationError as err:
                    results.append(
                        FileResult(key=item.obj.key, etag=item.obj.etag, status="failed", error=err.message)
                    )
        except asyncio.CancelledError:
            # As the real group activity does: finished files keep their outcome, the rest are cancelled.
            done = {r.key for r in results}
            results.extend(
                FileResult(key=i.obj.key, etag=i.obj.etag, status="cancelled", error="stub: cancelled")
                for i in items
                if i.obj.key not in done
            )
            return results
        how = self.misbehave.get(prefix)
        if how == "drop":
            results.pop()
        elif how == "foreign":
            results[-1] = results[-1].model_copy(update={"key": "someone/else.csv"})
        return results

    @activity.defn(name="s3batch.write_report_segment")
    async def write_report_segment(self, req: ReportSegmentInput) -> str:
        self.segments[(req.output_prefix, req.segment)] = list(req.files)
        return f"{req.output_prefix}_s3batch/report-{req.segment:05d}.jsonl"

    @activity.defn(name="s3batch.write_report")
    async def write_report(self, req: FinalReportInput) -> str:
        prefix = req.job.output_prefix
        files = [f for s in range(req.segments) for f in self.segments[(prefix, s)]] + list(req.files)
        dumped = [f.model_dump(mode="json") for f in files]
        self.reports[prefix] = {"status": req.status, "totals": req.totals, "files": files, "input": req}
        problems = report_problems(dumped, req.totals.model_dump(), req.listed_digest)
        if problems:
            raise ApplicationError("; ".join(problems), type=ACCOUNTING_ERROR, non_retryable=True)
        return f"{prefix}_report.json"

    def activities(self) -> list[Any]:
        return [
            self.check_job,
            self.list_objects,
            self.process_file,
            self.process_group,
            self.write_report_segment,
            self.write_report,
        ]


@pytest.fixture
async def stub_env(stack: Stack, task_queue: str) -> AsyncIterator[tuple[Client, Stubs]]:
    # A client without S3BatchPlugin: the plugin would register the real activities on the worker.
    client = await Client.connect(stack.config.temporal_address, data_converter=pydantic_data_converter)
    stubs = Stubs()
    async with Worker(
        client,
        task_queue=task_queue,
        workflows=[S3BatchWorkflow],
        activities=stubs.activities(),
        max_concurrent_activities=200,
        # Cancellation reaches an activity with a heartbeat response: let them through quickly.
        max_heartbeat_throttle_interval=timedelta(milliseconds=200),
        default_heartbeat_throttle_interval=timedelta(milliseconds=200),
    ):
        yield client, stubs


def _job(sc: Scenario, prefix: str, **kw: Any) -> dict[str, Any]:
    return {
        "bucket": "src-bucket",
        "prefix": prefix,
        "output_bucket": "out-bucket",
        "output_prefix": prefix,  # the stubs key their state by it; the buckets differ
        "max_concurrent_files": sc.rng.randint(1, 6),
        "group_max_files": sc.rng.choice([1, 3, 10]),
        "group_max_bytes": 1_000,
        "split_bytes": 65_536,
        "heartbeat_timeout_seconds": 5,
        "max_attempts": 2,
        "max_failed_files": 10_000,
        **kw,
    }


async def _start(
    client: Client, stubs: Stubs, sc: Scenario, task_queue: str, misbehave: str | None = None, **job: Any
) -> WorkflowHandle[Any, Any]:
    prefix = f"p{sc.seed}-{uuid.uuid4().hex[:6]}/"
    stubs.scenarios[prefix] = sc
    if misbehave:
        stubs.misbehave[prefix] = misbehave
    return await client.start_workflow(
        "S3BatchWorkflow",
        args=[_job(sc, prefix, **job), {"files_per_run": sc.files_per_run}],
        id=f"books-{prefix.rstrip('/')}",
        task_queue=task_queue,
    )


async def _update(handle: WorkflowHandle[Any, Any], name: str, *args: Any) -> bool:
    """Run an update; False when the job has ended meanwhile (an update then fails: that is fine)."""
    try:
        await update_when_ready(handle, name, list(args), dict)
    except Exception as err:
        if (await handle.describe()).status.name == "RUNNING":
            events = await history_events(handle._client, handle.id)
            failed = [e for e in events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED]
            raise AssertionError(
                f"update {name} failed on running job {handle.id}: {err!r}; "
                f"{failed[-1] if failed else 'no task failed'}; last events: {[e.event_type for e in events[-6:]]}"
            ) from err
        return False
    return True


async def _drive(handle: WorkflowHandle[Any, Any], sc: Scenario) -> bool:
    """Send updates at random moments; maybe cancel. Returns whether the job was cancelled."""
    rng = random.Random(sc.seed * 31 + 7)
    paused = False
    for _ in range(rng.randint(0, 6)):
        await asyncio.sleep(rng.uniform(0, 0.6))
        action = rng.choice(["pause", "resume", "concurrency", "cancel", "nothing"])
        if action == "pause":
            paused = True
            if not await _update(handle, "pause"):
                return False
        elif action == "resume":
            paused = False
            if not await _update(handle, "resume"):
                return False
        elif action == "concurrency":
            if not await _update(handle, "set_concurrency", rng.randint(1, 8)):
                return False
        elif action == "cancel" and rng.random() < 0.3:
            if (await handle.describe()).status.name != "RUNNING":
                return False
            await handle.cancel()
            return True
    if paused:
        await _update(handle, "resume")
    return False


async def _run_scenario(client: Client, stubs: Stubs, task_queue: str, seed: int) -> tuple[int, int, bool]:
    """Run one seeded job and check its books; returns (keys listed, keys reported, cancelled)."""
    sc = Scenario.draw(seed)
    handle = await _start(client, stubs, sc, task_queue)
    cancelled = await _drive(handle, sc)
    with contextlib.suppress(WorkflowFailureError):
        await asyncio.wait_for(handle.result(), timeout=120)
    desc = await handle.describe()
    events = await history_events(client, handle.id)
    # UnhandledCommand is the server's own retry when an event (an update, an activity result)
    # arrives while the workflow completes; anything else is a bug (non-determinism, a crash).
    bad_tasks = [
        e
        for e in events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
        and e.workflow_task_failed_event_attributes.cause
        != WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_UNHANDLED_COMMAND
    ]
    assert not bad_tasks, f"seed {seed}: workflow task failed: {bad_tasks[0]}"
    prefix = next(p for p, s in stubs.scenarios.items() if s is sc)
    rep = stubs.reports.get(prefix)
    assert rep is not None, f"seed {seed}: no report written (job {desc.status.name})"
    keys = [f.key for f in rep["files"]]
    assert len(keys) == len(set(keys)), f"seed {seed}: a key is reported twice: {sorted(keys)}"
    totals = rep["totals"]
    if rep["status"] == "cancelled":
        assert cancelled, f"seed {seed}: cancelled without being asked"
        # Every listed key once; the listed keys are the first pages, in order.
        assert sorted(keys) == sc.keys[: len(keys)], f"seed {seed}: report {sorted(keys)} vs listing {sc.keys}"
        assert totals.files_listed == len(keys)
        for f in rep["files"]:
            if f.status == "succeeded":
                assert f.key not in sc.failing
            if f.status == "failed":
                assert f.key in sc.failing
    else:
        assert desc.status.name == "COMPLETED", f"seed {seed}: {desc.status.name}"
        assert sorted(keys) == sc.keys, f"seed {seed}: report {sorted(keys)} vs listing {sc.keys}"
        status = {f.key: f.status for f in rep["files"]}
        assert status == {k: "failed" if k in sc.failing else "succeeded" for k in sc.keys}, f"seed {seed}"
        assert totals.files_succeeded == len(sc.keys) - len(sc.failing)
        assert totals.files_failed == len(sc.failing)
    for f in rep["files"]:
        # A file's 3 records are written once it succeeds; a file in splits that is cancelled may have
        # committed its first split (its records) before the others were cancelled.
        may_write = {"succeeded": {3}, "cancelled": {0, 3} if sc.sizes[f.key] >= MID else {0}}
        assert f.records_written in may_write.get(f.status, {0}), f"seed {seed}: {f}"
    assert totals.records_written == sum(f.records_written for f in rep["files"]), f"seed {seed}"
    return totals.files_listed, len(keys), rep["status"] == "cancelled"


@pytest.mark.parametrize("batch", range(4))
async def test_random_interleavings_keep_the_books(
    stub_env: tuple[Client, Stubs], task_queue: str, batch: int, request: pytest.FixtureRequest
):
    client, stubs = stub_env
    seeds = range(batch * 10, batch * 10 + 10)
    runs = await asyncio.gather(*(_run_scenario(client, stubs, task_queue, seed) for seed in seeds))
    listed = sum(r[0] for r in runs)
    record_reliability(
        {
            "fault": f"Random interleavings, seeds {seeds[0]}-{seeds[-1]}: failing files and groups, slow listings, "
            "pause/resume/set_concurrency/cancel at random moments, continue-as-new every few files (stub S3)",
            "test": request.node.nodeid,
            "records_in": listed,
            "records_out": sum(r[1] for r in runs),
            "lost": listed - sum(r[1] for r in runs),  # a report holds each listed key once (asserted)
            "duplicates": 0,
            "notes": f"counted in files, not records; {len(runs)} jobs, {sum(r[2] for r in runs)} cancelled; "
            "every listed key exactly once in each report",
        }
    )


async def test_a_failed_group_is_not_dropped_while_the_next_page_is_listed(
    stub_env: tuple[Client, Stubs], task_queue: str
):
    """Defect: page 1 is one group of three small files that fails; page 2 takes long to list. The
    group's files went back to ``pending``, and the listing's answer replaced ``pending``."""
    client, stubs = stub_env
    keys = ["in/a.csv", "in/b.csv", "in/c.csv", "in/d.csv"]
    sc = Scenario(
        seed=-1,
        keys=keys,
        pages=[keys[:3], keys[3:]],
        sizes=dict.fromkeys(keys, SMALL),
        failing=set(),
        group_failures=1.0,
        list_delay=(0.0, 0.0),
        file_delay=(0.0, 0.0),
        files_per_run=500,
        page_delay={1: 3.0},
    )
    handle = await _start(client, stubs, sc, task_queue, group_max_files=10, max_concurrent_files=4)
    result = await handle.result()
    rep = next(r for p, r in stubs.reports.items() if stubs.scenarios[p] is sc)
    assert sorted(f.key for f in rep["files"]) == keys
    assert {f.status for f in rep["files"]} == {"succeeded"}
    assert result["totals"]["files_succeeded"] == 4


async def test_a_group_result_missing_a_file_fails_the_job_loudly(stub_env: tuple[Client, Stubs], task_queue: str):
    client, stubs = stub_env
    for how in ("drop", "foreign"):
        keys = ["in/a.csv", "in/b.csv", "in/c.csv"]
        sc = Scenario(
            seed=-2,
            keys=keys,
            pages=[keys],
            sizes=dict.fromkeys(keys, SMALL),
            failing=set(),
            group_failures=0.0,
            list_delay=(0.0, 0.0),
            file_delay=(0.0, 0.0),
            files_per_run=500,
        )
        # One group of the three files, whatever the scenario's generator would have drawn.
        handle = await _start(client, stubs, sc, task_queue, misbehave=how, group_max_files=10)
        with pytest.raises(WorkflowFailureError) as failure:
            await handle.result()
        cause = failure.value.cause
        assert isinstance(cause, ApplicationError) and cause.type == ACCOUNTING_ERROR, (how, cause)
        assert "accounting error" in cause.message

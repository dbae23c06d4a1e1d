"""The generator: keeps ``concurrency`` jobs of every kind running until the soak's end, each driven by a
coroutine that uploads its files, starts it, applies its controls (pause and resume, concurrency, cancel and
redrive), runs an incremental job's runs while files are added and overwritten, and records how each
workflow ended. Every call to a server is retried while the nemesis has it down."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from temporalio.client import Client, WorkflowFailureError
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import CancelledError, WorkflowAlreadyStartedError
from temporalio.service import RPCError

from s3batch import client as jobs
from s3batch.incremental import run_output_prefix
from scripts.soak.cluster import SOURCE_BUCKET, Cluster
from scripts.soak.data import Mix, SourceFile, csv_version
from scripts.soak.kinds import Change, Control, JobPlan, RunRecord, plan_job
from scripts.soak.timeline import Timeline

T = TypeVar("T")
TASK_QUEUE = "soak"


def retry_sync(call: Callable[[], T], what: str, seconds: float = 600) -> T:
    """``call()``, again each second while it fails (a server down), for up to ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return call()
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


async def retry(call: Callable[[], Awaitable[T]], seconds: float = 600, *, servers_only: bool = True) -> T:
    """``await call()``, again each second while the Temporal server is away (``servers_only``), or while it
    fails with anything but an answer of s3batch's client (a job's state, a refused request), for ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return await call()
        except jobs.ClientError:
            raise
        except Exception as err:
            if (servers_only and not isinstance(err, RPCError)) or time.monotonic() > deadline:
                raise
            await asyncio.sleep(1)


class Generator:
    def __init__(self, cluster: Cluster, client: Client, s3: Any, timeline: Timeline, *, seed: int, scale: float,
                 concurrency: int, kinds: tuple[str, ...] = ()) -> None:
        self.cluster, self.client, self.s3, self.timeline = cluster, client, s3, timeline
        self.seed, self.scale, self.concurrency, self.kinds = seed, scale, concurrency, kinds
        self.plans: list[JobPlan] = []
        self.running: set[asyncio.Task[None]] = set()
        self.pool = ThreadPoolExecutor(16, thread_name_prefix="soak-upload")
        self.early_check: Callable[[JobPlan, RunRecord], list[str]] | None = None
        """The checker's books of a cancelled job, run before its redrive (set by the runner)."""

    # ------------------------------------------------------------------ the loop

    async def run(self, until: float) -> None:
        """Start jobs, ``concurrency`` at a time, until ``until`` (the timeline's seconds)."""
        rng = random.Random(f"jobs-{self.seed}")
        number = 0
        while self.timeline.now() < until:
            while len(self.running) < self.concurrency and self.timeline.now() < until:
                pg = self.cluster.pg is not None
                plan = await asyncio.to_thread(plan_job, rng, number, self.seed, self.scale, pg, self.kinds)
                number += 1
                self.plans.append(plan)
                task = asyncio.create_task(self._drive(plan))
                self.running.add(task)
                task.add_done_callback(self.running.discard)
            if self.running:
                await asyncio.wait(self.running, timeout=max(0.1, until - self.timeline.now()),
                                   return_when=asyncio.FIRST_COMPLETED)

    async def drain(self, timeout: float) -> None:
        """Wait for the jobs still running (``timeout`` seconds at most: those left are ``unfinished``)."""
        if self.running:
            _, left = await asyncio.wait(set(self.running), timeout=timeout)
            for task in left:
                task.cancel()
            await asyncio.gather(*left, return_exceptions=True)
        self.pool.shutdown()

    async def _drive(self, plan: JobPlan) -> None:
        try:
            await self._upload(plan)
            if plan.spec.get("incremental") is not None:
                await self._incremental(plan)
            else:
                await self._job(plan)
        except asyncio.CancelledError:
            for rec in plan.records:
                if rec.status == "unknown":
                    rec.status = "unfinished"
            raise
        except Exception as err:  # noqa: BLE001 - the soak itself failed to drive it: a finding to read
            self.timeline.add("job", f"{plan.job_id}: the soak could not drive it: {type(err).__name__}: {err}")
            plan.checked_early.append(f"{plan.job_id}: the soak could not drive it: {type(err).__name__}: {err}")

    # ------------------------------------------------------------------ data

    def _put(self, key: str, body: bytes) -> str:
        response = retry_sync(lambda: self.s3.put_object(Bucket=SOURCE_BUCKET, Key=key, Body=body), f"put {key}")
        return str(response["ETag"]).strip('"')

    async def _upload(self, plan: JobPlan) -> None:
        loop = asyncio.get_running_loop()

        async def one(file: SourceFile) -> None:
            version = file.current
            version.etag = await loop.run_in_executor(self.pool, self._put, file.key, version.body)

        await asyncio.gather(*(one(f) for f in plan.files.values()))
        if plan.manifest is not None:
            await loop.run_in_executor(self.pool, self._put, *plan.manifest)

    async def _change(self, plan: JobPlan, change: Change, began: float) -> None:
        await asyncio.sleep(max(0.0, began + change.at - time.monotonic()))
        rng = plan.rng
        added, overwritten = [], []
        for _ in range(change.add):
            name = f"n{len(plan.files):03d}.csv"
            version = csv_version(rng, plan.tag(name), rng.randint(5, 500), Mix(malformed=0.01))
            plan.files[plan.prefix + name] = SourceFile(plan.prefix + name, [version])
            added.append(name)
        for _ in range(change.overwrite):
            file = plan.files[rng.choice(sorted(plan.files))]
            number = len(file.versions)
            file.versions.append(csv_version(rng, plan.tag(file.key.rsplit("/", 1)[1], number), rng.randint(5, 500),
                                             Mix(malformed=0.01)))
            overwritten.append(file.key.rsplit("/", 1)[1])
        loop = asyncio.get_running_loop()
        for name in added + overwritten:
            file = plan.files[plan.prefix + name]
            file.current.etag = await loop.run_in_executor(self.pool, self._put, file.key, file.current.body)
        self.timeline.add("control", f"{plan.job_id} run {change.run}: added {added}, overwrote {overwritten}")

    # ------------------------------------------------------------------ workflows

    async def _start(self, rec: RunRecord, spec: dict[str, Any], files_per_run: int | None) -> None:
        args: list[Any] = [spec] if files_per_run is None else [spec, {"files_per_run": files_per_run}]

        async def start() -> None:
            with contextlib.suppress(WorkflowAlreadyStartedError):  # a start the server took before it went away
                await self.client.start_workflow(
                    "S3BatchWorkflow", args=args, id=rec.workflow_id, task_queue=TASK_QUEUE,
                    id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                    id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                )

        await retry(start)
        rec.started = self.timeline.now()
        self.timeline.add("job", f"{rec.workflow_id} started ({rec.role})")

    async def _end(self, rec: RunRecord) -> None:
        """Wait for the workflow to end (through server restarts) and record how."""
        handle = self.client.get_workflow_handle(rec.workflow_id)
        while True:
            try:
                result = await handle.result()
                rec.status = str(result.status if hasattr(result, "status") else result["status"])
                break
            except WorkflowFailureError as err:
                cancelled = isinstance(err.cause, CancelledError)
                rec.status = "cancelled" if cancelled else "failed"
                rec.error = None if cancelled else str(err.cause)[:500]
                break
            except RPCError:
                await asyncio.sleep(1)
        rec.ended = self.timeline.now()
        error = f": {rec.error[:160]}" if rec.error else ""
        self.timeline.add("job", f"{rec.workflow_id} ended {rec.status}{error}")

    async def _job(self, plan: JobPlan) -> None:
        rec = RunRecord(plan.job_id, plan.spec["output_prefix"], "job")
        plan.records.append(rec)
        await self._start(rec, plan.spec, plan.files_per_run)
        began = time.monotonic()
        controls = [asyncio.create_task(self._control(plan, c, began)) for c in plan.controls]
        await self._end(rec)
        for task in controls:
            task.cancel()
        await asyncio.gather(*controls, return_exceptions=True)
        cancel = next((c for c in plan.controls if c.action == "cancel"), None)
        if rec.status == "cancelled" and cancel is not None and cancel.redrive_after is not None:
            await asyncio.sleep(cancel.redrive_after)
            if self.early_check is not None:
                check = self.early_check
                plan.checked_early += await asyncio.to_thread(retry_sync, lambda: check(plan, rec), "check")
            await self._redrive(plan, rec)

    async def _control(self, plan: JobPlan, control: Control, began: float) -> None:
        await asyncio.sleep(max(0.0, began + control.at - time.monotonic()))
        wid = plan.job_id
        try:
            if control.action == "pause":
                await retry(lambda: jobs.pause(self.client, wid), 60)
                self.timeline.add("control", f"{wid}: paused for {control.hold:.0f}s")
                await asyncio.sleep(control.hold)
                await retry(lambda: jobs.resume(self.client, wid), 120)
                self.timeline.add("control", f"{wid}: resumed")
            elif control.action == "concurrency":
                await retry(lambda: jobs.set_concurrency(self.client, wid, control.value), 60)
                self.timeline.add("control", f"{wid}: concurrency {control.value}")
            else:
                await retry(lambda: jobs.cancel(self.client, wid), 60)
                self.timeline.add("control", f"{wid}: cancelled")
        except jobs.ClientError as err:  # the job ended first, or refused the control: noted
            self.timeline.add("control", f"{wid}: {control.action} not applied: {str(err)[:160]}")

    async def _redrive(self, plan: JobPlan, cancelled: RunRecord) -> None:
        try:
            redrive = await retry(lambda: jobs.prepare_redrive(self.client, cancelled.workflow_id,
                                                               f"{plan.job_id}-redrive", TASK_QUEUE),
                                  servers_only=False)  # it reads the report: S3 may be down a while
        except jobs.ClientError as err:  # nothing left to redrive, or a job over a manifest
            self.timeline.add("control", f"{plan.job_id}: nothing to redrive: {str(err)[:160]}")
            return
        rec = RunRecord(redrive.workflow_id, plan.spec["output_prefix"], "redrive")
        plan.records.append(rec)
        spec = redrive.job.model_dump(mode="json", exclude_unset=True)
        await self._start(rec, spec, None)
        await self._end(rec)

    async def _incremental(self, plan: JobPlan) -> None:
        """The planned runs one after the other, files changing while they run; then runs until one lists
        nothing (the ledger retries what failed), at most three more."""
        run = 0
        while run < plan.runs + 3:
            wid = f"{plan.job_id}-r{run}"
            rec = RunRecord(wid, run_output_prefix(plan.spec["output_prefix"], wid), f"run {run}")
            plan.records.append(rec)
            await self._start(rec, plan.spec, plan.files_per_run)
            began = time.monotonic()
            changes = [asyncio.create_task(self._change(plan, c, began)) for c in plan.changes if c.run == run]
            await self._end(rec)
            await asyncio.gather(*changes)
            run += 1
            if run >= plan.runs and not changes and await asyncio.to_thread(self._listed_nothing, rec):
                break

    def _listed_nothing(self, rec: RunRecord) -> bool:
        from scripts.soak.outputs import read_report

        report = retry_sync(lambda: read_report(self.s3, rec.output_prefix), "read the report")
        return report is not None and report["totals"]["files_listed"] == 0


"""The jobs ``scripts/record_histories.py`` records: small real jobs on tiny synthetic files, each covering a
code path of the workflow (the table in tests/histories/README.md).

Each scenario starts its job (and drives it: updates, a cancel, a second worker version) and returns its
handle and the way it must end; the recorder waits for that end and writes every run's history.
``CURRENT_ONLY``: scenarios of job options, test handlers or worker features the previous release does
not have (recorded with ``--current``); ``PATCHES``: the ``workflow.patched`` markers a scenario's
histories must hold when recorded with the working tree (a recording that missed its path guards nothing).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType, PendingWorkflowTaskState
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle

from s3batch.client.deployments import promote
from s3batch.dev.stack import ensure_buckets
from s3batch.dev.workers import WorkerProcess

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = "S3BatchWorkflow"
CANARY = "rec0rd-value-"
"""In the records of the newer scenarios' files: a history holding it holds record data (refused)."""


def csv_rows(rows: int, *, start: int = 0, marker: int | None = None, name: str = "n") -> bytes:
    """A synthetic CSV; the row ``marker`` carries ``BOOM`` (``explode_on_marker`` fails its chunk). ``name``
    prefixes each row's second field (``CANARY``: the recorder refuses a history holding it)."""
    body = "".join(f"{i},{'BOOM' if i == marker else f'{name}{i}'}\n" for i in range(start, start + rows))
    return ("id,name\n" + body).encode()


@dataclass
class Ctx:
    client: Client
    s3: Any
    task_queue: str
    """The queue of the recorder's worker (of the release recorded)."""
    tag: str
    log_dir: Path
    """Where workers a scenario starts itself write their logs (and ``gates/``)."""
    worker_env: dict[str, str] = field(default_factory=dict)
    """The environment the recorder's worker has on top of the stack's (handler modules, delay)."""

    def buckets(self, name: str) -> tuple[str, str]:
        src, out = f"rec-{name[:20].replace('_', '-')}-{self.tag}", f"rec-out-{name[:16].replace('_', '-')}-{self.tag}"
        ensure_buckets(self.s3, src, out)
        return src, out

    def put(self, bucket: str, files: dict[str, bytes]) -> None:
        for key, body in files.items():
            self.s3.put_object(Bucket=bucket, Key=key, Body=body)

    async def start(
        self, name: str, job: dict[str, Any], state: dict[str, Any] | None = None, *, queue: str | None = None
    ) -> WorkflowHandle:
        # Plain JSON arguments, by workflow name: the same call starts a job on any release.
        args: list[Any] = [job] if state is None else [job, state]
        return await self.client.start_workflow(
            WORKFLOW, args=args, id=f"history-{name}-{self.tag}", task_queue=queue or self.task_queue, result_type=dict
        )

    def worker(self, task_queue: str, name: str, **env: str) -> WorkerProcess:
        """A worker of the working tree of its own (ready), with the recorder's worker's environment and ``env``."""
        worker = WorkerProcess(task_queue, self.log_dir, name, cwd=ROOT, env={**self.worker_env, **env})
        worker.ready_timeout = 60
        return worker.wait_ready()


async def until(handle: WorkflowHandle, check: Callable[[dict[str, Any]], bool], timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        progress = await handle.query("progress", result_type=dict)
        if check(progress):
            return progress
        if time.monotonic() > deadline:
            raise TimeoutError(f"{handle.id}: condition not reached in {timeout}s; progress {progress}")
        await asyncio.sleep(0.05)


async def result(handle: WorkflowHandle, timeout: float = 120) -> str:
    """How the job ended: ``succeeded``, or the failure type (``JobFailed``, ``cancelled``)."""
    try:
        await asyncio.wait_for(handle.result(), timeout)
    except WorkflowFailureError as err:
        cause = err.cause
        return getattr(cause, "type", None) or type(cause).__name__
    return "succeeded"


def _job(src: str, out: str, **options: Any) -> dict[str, Any]:
    return {"bucket": src, "prefix": "in/", "output_bucket": out, "output_prefix": "o/", **options}


# ------------------------------------------------------------------------------------ scenarios


async def continue_as_new(ctx: Ctx) -> tuple[WorkflowHandle, str]:
    """Seven files of three chunks, three files per run: three runs joined by continue-as-new."""
    src, out = ctx.buckets("can")
    ctx.put(src, {f"in/{i:02d}.csv": csv_rows(300) for i in range(7)})
    job = _job(src, out, chunk_records=100, group_max_files=1, max_concurrent_files=2)
    handle = await ctx.start("continue_as_new", job, {"files_per_run": 3})
    return handle, "succeeded"


async def groups(ctx: Ctx) -> tuple[WorkflowHandle, str]:
    """Ten small files processed in groups of up to four, two activities at a time."""
    src, out = ctx.buckets("groups")
    ctx.put(src, {f"in/{i:02d}.csv": csv_rows(20, start=i * 20) for i in range(10)})
    ctx.put(src, {"in/10.jsonl": b'{"id": 1}\n{"id": 2}\nnot json\n'})
    job = _job(src, out, group_max_files=4, max_concurrent_files=2)
    return await ctx.start("groups", job), "succeeded"


async def controls(ctx: Ctx) -> tuple[WorkflowHandle, str]:
    """Pause while a file is in flight, stay paused, resume, then raise the concurrency to three."""
    src, out = ctx.buckets("controls")
    ctx.put(src, {f"in/{i:02d}.csv": csv_rows(1_000) for i in range(6)})
    job = _job(src, out, handler="slow_passthrough", chunk_records=100, group_max_files=1, max_concurrent_files=1)
    handle = await ctx.start("controls", job)
    await until(handle, lambda p: p["files_in_flight"] == 1)
    await handle.execute_update("pause", result_type=dict)
    await until(handle, lambda p: p["files_in_flight"] == 0)
    await asyncio.sleep(1.0)
    await handle.execute_update("resume", result_type=dict)
    await handle.execute_update("set_concurrency", 3, result_type=dict)
    return handle, "succeeded"


async def failed_file(ctx: Ctx) -> tuple[WorkflowHandle, str]:
    """A file whose handler fails on every attempt and a CSV whose header is not UTF-8: the job
    processes the rest and fails (``max_failed_files=0``)."""
    src, out = ctx.buckets("failed")
    ctx.put(
        src,
        {
            "in/a-good.csv": csv_rows(250),
            "in/b-boom.csv": csv_rows(250, marker=120),
            "in/c-bad-header.csv": b"\xff\xfeid,name\n1,x\n",
        },
    )
    job = _job(src, out, handler="explode_on_marker", chunk_records=100, group_max_files=1, max_attempts=2)
    return await ctx.start("failed_file", job), "JobFailed"


async def redrive(ctx: Ctx) -> tuple[WorkflowHandle, str]:
    """The failed job's failed files again (``only_failed_of``), after the handler's bad row was
    fixed: one file now succeeds, the bad header fails again (allowed by ``max_failed_files``)."""
    src, out = f"rec-failed-{ctx.tag}", f"rec-out-failed-{ctx.tag}"
    copy = "o/_s3batch/redriven-report.json"
    ctx.s3.copy_object(Bucket=out, Key=copy, CopySource={"Bucket": out, "Key": "o/_report.json"})
    ctx.put(src, {"in/b-boom.csv": csv_rows(250)})
    job = _job(
        src,
        out,
        handler="explode_on_marker",
        chunk_records=100,
        group_max_files=1,
        max_attempts=2,
        max_failed_files=1,
        only_failed_of=f"s3://{out}/{copy}",
    )
    return await ctx.start("redrive", job), "succeeded"


async def group_fails(ctx: Ctx) -> tuple[WorkflowHandle, str]:
    """A group whose handler fails on one file: the group's attempts run out, its files are retried
    one per activity; the bad one fails alone and the job succeeds (``max_failed_files=1``)."""
    src, out = ctx.buckets("group-fails")
    files = {f"in/{i:02d}.csv": csv_rows(10, start=i * 10) for i in range(5)}
    files["in/02.csv"] = csv_rows(10, start=20, marker=25)
    ctx.put(src, files)
    job = _job(src, out, handler="explode_on_marker", max_attempts=2, max_failed_files=1, group_max_files=10)
    return await ctx.start("group_fails", job), "succeeded"


async def cancel(ctx: Ctx) -> tuple[WorkflowHandle, str]:
    """Cancelled while two files are in flight (and others not started): they stop at a chunk
    boundary, the report is written, the workflow ends cancelled."""
    src, out = ctx.buckets("cancel")
    ctx.put(src, {f"in/{i:02d}.csv": csv_rows(3_000) for i in range(5)})
    job = _job(src, out, handler="slow_passthrough", chunk_records=100, group_max_files=1, max_concurrent_files=2)
    handle = await ctx.start("cancel", job)
    await until(handle, lambda p: p["files_in_flight"] == 2 and p["records_written"] >= 200)
    await handle.cancel()
    return handle, "CancelledError"


async def straggler(ctx: Ctx) -> tuple[WorkflowHandle, str]:
    """One big slow file and six small ones, three files per run: each full run hands the big file
    over to the next (patch marker, grace timer, activity cancel)."""
    src, out = ctx.buckets("straggler")
    ctx.put(src, {"in/00-big.csv": csv_rows(3_000), **{f"in/{i:02d}.csv": csv_rows(20) for i in range(1, 7)}})
    job = _job(src, out, handler="slow_passthrough", chunk_records=100, group_max_files=1, max_concurrent_files=3)
    return await ctx.start("straggler", job, {"files_per_run": 3}), "succeeded"


async def splits(ctx: Ctx) -> tuple[WorkflowHandle, str]:
    """A big file in three byte-range splits at once (patch marker, three activities, one result), and a
    small file after them."""
    src, out = ctx.buckets("splits")
    ctx.put(src, {"in/00-big.csv": csv_rows(12_000), "in/01.csv": csv_rows(20)})
    job = _job(src, out, chunk_records=1_000, split_bytes=64 * 1024, max_concurrent_files=3)
    return await ctx.start("splits", job), "succeeded"


async def splits_quoted(ctx: Ctx) -> tuple[WorkflowHandle, str]:
    """A file whose quoted line breaks fall at a split's boundary: that split fails (not retried), the
    others are stopped, and the file is processed whole (one more activity); the job succeeds."""
    src, out = ctx.buckets("splits-quoted")
    body = "id,note\n" + "".join(f'{i},"one\ntwo {i}"\n' for i in range(8_000))
    ctx.put(src, {"in/quoted.csv": body.encode()})
    job = _job(src, out, chunk_records=500, split_bytes=64 * 1024, max_concurrent_files=3)
    return await ctx.start("splits_quoted", job), "succeeded"


async def straggler_splits(ctx: Ctx) -> tuple[WorkflowHandle, str]:
    """A big slow file in two byte-range splits and six small files, three files per run: each full run
    hands the splits over to the next (patch marker, grace timer, two activity cancels), which starts the
    same two splits again."""
    src, out = ctx.buckets("straggler-splits")
    big = csv_rows(12_000)
    ctx.put(src, {"in/00-big.csv": big, **{f"in/{i:02d}.csv": csv_rows(20) for i in range(1, 7)}})
    job = _job(src, out, handler="slow_passthrough", chunk_records=100, group_max_files=1, max_concurrent_files=3,
               split_bytes=len(big) // 2 + 1)
    return await ctx.start("straggler_splits", job, {"files_per_run": 3}), "succeeded"



# ------------------------------------------------------------------------- newer paths (working tree)


def _archived(ctx: Ctx, bucket: str, prefix: str) -> list[str]:
    pages = ctx.s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return sorted(obj["Key"] for page in pages for obj in page.get("Contents", []))


def _left_in(ctx: Ctx, bucket: str, expected: list[str], where: str = "in/") -> None:
    """The files under ``where`` once the job ended are ``expected`` (what ``after_success`` left)."""
    found = _archived(ctx, bucket, where)
    if found != expected:
        raise RuntimeError(f"after_success left {found} under s3://{bucket}/{where}, expected {expected}")


async def after_success_archive(ctx: Ctx) -> tuple[WorkflowHandle, str]:
    """``after_success`` archive (patch ``after-success``): a big file in two byte-range splits, four small files
    in groups of two and a file whose handler fails on every attempt: each file activity that ended with
    succeeded files is followed by one archive activity for them; the failed file stays (``max_failed_files``
    allows it)."""
    src, out = ctx.buckets("after-archive")
    big = csv_rows(8_000, name=CANARY)
    smalls = {f"in/s{i}.csv": csv_rows(20, start=i * 20, name=CANARY) for i in range(4)}
    ctx.put(src, {"in/00-big.csv": big, "in/a-boom.csv": csv_rows(300, marker=250, name=CANARY), **smalls})
    job = _job(src, out, handler="explode_on_marker", chunk_records=100, group_max_files=2, group_max_bytes=4096,
               split_bytes=len(big) // 2 + 1, max_concurrent_files=3, max_attempts=2, max_failed_files=1,
               after_success={"action": "archive", "prefix": "archive/"})  # fmt: skip
    handle = await ctx.start("after_success_archive", job)
    if await result(handle) == "succeeded":
        _left_in(ctx, src, ["in/a-boom.csv"])
        _left_in(ctx, src, sorted(["archive/00-big.csv", *(k.replace("in/", "archive/") for k in smalls)]), "archive/")
    return handle, "succeeded"


async def after_success_delete(ctx: Ctx) -> tuple[WorkflowHandle, str]:
    """``after_success`` delete (patch ``after-success``): three files one per activity, each deleted once it
    succeeded, and a file whose handler fails on every attempt, left in place; the job fails
    (``JobFailed``, ``max_failed_files=0``) after acting on the others."""
    src, out = ctx.buckets("after-delete")
    ctx.put(src, {f"in/{i:02d}.csv": csv_rows(150, name=CANARY) for i in range(3)})
    ctx.put(src, {"in/03-boom.csv": csv_rows(150, marker=120, name=CANARY)})
    job = _job(src, out, handler="explode_on_marker", chunk_records=100, group_max_files=1, max_concurrent_files=2,
               max_attempts=2, after_success={"action": "delete"})  # fmt: skip
    handle = await ctx.start("after_success_delete", job)
    if await result(handle) == "JobFailed":
        _left_in(ctx, src, ["in/03-boom.csv"])
    return handle, "JobFailed"


def customers_rows(rows: int, *, bad: bool) -> bytes:
    """A CSV of the ``customers`` handler's schema; ``bad``: every email is refused by it."""
    body = "".join(
        f"{i + 1},{f'{CANARY}{i}' if bad else f'c{i}@example.com'},{CANARY}name {i},FR,1.00,2024-01-02T03:04:05Z\n"
        for i in range(rows)
    )
    return ("customer_id,email,name,country,amount,created_at\n" + body).encode()


async def all_rejected(ctx: Ctx) -> tuple[WorkflowHandle, str]:
    """A big file in two byte-range splits whose every record the schema rejects, in a job that sets no reject
    limit: failed (``TooManyRejects``, judged in the workflow on the sum of its splits: patch
    ``fail-all-rejected``); a good file beside it succeeds; the job fails (``JobFailed``)."""
    src, out = ctx.buckets("all-rejected")
    big = customers_rows(3_000, bad=True)
    ctx.put(src, {"in/00-bad.csv": big, "in/01-good.csv": customers_rows(20, bad=False)})
    job = _job(src, out, handler="customers", chunk_records=500, split_bytes=len(big) // 2 + 1, max_concurrent_files=3)
    return await ctx.start("all_rejected", job), "JobFailed"


async def fail_if_empty(ctx: Ctx) -> tuple[WorkflowHandle, str]:
    """``fail_if_empty`` on a prefix matching no file (patch ``fail-if-empty``): the report, then ``EmptyPrefix``."""
    src, out = ctx.buckets("fail-if-empty")
    return await ctx.start("fail_if_empty", _job(src, out, fail_if_empty=True)), "EmptyPrefix"


async def _cancel_requested(handle: WorkflowHandle) -> bool:
    """The job's current run has asked an activity to stop."""
    events = (await handle.fetch_history()).events
    return any(e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_CANCEL_REQUESTED for e in events)


async def _wait(check: Callable[[], Awaitable[bool]], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not seen in {timeout:g}s")
        await asyncio.sleep(0.1)


async def hand_over_failed_attempt(ctx: Ctx) -> tuple[WorkflowHandle, str]:
    """The straggler's attempt fails (a fault a retry passes) just after its run asked it to stop, before it
    could learn so (patch ``hand-over-failed-attempt``): the server retries no activity asked to stop, and the
    file is handed over, not failed; the next run resumes it. The handler ``gate_then_fail`` holds the big
    file in its chunk 3 until the run has asked it to stop (the gate is a file the recorder writes)."""
    src, out = ctx.buckets("failed-attempt")
    gates = Path(ctx.worker_env["S3BATCH_TEST_GATE_DIR"])
    ctx.put(src, {"in/00-gated.csv": csv_rows(1_000, name=CANARY),
                  **{f"in/s{i}.csv": csv_rows(20, name=CANARY) for i in range(4)}})  # fmt: skip
    job = _job(src, out, handler="gate_then_fail", chunk_records=100, group_max_files=1, max_concurrent_files=1,
               heartbeat_timeout_seconds=30)  # fmt: skip
    handle = await ctx.start("hand_over_failed_attempt", job, {"files_per_run": 3})

    async def at_gate() -> bool:
        return (gates / f"{src}.reached").exists()

    try:
        await _wait(at_gate, "the big file at its gate")
        await handle.execute_update("set_concurrency", 4, result_type=dict)  # its run's small files start
        await _wait(lambda: _cancel_requested(handle), "the run asking the big file to stop")
    finally:
        (gates / f"{src}.open").touch()
    return handle, "succeeded"


async def _cancelled_in(ctx: Ctx, name: str, activity: str) -> tuple[WorkflowHandle, str]:
    """Start scenario ``name``'s job of one small file on a worker whose S3 requests a proxy holds 1.5 s each, cancel
    it once its ``activity`` is in flight, and say how it ended. In flight: scheduled (an activity), or, for the
    check (a local activity with the patch ``local-check-and-listing``: it has no event until its workflow task
    ends), once the job's first workflow task has been started for a moment."""
    from scripts.benchmark.latency import LatencyProxy

    src, out = ctx.buckets(name.replace("_", "-"))
    ctx.put(src, {"in/00.csv": csv_rows(20, name=CANARY)})
    queue = f"{ctx.task_queue}-slow-s3"
    s3_port = int(os.environ["AWS_ENDPOINT_URL_S3"].rsplit(":", 1)[1])
    with LatencyProxy(s3_port, 1.5) as proxy:
        worker = ctx.worker(queue, "slow-s3", AWS_ENDPOINT_URL_S3=proxy.endpoint)
        try:
            handle = await ctx.start(name, _job(src, out), queue=queue)

            async def in_flight() -> bool:  # (a started activity is in the history once it ends)
                events = (await handle.fetch_history()).events
                scheduled = [
                    e.activity_task_scheduled_event_attributes.activity_type.name
                    for e in events
                    if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
                ]
                if activity in scheduled:
                    return True
                if activity != "s3batch.check_job":  # an activity is in the history once scheduled
                    return False
                # The check, a local activity: in flight while the job's first workflow task is.
                task = (await handle.describe()).raw_description.pending_workflow_task
                started = task.state == PendingWorkflowTaskState.PENDING_WORKFLOW_TASK_STATE_STARTED
                return started and time.time() - task.started_time.ToSeconds() > 0.5

            await _wait(in_flight, f"the job's {activity} in flight", timeout=120)
            await handle.cancel()
            return handle, await result(handle)
        finally:
            worker.stop()


async def cancel_in_check(ctx: Ctx) -> tuple[WorkflowHandle, str]:
    """Cancelled while the job's check (its first activity) is in flight (patch ``report-on-any-cancel``): the
    cancel reaches the workflow as the activity's failure, and the report is written."""
    handle, _ = await _cancelled_in(ctx, "cancel_in_check", "s3batch.check_job")
    return handle, "CancelledError"


async def upgrade_on_new_version(ctx: Ctx) -> tuple[WorkflowHandle, str]:
    """Worker Versioning (patch ``upgrade-on-new-version``): a job of ten files one at a time (about 1.2 s each)
    starts on build v1 of a deployment; once a file is done, a v2 worker starts and v2 is made current: the run
    sees it when its file ends, starts no more and continues as new; the next run runs on v2."""
    src, out = ctx.buckets("upgrade")
    ctx.put(src, {f"in/{i:02d}.csv": csv_rows(2_000, name=CANARY) for i in range(10)})
    queue, deployment = f"{ctx.task_queue}-versioned", f"s3batch-record-{ctx.tag}"
    workers = [ctx.worker(queue, "v1", S3BATCH_DEPLOYMENT_NAME=deployment, S3BATCH_BUILD_ID="v1")]
    try:
        await promote(ctx.client, deployment, "v1")
        job = _job(src, out, handler="slow_passthrough", chunk_records=100, group_max_files=1, max_concurrent_files=1)
        handle = await ctx.start("upgrade_on_new_version", job, queue=queue)
        await until(handle, lambda p: p["files_succeeded"] >= 1)
        workers.append(ctx.worker(queue, "v2", S3BATCH_DEPLOYMENT_NAME=deployment, S3BATCH_BUILD_ID="v2"))
        await promote(ctx.client, deployment, "v2")
        await result(handle)
    finally:
        for worker in workers:
            worker.stop()
    return handle, "succeeded"


async def stopped_attempt(ctx: Ctx) -> tuple[WorkflowHandle, str]:
    """Cancelled while a file's attempt runs, and that attempt then fails (a fault a retry passes) before it could
    learn of the cancel (patch ``stopped-attempt``): the server retries no activity asked to stop, and the file is
    reported ``cancelled`` with what it committed, not ``failed``. Its short activities heartbeat (patch
    ``short-activities-heartbeat``). The handler ``gate_then_fail`` holds the file in its chunk 3 until the cancel
    has reached it (the gate is a file the recorder writes)."""
    src, out = ctx.buckets("stopped-attempt")
    gates = Path(ctx.worker_env["S3BATCH_TEST_GATE_DIR"])
    ctx.put(src, {"in/00-gated.csv": csv_rows(1_000, name=CANARY), "in/01.csv": csv_rows(20, name=CANARY)})
    job = _job(src, out, handler="gate_then_fail", chunk_records=100, group_max_files=1, max_concurrent_files=1,
               heartbeat_timeout_seconds=30)  # fmt: skip
    handle = await ctx.start("stopped_attempt", job)

    async def at_gate() -> bool:
        return (gates / f"{src}.reached").exists()

    try:
        await _wait(at_gate, "the file at its gate")
        await handle.cancel()
        await _wait(lambda: _cancel_requested(handle), "the job asking the file to stop")
    finally:
        (gates / f"{src}.open").touch()
    return handle, "CancelledError"


async def final_report_stands(ctx: Ctx) -> tuple[WorkflowHandle, str]:
    """Cancelled while its final report is being written (patch ``final-report-stands``): the job ends with the
    status its report was begun with, ``succeeded`` (before the patch: the report activity was cancelled and a
    ``cancelled`` report written, the job ``CancelledError``; ``PATCHES`` requires the marker of the first)."""
    return await _cancelled_in(ctx, "final_report_stands", "s3batch.write_report")


SCENARIOS: dict[str, Callable[[Ctx], Awaitable[tuple[WorkflowHandle, str]]]] = {
    "continue_as_new": continue_as_new,
    "groups": groups,
    "controls": controls,
    "failed_file": failed_file,
    "redrive": redrive,
    "group_fails": group_fails,
    "cancel": cancel,
    "straggler": straggler,
    "splits": splits,
    "splits_quoted": splits_quoted,
    "straggler_splits": straggler_splits,
    "after_success_archive": after_success_archive,
    "after_success_delete": after_success_delete,
    "all_rejected": all_rejected,
    "fail_if_empty": fail_if_empty,
    "hand_over_failed_attempt": hand_over_failed_attempt,
    "cancel_in_check": cancel_in_check,
    "upgrade_on_new_version": upgrade_on_new_version,
    "stopped_attempt": stopped_attempt,
    "final_report_stands": final_report_stands,
}

CURRENT_ONLY = {
    "after_success_archive",
    "after_success_delete",
    "all_rejected",
    "fail_if_empty",
    "hand_over_failed_attempt",
    "cancel_in_check",
    "upgrade_on_new_version",
    "stopped_attempt",
    "final_report_stands",
}
"""Scenarios of options, handlers or worker settings v0.1.0 does not have: a release is recorded without them
unless ``--only`` names them."""

PATCHES: dict[str, set[str]] = {
    "continue_as_new": {"local-check-and-listing"},
    "straggler": {"hand-over-stragglers"},
    "splits": {"split-big-files", "largest-first"},
    "straggler_splits": {"hand-over-splits"},
    "after_success_archive": {"after-success", "split-big-files"},
    "after_success_delete": {"after-success"},
    "all_rejected": {"fail-all-rejected"},
    "fail_if_empty": {"fail-if-empty"},
    "hand_over_failed_attempt": {"hand-over-failed-attempt", "hand-over-stragglers"},
    "cancel_in_check": {"report-on-any-cancel"},
    "upgrade_on_new_version": {"upgrade-on-new-version"},
    "stopped_attempt": {"stopped-attempt", "local-check-and-listing"},
    "final_report_stands": {"final-report-stands"},
}
"""The patch markers the runs of a scenario recorded with the working tree must hold (``--current``)."""

"""Upgrading the workers while a job runs: workers of the previous release start a job that spans
continue-as-new, get SIGTERM mid-job (as a deploy sends it), and workers of the current code take
over. The job must finish exactly once: every key once in the report, every output exactly its
records, no workflow task failure, and no committed chunk processed again.

The previous release is built from git by ``s3batch.dev.releases`` (its own virtual environment, cached
under ``~/.cache/s3batch-releases/``); the test is skipped only when git or the release's tag is missing.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle

from s3batch.dev.releases import PREVIOUS_RELEASE, Release, ReleaseUnavailable, ReleaseWorker, build_release
from s3batch.dev.stack import Stack
from tests.fault_handlers import handled_records
from tests.helpers import wait_for
from tests.helpers.workers import worker_process

pytestmark = pytest.mark.slow

HANDLERS = "tests.slow_handlers,tests.fault_handlers"
CHUNK = 100
BIG_ROWS = 4_000
"""40 chunks of 50 ms (``counting_slow``): a big file is in flight about two seconds."""
SMALL_ROWS = 5
PART = re.compile(r"part-(\d{5,})\.jsonl")


@pytest.fixture(scope="session")
def previous_release() -> Release:
    try:
        release = build_release(PREVIOUS_RELEASE)
    except ReleaseUnavailable as err:
        pytest.skip(f"upgrade test needs the previous release: {err}")
    print(f"\nprevious release {release.ref} ({release.commit[:12]}) ready in {release.build_seconds:.1f}s")
    return release


def rows(n: int, start: int) -> list[dict[str, str]]:
    return [{"id": str(i), "name": f"n{i}"} for i in range(start, start + n)]


def csv_of(records: list[dict[str, str]]) -> bytes:
    return ("id,name\n" + "".join(f"{r['id']},{r['name']}\n" for r in records)).encode()


def output_records(s3: Any, bucket: str, key: str) -> tuple[list[dict[str, Any]], list[int]]:
    """The records of a file's output, parts in order, and the chunk indices of its parts."""
    names: list[str] = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"o/{key}/"):
        names.extend(item["Key"] for item in page.get("Contents", []))
    chunks = sorted(int(m.group(1)) for n in names if (m := PART.fullmatch(n.rpartition("/")[2])))
    assert len(chunks) == len(names), f"{key}: output holds more than parts: {names}"
    records = []
    for chunk in chunks:
        body = s3.get_object(Bucket=bucket, Key=f"o/{key}/part-{chunk:05d}.jsonl")["Body"].read().decode()
        records.extend(json.loads(line) for line in body.splitlines())
    return records, chunks


async def all_runs(client: Client, handle: WorkflowHandle) -> list[list[Any]]:
    """The events of every run of the job, first run first, following continue-as-new."""
    runs: list[list[Any]] = []
    run_id = handle.first_execution_run_id
    while run_id:
        history = await client.get_workflow_handle(handle.id, run_id=run_id).fetch_history()
        runs.append(list(history.events))
        last = history.events[-1]
        if last.event_type != EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
            break
        run_id = last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
    return runs


async def diagnosis(client: Client, handle: WorkflowHandle, workers: list[Any]) -> str:
    """What a stuck job is doing: its last events, pending activities and the workers' log tails."""
    desc = await client.get_workflow_handle(handle.id).describe()
    events = (await client.get_workflow_handle(handle.id).fetch_history()).events
    lines = [f"run {desc.run_id}: {desc.status.name if desc.status else 'unknown'}"]
    for e in events[-15:]:
        name = EventType.Name(e.event_type).removeprefix("EVENT_TYPE_")
        failure = ""
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
            failure = e.workflow_task_failed_event_attributes.failure.message[:500]
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED:
            failure = e.activity_task_failed_event_attributes.failure.message[:500]
        lines.append(f"  {e.event_id} {name} {failure}")
    for act in desc.raw_description.pending_activities:
        lines.append(f"  pending {act.activity_type.name} attempt {act.attempt}: {act.last_failure.message[:500]}")
    for w in workers:
        lines.append(f"--- {w.log_path.name}\n{w.log()[-2500:]}")
    return "\n".join(lines)


async def finish(client: Client, handle: WorkflowHandle, workers: list[Any], timeout: float) -> dict[str, Any]:
    """The job's result; fails at once, with a diagnosis, when a workflow task fails (a job whose
    task fails is retried forever: it would only hang until the timeout)."""
    result = asyncio.ensure_future(handle.result())
    deadline = time.monotonic() + timeout
    try:
        while not result.done():
            run = await client.get_workflow_handle(handle.id).fetch_history()
            if any(e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED for e in run.events):
                why = "a workflow task failed"
            elif time.monotonic() > deadline:
                why = f"the job did not finish in {timeout:.0f}s"
            else:
                await asyncio.wait([result], timeout=1.0)
                continue
            raise AssertionError(f"{why} after the upgrade:\n{await diagnosis(client, handle, workers)}")
        return result.result()
    finally:
        result.cancel()


@pytest.fixture
def processes() -> Iterator[list[Any]]:
    started: list[Any] = []
    yield started
    for w in started:
        w.stop()


async def test_previous_release_workers_hand_a_running_job_to_current_workers(
    previous_release: Release,
    stack: Stack,
    client: Client,
    s3: Any,
    buckets: tuple[str, str],
    tmp_path: Path,
    processes: list[Any],
) -> None:
    src, out = buckets
    # Big files (several chunks each) and small ones, which form a group; three files per run, so
    # the job continues as new three times. Keys sort in this order, the order of the listing.
    expected: dict[str, list[dict[str, str]]] = {}
    for i in range(3):
        expected[f"in/{i:02d}-big.csv"] = rows(BIG_ROWS, i * 10_000)
    for i in range(3, 7):
        expected[f"in/{i:02d}-small.csv"] = rows(SMALL_ROWS, i * 10_000)
    for i in range(7, 10):
        expected[f"in/{i:02d}-big.csv"] = rows(BIG_ROWS, i * 10_000)
    for key, records in expected.items():
        s3.put_object(Bucket=src, Key=key, Body=csv_of(records))
    total = sum(len(r) for r in expected.values())

    task_queue = f"upgrade-{uuid.uuid4().hex[:8]}"
    count_file = tmp_path / "handled.txt"
    env = {"S3BATCH_HANDLER_MODULES": HANDLERS, "S3BATCH_TEST_COUNT_FILE": str(count_file)}
    old = [ReleaseWorker(previous_release, task_queue, tmp_path, f"old-{n}", **env) for n in "ab"]
    processes.extend(old)
    for w in old:
        w.wait_ready()

    # Plain JSON with only the fields given, by workflow name: what any client of any version sends.
    job = {
        "bucket": src,
        "prefix": "in/",
        "output_bucket": out,
        "output_prefix": "o/",
        "handler": "counting_slow",
        "chunk_records": CHUNK,
        "max_concurrent_files": 2,
        "group_max_bytes": 10_000,
        "heartbeat_timeout_seconds": 10,
    }
    handle = await client.start_workflow(
        "S3BatchWorkflow",
        args=[job, {"files_per_run": 3}],
        id=f"upgrade-{uuid.uuid4().hex[:8]}",
        task_queue=task_queue,
        result_type=dict,
    )

    async def mid_job() -> list[str] | None:
        # After at least one continue-as-new, with a big file in flight that has committed parts
        # but is not finished: SIGTERM then interrupts it mid-file.
        p = await handle.query("progress", result_type=dict)
        if p["run"] < 1:
            return None
        partial = []
        for key in (k for k in p["in_flight"] if k.endswith("-big.csv")):
            listed = s3.list_objects_v2(Bucket=out, Prefix=f"o/{key}/part-")
            if 0 < listed.get("KeyCount", 0) < BIG_ROWS // CHUNK:
                partial.append(key)
        return partial or None

    interrupted = await wait_for(mid_job, 90, "a big file in flight after a continue-as-new", alive=old)
    at_sigterm = await handle.query("progress", result_type=dict)

    # The deploy: the old workers get SIGTERM (they stop polling at once, their files stop at the
    # next chunk boundary), the new ones start.
    for w in old:
        w.proc.send_signal(signal.SIGTERM)
    new = [worker_process(task_queue, tmp_path, f"new-{n}", **env) for n in "ab"]
    processes.extend(new)
    for w in old:
        code = w.proc.wait(60)
        assert code == 0, f"old worker exit {code}:\n{w.log()[-3000:]}"
    for w in new:
        w.wait_ready()

    result = await finish(client, handle, new, timeout=float(os.environ.get("S3BATCH_UPGRADE_TIMEOUT", 180)))
    assert result["status"] == "succeeded", result
    totals = result["totals"]
    assert totals["files_listed"] == totals["files_succeeded"] == len(expected), totals
    assert totals["files_failed"] == 0 and totals["rejected"] == 0, totals
    assert totals["records_written"] == total, totals

    # Every key exactly once in the report, each with exactly its records.
    report = json.loads(s3.get_object(Bucket=out, Key=result["report_key"])["Body"].read())
    keys = [f["key"] for f in report["files"]]
    assert sorted(keys) == sorted(expected), keys
    assert len(keys) == len(set(keys)), f"a key is listed twice: {keys}"
    by_key = {f["key"]: f for f in report["files"]}
    for key, records in expected.items():
        got, chunks = output_records(s3, out, key)
        assert got == records, f"{key}: output differs from its source ({len(got)} vs {len(records)} records)"
        assert chunks == list(range(len(chunks))), f"{key}: parts {chunks} are not contiguous"
        assert by_key[key]["status"] == "succeeded" and by_key[key]["records_written"] == len(records)

    # The files interrupted by the deploy resumed from their checkpoints on the new workers...
    for key in interrupted:
        assert by_key[key]["resumed_from_record"] > 0, f"{key} started again from record 0: {by_key[key]}"
        assert by_key[key]["resumed_from_record"] % CHUNK == 0
    new_log = "".join(w.log() for w in new)
    assert any(f"resuming s3://{src}/{key} at record" in new_log for key in interrupted), new_log[-3000:]
    # ... and no chunk was processed twice: every record went through the handler exactly once.
    assert handled_records(count_file) == total, (
        f"{handled_records(count_file)} records handled for {total}: committed chunks were redone"
    )

    # Both releases processed records: the old workers before the deploy, the new ones after it.
    by_pid: dict[int, int] = {}
    for line in count_file.read_text().splitlines():
        pid, n = map(int, line.split())
        by_pid[pid] = by_pid.get(pid, 0) + n
    assert sum(by_pid.get(w.proc.pid, 0) for w in old) > 0 and sum(by_pid.get(w.proc.pid, 0) for w in new) > 0, by_pid

    # No workflow task failed in any run (a non-determinism or decoding error would show up here),
    # and both releases completed workflow tasks: the new workers replayed the old workers' history.
    runs = await all_runs(client, handle)
    # 3 files per run, 10 files: 4 runs, more when a new worker hands a file in flight over to the next run.
    assert len(runs) >= 4, f"expected 4 runs or more (3 files per run, 10 files), got {len(runs)}"
    events = [e for run in runs for e in run]
    failed = [e for e in events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED]
    assert not failed, [e.workflow_task_failed_event_attributes.failure.message for e in failed]
    host = socket.gethostname()
    completed_by = {
        e.workflow_task_completed_event_attributes.identity
        for e in events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
    }
    old_ids = {f"{w.proc.pid}@{host}" for w in old}
    new_ids = {f"{w.proc.pid}@{host}" for w in new}
    assert completed_by & old_ids and completed_by & new_ids, (completed_by, old_ids, new_ids)
    assert completed_by <= old_ids | new_ids, completed_by
    print(
        f"\nSIGTERM at run {at_sigterm['run']} with {interrupted} mid-file; {len(runs)} runs, "
        f"{total} records, each handled once"
    )

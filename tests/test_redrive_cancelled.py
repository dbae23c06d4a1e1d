"""A cancelled job leaves nothing behind: its report lists the files it never started and where its
listing stopped, and redrives (themselves cancelled, then run to the end) process exactly the rest.

520 objects make two listing pages; the job is cancelled while the first page is being processed,
so 20 keys were never even listed.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from s3batch.workflows.batch import S3BatchWorkflow
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import CancelledError
from temporalio.service import RPCError
from temporalio.worker import Worker

from s3batch import layout
from s3batch.formats.common import Record
from s3batch.handlers import HandlerResult, chunk_handler
from s3batch.jsonvalues import encode_json
from tests.helpers import run, wait_for
from tests.helpers.data import put_files
from tests.helpers.output import report
from tests.helpers.workers import record_reliability

N = 520
GATE = {"delay": 0.0}
"""Seconds the ``gated_passthrough`` handler sleeps per chunk (set by the test, read by the in-process worker)."""


@chunk_handler("gated_passthrough")
def gated_passthrough(records: Sequence[Record]) -> HandlerResult:
    time.sleep(GATE["delay"])
    return HandlerResult([encode_json(r.value) for r in records], [], encoded=True, dropped=0)


def body(i: int) -> bytes:
    return b'{"file": %d}\n' % i


async def _progress(client: Client, wid: str) -> Any:
    return await client.get_workflow_handle(wid).query(S3BatchWorkflow.progress)


async def _cancel_after(client: Client, wid: str, succeeded: int) -> None:
    await wait_for(
        lambda: _done_at_least(client, wid, succeeded), 60, f"{succeeded} files of {wid} done before cancelling"
    )
    handle = client.get_workflow_handle(wid)
    await handle.cancel()
    with pytest.raises(WorkflowFailureError) as failure:
        await handle.result()
    assert isinstance(failure.value.cause, CancelledError)


async def _done_at_least(client: Client, wid: str, n: int) -> bool:
    return (await _progress(client, wid)).files_succeeded >= n


async def _started(client: Client, wid: str) -> bool:
    try:
        await _progress(client, wid)
    except RPCError:
        return False
    return True


def _succeeded(rep: dict[str, Any]) -> list[str]:
    return [f["key"] for f in rep["files"] if f["status"] == "succeeded"]


async def test_redrives_of_a_cancelled_job_process_exactly_what_it_left(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets: tuple[str, str], request: pytest.FixtureRequest
) -> None:
    src, out = buckets
    keys = [f"c/{i:05d}.jsonl" for i in range(N)]
    put_files(s3, src, {keys[i]: body(i) for i in range(N)})
    job = {
        "bucket": src,
        "prefix": "c/",
        "output_bucket": out,
        "output_prefix": "o/",
        "handler": "gated_passthrough",
        "max_concurrent_files": 1,
        "group_max_files": 1,  # one activity per file: the pace is the handler's
    }
    GATE["delay"] = 0.3
    wid = f"cancelled-{uuid.uuid4().hex[:8]}"
    await client.start_workflow("S3BatchWorkflow", job, id=wid, task_queue=task_queue)
    await _cancel_after(client, wid, 3)

    first = report(s3, out)
    assert first["status"] == "cancelled"
    assert first["listing"]["done"] is False and first["listing"]["continuation_token"]
    assert first["totals"]["files_listed"] == 500 == len(first["files"])
    statuses = {f["status"] for f in first["files"]}
    assert statuses <= {"succeeded", "cancelled", "not_started"} and "not_started" in statuses
    assert sorted(f["key"] for f in first["files"]) == keys[:500]

    # A redrive, itself cancelled after a few files: its report hands on what is still left.
    r = await run("s3batch", "redrive", wid, "--task-queue", task_queue, "--json")
    assert r.code == 0, r
    second_id = json.loads(r.stdout)["workflow_id"]
    await _cancel_after(client, second_id, 2)
    second = report(s3, out)
    assert second["job_id"] == second_id and second["status"] == "cancelled"
    assert not set(_succeeded(second)) & set(_succeeded(first)), "a redrive processed a file again"
    assert second["listing"]["done"] is False, "the 20 keys the first job never listed are still due"

    # A last redrive, at full speed, finishes the job: its handler no longer waits, and once it runs it takes 8
    # files at once (`s3batch set-concurrency`; it inherits one at a time, and its 500-odd files took 90 s so).
    GATE["delay"] = 0.0
    third_id = f"{second_id}-last"
    redrive = asyncio.ensure_future(
        run("s3batch", "redrive", second_id, "--id", third_id, "--task-queue", task_queue, "--wait", "--json",
            timeout=300)
    )  # fmt: skip
    await wait_for(lambda: _started(client, third_id), 60, f"{third_id} started")
    faster = await run("s3batch", "set-concurrency", third_id, "8")
    r = await redrive
    assert faster.code == 0, faster
    assert r.code == 0, r
    third = report(s3, out)
    assert third["status"] == "succeeded" and third["listing"]["done"] is True
    done = _succeeded(first) + _succeeded(second) + _succeeded(third)
    assert sorted(done) == keys, "every key succeeded exactly once across the three jobs"
    assert {f["status"] for f in third["files"]} == {"succeeded"}

    # Every file's output is exactly its record (a cancelled file's committed part was reused).
    def part(i: int) -> bytes:
        return s3.get_object(Bucket=out, Key=layout.part_key("o/", keys[i], 0))["Body"].read()

    with ThreadPoolExecutor(16) as pool:
        parts = list(pool.map(part, range(N)))
    assert parts == [b'{"file":%d}\n' % i for i in range(N)]
    record_reliability(
        {
            "fault": "Job cancelled mid-listing (520 files, 2 pages), its redrive cancelled too, then redriven",
            "test": request.node.nodeid,
            "records_in": N,
            "records_out": len(parts),
            "lost": len(set(keys) - set(done)),
            "duplicates": len(done) - len(set(done)),
            "notes": f"succeeded per job: {len(_succeeded(first))}, {len(_succeeded(second))}, "
            f"{len(_succeeded(third))}; never-started and never-listed files carried by each report",
        }
    )

"""Big files in byte-range splits, end to end on the real stack: the workflow cuts a file over
``split_bytes`` into one activity per free slot, records one report entry for it, survives a SIGKILL of
the worker running a split, stops the splits on a cancel, and processes whole a file it cannot split
rather than read it wrong. (The splits' boundaries and resume, activity by activity: tests/test_splits.py.)"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from s3batch.workflows.batch import S3BatchWorkflow
from temporalio.client import Client, WorkflowFailureError
from temporalio.worker import Worker

from s3batch import client as api
from s3batch import layout
from s3batch.checkpoint import CHECKPOINT_METADATA, Checkpoint
from s3batch.models import S3BatchInput
from tests.helpers import wait_for
from tests.helpers.assertions import assert_exactly_once
from tests.helpers.data import csv_rows, make_csv
from tests.helpers.history import history_events, scheduled_activities
from tests.helpers.jobs import SLOW_HEARTBEAT_TIMEOUT
from tests.helpers.output import read_jsonl, report
from tests.helpers.workers import worker_process


def job(src: str, out: str, **kw: Any) -> S3BatchInput:
    options: dict[str, Any] = {
        "output_bucket": out,
        "output_prefix": "o/",
        "chunk_records": 1_000,
        "split_bytes": 64 * 1024,
        "max_concurrent_files": 4,
        "heartbeat_timeout_seconds": SLOW_HEARTBEAT_TIMEOUT,
    }
    return S3BatchInput(bucket=src, **{**options, **kw})


def parts(s3: Any, bucket: str, folder: str) -> list[Checkpoint]:
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=f"{folder}part-").get("Contents", [])
    heads = [s3.head_object(Bucket=bucket, Key=o["Key"]) for o in listed]
    return [Checkpoint.model_validate_json(h["Metadata"][CHECKPOINT_METADATA]) for h in heads]


async def test_a_big_file_runs_in_splits_at_once(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, worker: Worker
) -> None:
    src, out = buckets
    rows = 20_000
    s3.put_object(Bucket=src, Key="big.csv", Body=make_csv(rows))  # about 500 KB: 4 splits (4 slots)
    s3.put_object(Bucket=src, Key="small.csv", Body=make_csv(10))
    workflow_id = f"splits-{uuid.uuid4().hex[:8]}"
    result = await client.execute_workflow(
        S3BatchWorkflow.run, job(src, out), id=workflow_id, task_queue=task_queue
    )
    assert result.status == "succeeded"
    assert result.totals.records == rows + 10 and result.totals.files_succeeded == 2
    entries = {f["key"]: f for f in report(s3, out)["files"]}
    big = entries["big.csv"]
    assert big["splits"] == 4 and big["records"] == rows and big["records_written"] == rows
    assert big["bytes_read"] == len(make_csv(rows))
    assert "splits" not in entries["small.csv"]
    assert_exactly_once(s3, out, "o/big.csv/", rows)
    names = [o["Key"] for o in s3.list_objects_v2(Bucket=out, Prefix="o/big.csv/")["Contents"]]
    assert {n.split("/")[-1][:8] for n in names} == {"part-000", "part-001", "part-002", "part-003"}
    # One activity per split, all of the file (the small file's is the fifth).
    scheduled = scheduled_activities(await history_events(client, workflow_id))
    assert scheduled.count("s3batch.process_file") == 5, scheduled


async def test_a_file_that_cannot_be_split_is_processed_whole(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, worker: Worker
) -> None:
    """A quoted line break where a split begins: that split fails (never a record read two ways), the
    others stop, and the file is processed whole instead, with a warning; its split parts are removed."""
    src, out = buckets
    rows = [(i, f"one\ntwo {i}") for i in range(20_000)]
    body = "id,note\n" + "".join(f'{i},"{note}"\n' for i, note in rows)
    s3.put_object(Bucket=src, Key="quoted.csv", Body=body.encode())
    result = await client.execute_workflow(
        S3BatchWorkflow.run, job(src, out), id=f"quoted-{uuid.uuid4().hex[:8]}", task_queue=task_queue
    )
    assert result.status == "succeeded" and result.totals.records_written == len(rows)
    entry = report(s3, out)["files"][0]
    assert entry["status"] == "succeeded" and "splits" not in entry
    assert any("processed whole, not in splits" in w for w in entry["warnings"])
    assert [(int(r["id"]), r["note"]) for r in read_jsonl(s3, out, "o/quoted.csv/")] == rows
    names = [o["Key"].split("/")[-1] for o in s3.list_objects_v2(Bucket=out, Prefix="o/quoted.csv/")["Contents"]]
    assert all(layout.output_kind(n) is not None for n in names), names  # no split's part left


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
async def test_a_cancelled_job_stops_every_split(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, tmp_path: Path, fmt: str
) -> None:
    src, out = buckets
    rows = 40_000
    body = make_csv(rows) if fmt == "csv" else b"".join(json.dumps(r).encode() + b"\n" for r in csv_rows(rows))
    key = f"big.{fmt}"
    s3.put_object(Bucket=src, Key=key, Body=body)
    proc = worker_process(task_queue, tmp_path, "a", S3BATCH_TEST_HANDLER_DELAY="0.1")
    try:
        proc.wait_ready()
        handle = await client.start_workflow(
            S3BatchWorkflow.run,
            job(src, out, handler="slow_passthrough", split_bytes=len(body) // 4 + 1, chunk_records=200),
            id=f"cancel-splits-{uuid.uuid4().hex[:8]}",
            task_queue=task_queue,
        )
        await wait_for(lambda: len(parts(s3, out, f"o/{key}/")) >= 4, 60, "4 committed parts")
        # In flight: one row per split, each read within its own range (s3batch status / watch).
        view = await api.describe(client, handle.id)
        splits = sorted((f.split.index, f.split.count) for f in view.in_flight if f.split is not None)
        assert [i for i, _ in splits] == list(range(len(splits))) and len(splits) >= 2, view.in_flight
        for f in view.in_flight:
            assert f.key == key and (f.fraction is None or 0 <= f.fraction <= 1)
            assert f.to_json()["splits"] == splits[0][1]
        await handle.cancel()
        with pytest.raises(WorkflowFailureError):
            await handle.result()
    finally:
        proc.stop()
    entry = report(s3, out)["files"][0]
    assert entry["status"] == "cancelled" and entry["splits"] == 4
    listed = s3.list_objects_v2(Bucket=out, Prefix=f"o/{key}/part-").get("Contents", [])
    if fmt == "csv":
        # No split reached its end, where it checks that the next began at a record, not inside a quoted one: what
        # they wrote is void, removed with the report, and a redrive processes the file from its start.
        assert entry["split_void"] and entry["records"] == 0 and listed == [], (entry, listed)
        return
    # JSON Lines (a line feed always ends a record): what the report counts is what the splits committed, the last
    # part of each split, from which a redrive resumes them.
    last: dict[int, Checkpoint] = {}
    for o in listed:
        split = int(o["Key"].split("/")[-1].split("-")[1])
        cp = Checkpoint.model_validate_json(s3.head_object(Bucket=out, Key=o["Key"])["Metadata"][CHECKPOINT_METADATA])
        if split not in last or cp.chunk > last[split].chunk:
            last[split] = cp
    assert "split_void" not in entry and entry["records"] == sum(cp.next_record for cp in last.values()) < rows


@pytest.mark.slow
async def test_sigkill_of_the_worker_running_a_split(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, tmp_path: Path
) -> None:
    src, out = buckets
    rows = 40_000
    s3.put_object(Bucket=src, Key="big.csv", Body=make_csv(rows))
    first = worker_process(task_queue, tmp_path, "a", S3BATCH_TEST_HANDLER_DELAY="0.05")
    second = None
    try:
        first.wait_ready()
        handle = await client.start_workflow(
            S3BatchWorkflow.run,
            job(src, out, handler="slow_passthrough", split_bytes=400 * 1024, max_concurrent_files=2,
                heartbeat_timeout_seconds=5),
            id=f"kill-splits-{uuid.uuid4().hex[:8]}",
            task_queue=task_queue,
        )
        await wait_for(lambda: len(parts(s3, out, "o/big.csv/")) >= 6, 60, "6 committed parts")
        first.kill()
        second = worker_process(task_queue, tmp_path, "b")
        second.wait_ready()
        result = await asyncio.wait_for(handle.result(), 120)
        assert result.status == "succeeded"
    finally:
        first.stop()
        if second is not None:
            second.stop()
    entry = report(s3, out)["files"][0]
    assert entry["splits"] == min(-(-len(make_csv(rows)) // (400 * 1024)), 2)
    assert entry["records"] == rows and entry["attempts"] >= 2
    assert entry["resumed_from_record"] > 0  # the splits resumed from their checkpoints, not from the start
    assert_exactly_once(s3, out, "o/big.csv/", rows)


async def test_the_biggest_file_of_a_page_starts_first(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, worker: Worker
) -> None:
    """A big file listed after small ones is started first (it would otherwise start last and hold the job
    up after they are done); the small ones follow, still grouped."""
    src, out = buckets
    for i in range(6):
        s3.put_object(Bucket=src, Key=f"a-{i}.csv", Body=make_csv(10 + i))
    s3.put_object(Bucket=src, Key="z-big.csv", Body=make_csv(5_000))
    workflow_id = f"order-{uuid.uuid4().hex[:8]}"
    result = await client.execute_workflow(
        S3BatchWorkflow.run,
        job(src, out, split_bytes=None, max_concurrent_files=1, group_max_files=3, group_max_bytes=50_000),
        id=workflow_id,
        task_queue=task_queue,
    )
    assert result.status == "succeeded" and result.totals.files_succeeded == 7
    events = await history_events(client, workflow_id)
    summaries = [
        e.user_metadata.summary.data.decode() for e in events if e.HasField("activity_task_scheduled_event_attributes")
    ]
    files = [s for s in summaries if ".csv" in s]
    assert files[0] == '"z-big.csv"', summaries
    assert files[1:] == ['"a-5.csv and 2 more small files"', '"a-2.csv and 2 more small files"'], summaries

"""End-to-end: jobs through the real dev server and the real S3 server."""

from __future__ import annotations

import gzip
import json
import uuid
from typing import Any

from temporalio.client import Client, WorkflowFailureError
from temporalio.worker import Worker

from s3batch.models import S3BatchInput, S3BatchResult
from workflows.batch import S3BatchWorkflow


def read_jsonl(s3: Any, bucket: str, prefix: str, kind: str = "part") -> list[Any]:
    rows: list[Any] = []
    keys = sorted(
        o["Key"]
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        for o in page.get("Contents", [])
        if o["Key"].rsplit("/", 1)[-1].startswith(f"{kind}-")
    )
    for key in keys:
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        rows.extend(json.loads(line) for line in body.splitlines() if line)
    return rows


async def run_job(client: Client, task_queue: str, job: S3BatchInput) -> S3BatchResult:
    return await client.execute_workflow(
        S3BatchWorkflow.run, job, id=f"job-{uuid.uuid4().hex[:8]}", task_queue=task_queue
    )


async def test_csv_jsonl_gzip_end_to_end(client: Client, worker: Worker, task_queue: str, s3: Any, buckets):
    src, out = buckets
    csv_rows = ["id,name,note"] + [f'{i},name {i},"quoted, with comma\nand newline {i}"' for i in range(2500)]
    s3.put_object(Bucket=src, Key="in/customers.csv", Body=("\r\n".join(csv_rows) + "\r\n").encode())
    jsonl = "".join(json.dumps({"n": i}) + "\n" for i in range(1200)) + "{not json}\n"
    s3.put_object(Bucket=src, Key="in/events.jsonl", Body=jsonl.encode())
    s3.put_object(Bucket=src, Key="in/events2.jsonl.gz", Body=gzip.compress(jsonl.encode()))
    s3.put_object(Bucket=src, Key="in/folder/", Body=b"")

    result = await run_job(
        client,
        task_queue,
        S3BatchInput(bucket=src, prefix="in/", output_bucket=out, output_prefix="run1/", chunk_records=1000),
    )
    assert result.status == "succeeded"
    assert result.totals.files_listed == 3
    assert result.totals.files_succeeded == 3
    assert result.totals.records_written == 2500 + 1200 * 2
    assert result.totals.rejected == 2

    rows = read_jsonl(s3, out, "run1/in/customers.csv/")
    assert [int(r["id"]) for r in rows] == list(range(2500))
    assert rows[7]["note"] == "quoted, with comma\nand newline 7"
    assert len(read_jsonl(s3, out, "run1/in/events2.jsonl.gz/")) == 1200
    rejects = read_jsonl(s3, out, "run1/in/events.jsonl/", "rejects")
    assert len(rejects) == 1 and rejects[0]["line"] == 1201 and "invalid JSON" in rejects[0]["reason"]

    report = json.loads(s3.get_object(Bucket=out, Key="run1/_report.json")["Body"].read())
    assert report["status"] == "succeeded"
    by_key = {f["key"]: f for f in report["files"]}
    assert set(by_key) == {"in/customers.csv", "in/events.jsonl", "in/events2.jsonl.gz"}
    assert by_key["in/customers.csv"]["records"] == 2500
    assert by_key["in/customers.csv"]["resumed_from_record"] == 0


async def test_empty_prefix_is_a_successful_empty_job(client: Client, worker: Worker, task_queue: str, buckets):
    src, out = buckets
    result = await run_job(client, task_queue, S3BatchInput(bucket=src, prefix="nothing/", output_bucket=out))
    assert result.status == "succeeded"
    assert result.totals.files_listed == 0


async def test_bad_input_fails_fast_naming_the_field(client: Client, worker: Worker, task_queue: str):
    try:
        await client.execute_workflow(
            "S3BatchWorkflow",
            {"bucket": "incoming", "output_bucket": "processed", "chunk_records": -5, "colour": "red"},
            id=f"bad-{uuid.uuid4().hex[:8]}",
            task_queue=task_queue,
        )
    except WorkflowFailureError as err:
        cause = err.cause
        assert cause.type == "InvalidInput"
        assert "chunk_records" in cause.message and "colour" in cause.message
    else:
        raise AssertionError("a bad input must fail the workflow")


async def test_small_files_are_grouped_and_a_bad_one_fails_alone(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets
):
    src, out = buckets
    for i in range(25):
        s3.put_object(Bucket=src, Key=f"small/{i:02d}.jsonl", Body=f'{{"i": {i}}}\n'.encode())
    s3.put_object(Bucket=src, Key="small/13.txt", Body=b"not a known format\n")
    job_id = f"group-{uuid.uuid4().hex[:8]}"
    result = await client.execute_workflow(
        S3BatchWorkflow.run,
        S3BatchInput(bucket=src, prefix="small/", output_bucket=out, group_max_files=10, max_failed_files=1),
        id=job_id,
        task_queue=task_queue,
    )
    assert result.totals.files_succeeded == 25
    assert result.totals.files_failed == 1
    assert result.totals.records_written == 25
    history = await client.get_workflow_handle(job_id).fetch_history()
    scheduled = [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
    ]
    assert scheduled.count("s3batch.process_group") == 3  # 26 files, groups of at most 10
    assert "s3batch.process_file" not in scheduled
    report = json.loads(s3.get_object(Bucket=out, Key="_report.json")["Body"].read())
    failed = [f for f in report["files"] if f["status"] == "failed"]
    assert [f["key"] for f in failed] == ["small/13.txt"]
    assert failed[0]["error"].startswith("BadFile: cannot tell the format of 'small/13.txt'")


async def test_redrive_processes_only_the_failed_files_and_resumes_their_parts(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets
):
    src, out = buckets
    good = "".join(json.dumps({"n": i}) + "\n" for i in range(30))
    for name in ("a", "b", "c"):
        s3.put_object(Bucket=src, Key=f"rd/{name}.jsonl", Body=good.encode())
    s3.put_object(Bucket=src, Key="rd/d.data", Body=good.encode())  # unknown extension: fails
    job = S3BatchInput(bucket=src, prefix="rd/", output_bucket=out, output_prefix="o/", max_failed_files=1)
    first = await run_job(client, task_queue, job)
    assert (first.totals.files_succeeded, first.totals.files_failed) == (3, 1)

    # The operator fixes the file, then redrives: only d is processed, into the same layout.
    s3.copy_object(Bucket=src, Key="rd/d.jsonl", CopySource={"Bucket": src, "Key": "rd/d.data"})
    s3.put_object(Bucket=src, Key="rd/d.data", Body=good.encode())
    redrive = job.model_copy(update={"output_prefix": "o/", "only_failed_of": f"s3://{out}/o/_report.json",
                                     "format": "jsonl", "max_failed_files": 0})
    second = await run_job(client, task_queue, redrive)
    assert second.totals.files_listed == 1
    assert second.totals.records_written == 30
    report = json.loads(s3.get_object(Bucket=out, Key="o/_report.json")["Body"].read())
    assert [f["key"] for f in report["files"]] == ["rd/d.data"]
    assert len(read_jsonl(s3, out, "o/rd/d.data/")) == 30


async def test_redrive_of_a_missing_report_fails_before_any_file(
    client: Client, worker: Worker, task_queue: str, buckets
):
    src, out = buckets
    job = S3BatchInput(bucket=src, output_bucket=out, output_prefix="o/", only_failed_of=f"s3://{out}/nope/_report.json")
    try:
        await run_job(client, task_queue, job)
    except WorkflowFailureError as err:
        assert err.cause.cause.type == "NotFound"
        assert f"s3://{out}/nope/_report.json" in err.cause.cause.message
    else:
        raise AssertionError("expected a failure")


async def test_versioned_bucket_pins_the_version_in_the_checkpoint(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets
):
    src, out = buckets
    s3.put_bucket_versioning(Bucket=src, VersioningConfiguration={"Status": "Enabled"})
    put = s3.put_object(Bucket=src, Key="v/a.jsonl", Body=b"".join(b'{"n": %d}\n' % i for i in range(50)))
    result = await run_job(
        client, task_queue, S3BatchInput(bucket=src, prefix="v/", output_bucket=out, chunk_records=20)
    )
    assert result.totals.records_written == 50
    head = s3.head_object(Bucket=out, Key="v/a.jsonl/part-00002.jsonl")
    checkpoint = json.loads(head["Metadata"]["s3batch-checkpoint"])
    assert checkpoint["version_id"] == put["VersionId"]
    assert checkpoint["done"] is True and checkpoint["next_record"] == 50


async def test_rerun_of_a_grouped_job_finds_the_committed_output(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets
):
    src, out = buckets
    for i in range(5):
        s3.put_object(Bucket=src, Key=f"re/{i}.jsonl", Body=b'{"a": 1}\n{"a": 2}\n')
    job = S3BatchInput(bucket=src, prefix="re/", output_bucket=out, output_prefix="o/")
    await run_job(client, task_queue, job)
    before = {o["Key"]: o["ETag"] for o in s3.list_objects_v2(Bucket=out, Prefix="o/re/")["Contents"]}
    again = await run_job(client, task_queue, job)
    assert again.totals.records_written == 10
    report = json.loads(s3.get_object(Bucket=out, Key="o/_report.json")["Body"].read())
    # Every file was found complete: nothing was processed again.
    assert [f["resumed_from_record"] for f in report["files"]] == [2] * 5
    after = {o["Key"]: o["ETag"] for o in s3.list_objects_v2(Bucket=out, Prefix="o/re/")["Contents"]}
    assert after == before

"""End-to-end: jobs through the real dev server and the real S3 server."""

from __future__ import annotations

import gzip
import json
import uuid
from typing import Any

from s3batch.workflows.batch import S3BatchWorkflow
from temporalio.client import Client, WorkflowFailureError
from temporalio.worker import Worker

import tests.fault_handlers as fault_handlers
from s3batch.models import S3BatchInput
from tests.helpers.jobs import execute, job_error
from tests.helpers.output import read_jsonl, report


async def test_csv_jsonl_gzip_end_to_end(client: Client, worker: Worker, task_queue: str, s3: Any, buckets):
    src, out = buckets
    csv_rows = ["id,name,note"] + [f'{i},name {i},"quoted, with comma\nand newline {i}"' for i in range(2500)]
    s3.put_object(Bucket=src, Key="in/customers.csv", Body=("\r\n".join(csv_rows) + "\r\n").encode())
    jsonl = "".join(json.dumps({"n": i}) + "\n" for i in range(1200)) + "{not json}\n"
    s3.put_object(Bucket=src, Key="in/events.jsonl", Body=jsonl.encode())
    s3.put_object(Bucket=src, Key="in/events2.jsonl.gz", Body=gzip.compress(jsonl.encode()))
    s3.put_object(Bucket=src, Key="in/folder/", Body=b"")

    result = await execute(
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
    notes = [f"quoted, with comma\nand newline {i}" for i in range(2500)]
    assert rows == [{"id": str(i), "name": f"name {i}", "note": notes[i]} for i in range(2500)]
    events = [{"n": i} for i in range(1200)]
    assert read_jsonl(s3, out, "run1/in/events.jsonl/") == events
    assert read_jsonl(s3, out, "run1/in/events2.jsonl.gz/") == events
    for name in ("events.jsonl", "events2.jsonl.gz"):
        [reject] = read_jsonl(s3, out, f"run1/in/{name}/", "rejects")
        assert reject["line"] == 1201 and "invalid JSON" in reject["reason"]
    assert read_jsonl(s3, out, "run1/in/customers.csv/", "rejects") == []

    report = json.loads(s3.get_object(Bucket=out, Key="run1/_report.json")["Body"].read())
    assert report["status"] == "succeeded"
    by_key = {f["key"]: f for f in report["files"]}
    assert set(by_key) == {"in/customers.csv", "in/events.jsonl", "in/events2.jsonl.gz"}
    assert by_key["in/customers.csv"]["records"] == 2500
    assert by_key["in/customers.csv"]["resumed_from_record"] == 0


async def test_empty_prefix_is_a_successful_empty_job(client: Client, worker: Worker, task_queue: str, buckets):
    src, out = buckets
    result = await execute(client, task_queue, S3BatchInput(bucket=src, prefix="nothing/", output_bucket=out))
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
    for i in range(25):
        assert read_jsonl(s3, out, f"small/{i:02d}.jsonl/") == [{"i": i}]
    assert read_jsonl(s3, out, "small/13.txt/") == []
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
    """``d`` fails at record 25 (its handler cannot process it yet) after committing two chunks of
    10; the operator deploys a fixed handler and redrives: only ``d`` runs, resuming at record 20."""
    src, out = buckets
    good = [{"n": i} for i in range(30)]
    for name in ("a", "b", "c"):
        s3.put_object(Bucket=src, Key=f"rd/{name}.jsonl", Body=b"".join(json.dumps(r).encode() + b"\n" for r in good))
    bad = [*good[:25], {"n": 25, "note": "BOOM"}, *good[26:]]
    s3.put_object(Bucket=src, Key="rd/d.jsonl", Body=b"".join(json.dumps(r).encode() + b"\n" for r in bad))
    job = S3BatchInput(
        bucket=src, prefix="rd/", output_bucket=out, output_prefix="o/", handler="explode_until_fixed",
        chunk_records=10, max_attempts=1, max_failed_files=1,
    )
    first = await execute(client, task_queue, job)
    assert (first.totals.files_succeeded, first.totals.files_failed) == (3, 1)
    failed = {f["key"]: f for f in report(s3, out, "o/")["files"]}["rd/d.jsonl"]
    assert failed["status"] == "failed" and failed["error"].startswith("HandlerError: ")
    assert read_jsonl(s3, out, "o/rd/d.jsonl/") == good[:20], "the failed file must have committed two parts"

    fault_handlers.BOOM_FIXED = True
    try:
        redrive = job.model_copy(update={"only_failed_of": f"s3://{out}/o/_report.json", "max_failed_files": 0})
        second = await execute(client, task_queue, redrive)
    finally:
        fault_handlers.BOOM_FIXED = False
    assert second.totals.files_listed == 1
    assert second.totals.records_written == 30
    [entry] = report(s3, out, "o/")["files"]
    assert entry["key"] == "rd/d.jsonl" and entry["status"] == "succeeded"
    assert entry["resumed_from_record"] == 20  # only the chunks it had not committed were processed
    assert read_jsonl(s3, out, "o/rd/d.jsonl/") == bad
    for name in ("a", "b", "c"):
        assert read_jsonl(s3, out, f"o/rd/{name}.jsonl/") == good


async def test_rejects_of_a_chunk_are_in_line_order(client: Client, worker: Worker, task_queue: str, s3: Any, buckets):
    """Parser rejects (wrong field count) and handler rejects (invalid rows) of one chunk, interleaved:
    the rejects object lists them by line, as docs/reference/formats.md says."""
    src, out = buckets
    lines = [
        "customer_id,email,name,country,amount,created_at",
        "1,not-an-email,Ann,FR,1,2024-01-02T03:04:05Z",  # line 2: handler reject (email)
        "2,b@example.com,Bob",  # line 3: parser reject (field count)
        "3,c@example.com,Cid,fr,1,2024-01-02T03:04:05Z",  # line 4: handler reject (country)
        "4,d@example.com,Dee,FR",  # line 5: parser reject
        "5,e@example.com,Eve,FR,2.50,2024-01-02T03:04:05Z",  # line 6: written
    ]
    s3.put_object(Bucket=src, Key="c/customers.csv", Body=("\n".join(lines) + "\n").encode())
    result = await execute(
        client, task_queue, S3BatchInput(bucket=src, prefix="c/", output_bucket=out, handler="customers")
    )
    assert (result.totals.records_written, result.totals.rejected) == (1, 4)
    rejects = read_jsonl(s3, out, "c/customers.csv/", "rejects")
    assert [r["line"] for r in rejects] == [2, 3, 4, 5]
    assert rejects[0]["reason"].startswith("email: ") and rejects[2]["reason"].startswith("country: ")
    assert rejects[1]["record"] is None and rejects[3]["record"] is None
    assert [r["customer_id"] for r in read_jsonl(s3, out, "c/customers.csv/")] == [5]


async def test_redrive_of_a_missing_report_fails_before_any_file(
    client: Client, worker: Worker, task_queue: str, buckets
):
    src, out = buckets
    job = S3BatchInput(bucket=src, output_bucket=out, output_prefix="o/", only_failed_of=f"s3://{out}/nope/_report.json")
    try:
        await execute(client, task_queue, job)
    except WorkflowFailureError as err:
        cause = job_error(err)
        assert cause.type == "NotFound"
        assert f"s3://{out}/nope/_report.json" in cause.message
    else:
        raise AssertionError("expected a failure")


async def test_versioned_bucket_pins_the_version_in_the_checkpoint(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets
):
    src, out = buckets
    s3.put_bucket_versioning(Bucket=src, VersioningConfiguration={"Status": "Enabled"})
    put = s3.put_object(Bucket=src, Key="v/a.jsonl", Body=b"".join(b'{"n": %d}\n' % i for i in range(50)))
    result = await execute(
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
    await execute(client, task_queue, job)
    before = {o["Key"]: o["ETag"] for o in s3.list_objects_v2(Bucket=out, Prefix="o/re/")["Contents"]}
    again = await execute(client, task_queue, job)
    # Written by the first job: none by this one (tests/test_reimport_report.py).
    assert (again.totals.records_written, again.totals.already_written) == (0, 10)
    report = json.loads(s3.get_object(Bucket=out, Key="o/_report.json")["Body"].read())
    # Every file was found complete: nothing was processed again.
    assert [f["resumed_from_record"] for f in report["files"]] == [2] * 5
    after = {o["Key"]: o["ETag"] for o in s3.list_objects_v2(Bucket=out, Prefix="o/re/")["Contents"]}
    assert after == before

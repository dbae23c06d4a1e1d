"""Issue 19, the data path and the S3 side: no record contents in history, the report or logs
(point 2); ExpectedBucketOwner, allow-lists and server-side encryption (point 5); worker-side ceilings
and byte budgets (point 6); checkpoints that cannot be forged (point 9). Real SeaweedFS and a real
Temporal dev server, as everywhere."""

from __future__ import annotations

import csv
import gzip
import json
import logging
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, field_validator
from s3batch.activities.s3_activities import S3Activities
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment
from temporalio.worker import Worker

from s3batch import layout
from s3batch.checkpoint import CHECKPOINT_MAC_METADATA, CHECKPOINT_METADATA
from s3batch.config import Settings
from s3batch.formats.common import Record
from s3batch.handlers import HandlerResult, Reject, chunk_handler
from s3batch.messages import (
    FinalReportInput,
    ListObjectsInput,
    ObjectRef,
    ProcessFileInput,
    ProcessGroupInput,
    ReportSegmentInput,
    SplitRange,
    Totals,
)
from s3batch.models import JobSpec, S3BatchInput
from s3batch.s3io import make_client
from tests.helpers.history import history_text
from tests.helpers.output import committed_parts, read_jsonl, report

MARKER = "SECRET-7d1f"
"""Placed in record values, in keys of dict fields and in a validator's message: it must never reach
workflow history, the report or the worker's log."""


# ------------------------------------------------------------------------------- point 2: handlers


class _SecRecord(BaseModel):
    """A handler's record model with a custom validator that quotes the value."""

    model_config = ConfigDict(extra="forbid")

    id: int
    tags: dict[str, int] = {}
    note: str = ""

    @field_validator("note")
    @classmethod
    def _note(cls, value: str) -> str:
        if MARKER in value:
            raise ValueError(f"note {value!r} is not allowed")
        return value


class _Unordered(int):
    """A reject's line number from a handler that raises, quoting the record, when compared (sorted)."""

    value: Any = None

    def __lt__(self, other: Any) -> bool:
        raise ValueError(f"cannot order {self.value!r}")


def _unordered(line: int, value: Any) -> _Unordered:
    number = _Unordered(line)
    number.value = value
    return number


def _lazy(records: Sequence[Record]) -> Iterator[Any]:
    for r in records:
        if MARKER in json.dumps(r.value):
            raise ValueError(f"bad record {r.value!r}")
        yield r.value


@chunk_handler("sec_marker")
def sec_marker(records: Sequence[Record]) -> HandlerResult:
    """Fails in the way the record's ``mode`` asks, each time with the record in the error's text."""
    mode = records[0].value["mode"]
    if mode == "lazy":  # a lazy iterator that raises while s3batch consumes it
        return HandlerResult(_lazy(records), [], dropped=0)  # type: ignore[arg-type]
    if mode == "validate":  # a pydantic ValidationError: dict keys, undeclared fields, a validator
        for r in records:
            _SecRecord.model_validate({k: v for k, v in r.value.items() if k != "mode"})
    if mode == "sort":  # an error s3batch does not expect, after the handler returned
        return HandlerResult([], [Reject(_unordered(r.line, r.value), "x", r.value) for r in records], dropped=0)  # type: ignore[arg-type]
    return HandlerResult([r.value for r in records], [], dropped=0)


async def test_no_record_contents_in_history_report_or_logs(
    client: Client, worker: Worker, task_queue: str, buckets: tuple[str, str], s3: Any, caplog: Any
) -> None:
    src, out = buckets
    lines = {
        "lazy": [{"mode": "lazy", "id": 1}, {"mode": "lazy", "id": 2, "v": MARKER}],
        "validate": [{"mode": "validate", "id": 1, "tags": {MARKER: "x"}, MARKER: 1, "note": f"a {MARKER}"}],
        "sort": [{"mode": "sort", "id": 1, "v": MARKER}, {"mode": "sort", "id": 2, "v": MARKER}],
    }
    for name, rows in lines.items():
        s3.put_object(Bucket=src, Key=f"m/{name}.jsonl", Body=b"".join(json.dumps(r).encode() + b"\n" for r in rows))
    s3.put_object(Bucket=src, Key="m/bad.jsonl.gz", Body=MARKER.encode() * 100)  # not gzip data
    job_id = f"sec-{uuid.uuid4().hex[:8]}"
    caplog.set_level(logging.DEBUG)
    result = await client.execute_workflow(
        "S3BatchWorkflow",
        S3BatchInput(
            bucket=src, prefix="m/", output_bucket=out, output_prefix="o/", handler="sec_marker", max_attempts=1,
            max_failed_files=10,
        ),
        id=job_id,
        task_queue=task_queue,
        result_type=dict,
    )
    assert result["totals"]["files_failed"] == 4, result
    job_report = report(s3, out)
    errors = {f["key"]: f["error"] for f in job_report["files"]}
    assert errors["m/lazy.jsonl"].startswith("HandlerError: handler 'sec_marker' raised ValueError on")
    assert "note: invalid value (value_error; message withheld)" in errors["m/validate.jsonl"]
    assert "tags.*: Input should be a valid integer" in errors["m/validate.jsonl"]
    assert "*: Extra inputs are not permitted" in errors["m/validate.jsonl"]
    assert errors["m/sort.jsonl"].startswith("ValueError: unexpected error processing s3://")
    assert "is not gzip data" in errors["m/bad.jsonl.gz"] and "b'" not in errors["m/bad.jsonl.gz"]
    history = await history_text(client, job_id)
    assert "HandlerError" in history  # the failures are there, without their records
    for where, text in [
        ("history", history),
        ("report", json.dumps(job_report)),
        ("log", caplog.text + "".join(r.getMessage() for r in caplog.records)),
    ]:
        assert MARKER not in text, f"the marker reached the {where}"



# ------------------------------------------------------------------------ activity-level helpers


def _upload(s3: Any, bucket: str, key: str, body: bytes) -> ObjectRef:
    s3.put_object(Bucket=bucket, Key=key, Body=body)
    head = s3.head_object(Bucket=bucket, Key=key)
    return ObjectRef(key=key, etag=head["ETag"].strip('"'), size=head["ContentLength"])


def _file(buckets: tuple[str, str], obj: ObjectRef, **options: Any) -> ProcessFileInput:
    src, out = buckets
    fields: dict[str, Any] = {"format": "auto", "handler": "passthrough", "chunk_records": 500, "output_prefix": "o/"}
    fields["max_record_bytes"] = 1024 * 1024
    fields.update(options)
    return ProcessFileInput(job_id="sec", bucket=src, obj=obj, output_bucket=out, **fields)


def _job(buckets: tuple[str, str], **options: Any) -> JobSpec:
    src, out = buckets
    fields: dict[str, Any] = {"prefix": "in/", "output_prefix": "o/", **options}
    return JobSpec(bucket=src, output_bucket=out, **fields)


def _run(activities: S3Activities, method: str, arg: Any) -> Any:
    return ActivityEnvironment().run(getattr(activities, method), arg)


def _invalid(activities: S3Activities, method: str, arg: Any) -> str:
    with pytest.raises(ApplicationError) as info:
        _run(activities, method, arg)
    assert info.value.type == "InvalidInput" and info.value.non_retryable, info.value
    return info.value.message


def _rows(n: int, pad: int = 0) -> bytes:
    return b"id,name\n" + b"".join(f"{i},{'n' * pad}{i}\n".encode() for i in range(n))


def _part_rows(s3: Any, out: str, key: str) -> tuple[list[Any], list[int]]:
    folder = layout.file_dir("o/", key)
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=out, Prefix=folder + "part-").get("Contents", []))
    rows: list[Any] = []
    sizes = []
    for k in keys:
        body = s3.get_object(Bucket=out, Key=k)["Body"].read()
        sizes.append(len(body))
        rows.extend(json.loads(line) for line in body.splitlines() if line)
    return rows, sizes


# ------------------------------------------------------------------------ point 6: bounded cost


def test_ceilings_refuse_a_job_or_file_asking_for_more(s3: Any, buckets: tuple[str, str]) -> None:
    acts = S3Activities(s3, Settings(max_chunk_records=1_000, max_record_bytes=64 * 1024))
    obj = _upload(s3, buckets[0], "in/a.csv", _rows(3))
    message = _invalid(acts, "check_job", _job(buckets, chunk_records=5_000))
    assert "chunk_records=5000, over this worker's ceiling of 1000 (S3BATCH_MAX_CHUNK_RECORDS)" in message
    message = _invalid(acts, "check_job", _job(buckets, chunk_records=1_000, max_record_bytes=1024 * 1024))
    assert "max_record_bytes=1048576, over this worker's ceiling of 65536 (S3BATCH_MAX_RECORD_BYTES)" in message
    # A workflow input reaches the file activity even if the check was skipped: checked there too.
    message = _invalid(acts, "process_file", _file(buckets, obj, chunk_records=5_000))
    assert "s3://" in message and "S3BATCH_MAX_CHUNK_RECORDS" in message
    assert _run(acts, "check_job", _job(buckets, chunk_records=1_000, max_record_bytes=1_024))  # lower: fine
    assert _run(acts, "process_file", _file(buckets, obj, max_record_bytes=64 * 1024)).status == "succeeded"


def test_a_chunk_is_closed_at_the_byte_budget_and_resumes_exactly(s3: Any, buckets: tuple[str, str]) -> None:
    """chunk_records x max_record_bytes cannot make a chunk's buffer grow past the worker's budget."""
    budget = 16 * 1024
    acts = S3Activities(s3, Settings(max_chunk_bytes=budget))
    body = _rows(2_000, pad=40)  # ~100 KB of source, ~130 KB of output, in one chunk of 10,000 records
    obj = _upload(s3, buckets[0], "in/big.csv", body)
    result = _run(acts, "process_file", _file(buckets, obj, chunk_records=10_000))
    assert result.status == "succeeded" and result.records == 2_000
    rows, sizes = _part_rows(s3, buckets[1], obj.key)
    assert [int(r["id"]) for r in rows] == list(range(2_000))  # every record once, in order
    assert result.chunks == len(sizes) >= len(body) // budget
    assert max(sizes) <= budget * 5 // 4, sizes  # the budget, plus at most one sub-batch's output
    # Each part's checkpoint is exact: it says where the next part starts.
    cps = committed_parts(s3, buckets[1], layout.file_dir("o/", obj.key))
    assert [cp.chunk for cp in cps] == list(range(1, len(sizes) + 1)) and cps[-1].byte_offset == len(body)
    for cp in cps[:-1]:
        assert body[cp.byte_offset :].startswith(f"{cp.next_record},".encode())  # record i has id i

async def test_a_csv_record_of_60001_short_lines_is_a_reject(
    client: Client, worker: Worker, task_queue: str, buckets: tuple[str, str], s3: Any
) -> None:
    """max_record_bytes bounds a record, not a line: a quoted field of 60,001 short lines is one
    record over the limit, rejected (never built in memory), and the records around it are read."""
    src, out = buckets
    record = b'1,"' + b"ab\n" * 60_001 + b'"\n'
    s3.put_object(Bucket=src, Key="in/tall.csv", Body=b"id,note\n0,ok\n" + record + b"2,fine\n")
    result = await client.execute_workflow(
        "S3BatchWorkflow",
        S3BatchInput(bucket=src, prefix="in/", output_bucket=out, output_prefix="o/", max_record_bytes=64 * 1024),
        id=f"sec-tall-{uuid.uuid4().hex[:8]}",
        task_queue=task_queue,
        result_type=dict,
    )
    assert result["totals"]["records"] == 3 and result["totals"]["rejected"] == 1, result
    assert [r["id"] for r in read_jsonl(s3, out, "o/")] == ["0", "2"]
    rejects = read_jsonl(s3, out, "o/", kind="rejects")
    assert [(r["line"], r["record"]) for r in rejects] == [(3, None)]
    assert "longer than max_record_bytes (65536 bytes)" in rejects[0]["reason"]


# ---------------------------------------------------------------------- point 5: least privilege

OWNER = "123456789012"


class _Requests:
    """Records every request a client sends (operation and headers); optionally stops one."""

    def __init__(self, client: Any, stop: str | None = None) -> None:
        self.sent: list[tuple[str, dict[str, str]]] = []
        self.stop = stop
        client.meta.events.register("before-send.s3", self._record)

    def _record(self, request: Any, event_name: str, **_: Any) -> None:
        operation = event_name.rsplit(".", 1)[-1]
        headers = {k.lower(): v.decode() if isinstance(v, bytes) else v for k, v in request.headers.items()}
        self.sent.append((operation, headers))
        if operation == self.stop:
            raise _Stopped(operation)


class _Stopped(Exception):
    pass


def _report_input(buckets: tuple[str, str], files: list[Any]) -> FinalReportInput:
    totals = Totals(files_listed=len(files), files_succeeded=len(files), records=sum(f.records for f in files))
    totals.records_written = sum(f.records_written for f in files)
    totals.rejected = sum(f.rejected for f in files)
    totals.bytes_read = sum(f.bytes_read for f in files)
    return FinalReportInput(job_id="sec", job=_job(buckets), status="succeeded", totals=totals, segments=1, files=[])


def test_expected_bucket_owner_is_sent_on_every_call(s3: Any, buckets: tuple[str, str]) -> None:
    """SeaweedFS ignores the header (the calls succeed); S3 refuses a bucket of another account."""
    src, out = buckets
    client = make_client(expected_bucket_owner=OWNER)
    sent = _Requests(client)
    acts = S3Activities(client, Settings())
    obj = _upload(s3, src, "in/a.csv", _rows(10))
    s3.put_object(Bucket=out, Key=layout.file_dir("o/", obj.key) + "part-00007.jsonl", Body=b"stale")
    assert _run(acts, "check_job", _job(buckets))
    assert _run(acts, "list_objects", ListObjectsInput(bucket=src, prefix="in/")).objects
    result = _run(acts, "process_file", _file(buckets, obj, chunk_records=4))
    segment = ReportSegmentInput(output_bucket=out, output_prefix="o/", segment=0, files=[result])
    _run(acts, "write_report_segment", segment)
    _run(acts, "write_report", _report_input(buckets, [result]))
    client.copy_object(Bucket=out, Key="copy.json", CopySource={"Bucket": out, "Key": layout.report_key("o/")})
    operations = {op for op, _ in sent.sent}
    every = {"ListObjectsV2", "PutObject", "GetObject", "HeadObject", "DeleteObjects", "CopyObject"}
    assert every <= operations, operations
    for op, headers in sent.sent:
        assert headers.get("x-amz-expected-bucket-owner") == OWNER, op
        if op == "CopyObject":
            assert headers.get("x-amz-source-expected-bucket-owner") == OWNER
    assert layout.part_name(7) not in [k.rsplit("/", 1)[-1] for k in _keys(s3, out)]  # the stale part was deleted


def _keys(s3: Any, bucket: str) -> list[str]:
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket)
    return [o["Key"] for page in pages for o in page.get("Contents", [])]


def test_allow_lists_refuse_buckets_and_prefixes_before_any_request(s3: Any, buckets: tuple[str, str]) -> None:
    src, out = buckets
    settings = Settings(allowed_sources=f"{src}/in/*, other-bucket/*", allowed_outputs=f"{out}/runs/*")
    client = make_client(expected_bucket_owner="")
    sent = _Requests(client)
    acts = S3Activities(client, settings)
    message = _invalid(acts, "check_job", _job(buckets))  # output_prefix "o/"
    assert f"may not write to s3://{out}/o/" in message and f"S3BATCH_ALLOWED_OUTPUTS ({out}/runs/*)" in message
    message = _invalid(acts, "check_job", _job(buckets, prefix="secret/", output_prefix="runs/1/"))
    assert f"may not read from s3://{src}/secret/" in message and "S3BATCH_ALLOWED_SOURCES" in message
    listing = ListObjectsInput(bucket=src, prefix="secret/")
    assert "S3BATCH_ALLOWED_SOURCES" in _invalid(acts, "list_objects", listing)
    assert sent.sent == []  # refused before any S3 request
    assert _run(acts, "check_job", _job(buckets, output_prefix="runs/1/"))
    redrive = _job(buckets, output_prefix="runs/2/", only_failed_of="s3://elsewhere/o/_report.json")
    message = _invalid(acts, "check_job", redrive)
    assert "s3://elsewhere/o/_report.json" in message
    assert "S3BATCH_ALLOWED_OUTPUTS or S3BATCH_ALLOWED_SOURCES" in message
    # A workflow input reaches the file activities even without check_job: they check again.
    secret = _upload(s3, src, "secret/x.csv", _rows(2))
    message = _invalid(acts, "process_file", _file(buckets, secret, output_prefix="runs/1/"))
    assert f"s3://{src}/secret/x.csv" in message and "S3BATCH_ALLOWED_SOURCES" in message
    group = ProcessGroupInput(file=_file(buckets, secret, output_prefix="o/"), more=[])
    assert "S3BATCH_ALLOWED_OUTPUTS" in _invalid(acts, "process_group", group)
    assert "S3BATCH_ALLOWED_OUTPUTS" in _invalid(acts, "write_report", _report_input(buckets, []))
    assert not [k for k in _keys(s3, out) if not k.startswith("runs/1/_s3batch/")]  # nothing else written
    allowed = _upload(s3, src, "in/ok.csv", _rows(2))
    assert _run(acts, "process_file", _file(buckets, allowed, output_prefix="runs/1/")).status == "succeeded"


def test_outputs_are_written_with_server_side_encryption(s3: Any, buckets: tuple[str, str]) -> None:
    """SSE-S3 (AES256) on every PUT: write check, parts, rejects, report segments, report."""
    src, out = buckets
    acts = S3Activities(s3, Settings(output_sse="AES256"))
    obj = _upload(s3, src, "in/a.csv", b"id,name\n0,a\n1,b,extra\n2,c\n")
    _run(acts, "check_job", _job(buckets))
    result = _run(acts, "process_file", _file(buckets, obj, chunk_records=2))
    assert result.rejected == 1
    segment = ReportSegmentInput(output_bucket=out, output_prefix="o/", segment=0, files=[result])
    _run(acts, "write_report_segment", segment)
    _run(acts, "write_report", _report_input(buckets, [result]))
    written = _keys(s3, out)
    kinds = {k.rsplit("/", 1)[-1].split("-")[0] for k in written}
    assert {"part", "rejects", "report", "write", "_report.json"} <= kinds, written
    for key in written:
        assert s3.head_object(Bucket=out, Key=key).get("ServerSideEncryption") == "AES256", key


def test_sse_kms_sends_the_key_id(s3: Any, buckets: tuple[str, str]) -> None:
    """SeaweedFS without a KMS answers InternalError to aws:kms: what is sent is checked instead."""
    key_id = "arn:aws:kms:eu-west-1:123456789012:key/0b2c"
    client = make_client(expected_bucket_owner="")
    sent = _Requests(client, stop="PutObject")
    acts = S3Activities(client, Settings(output_sse="aws:kms", output_kms_key_id=key_id))
    with pytest.raises(_Stopped):
        _run(acts, "check_job", _job(buckets))
    op, headers = sent.sent[-1]
    assert op == "PutObject" and headers["x-amz-server-side-encryption"] == "aws:kms"
    assert headers["x-amz-server-side-encryption-aws-kms-key-id"] == key_id
    with pytest.raises(ValueError, match="S3BATCH_OUTPUT_KMS_KEY_ID is set: it needs S3BATCH_OUTPUT_SSE=aws:kms"):
        Settings(output_kms_key_id=key_id)


def test_iam_example_is_scoped_to_prefixes_and_the_account() -> None:
    policy = json.loads((Path(__file__).parents[1] / "deploy" / "iam" / "s3batch-worker-policy.json").read_text())
    for statement in policy["Statement"]:
        condition = statement["Condition"]
        assert condition["StringEquals"] == {"s3:ResourceAccount": "ACCOUNT-ID"}, statement["Sid"]
        if statement["Action"] == ["s3:ListBucket"]:
            bucket = statement["Resource"].removeprefix("arn:aws:s3:::")
            assert condition["StringLike"] == {"s3:prefix": [f"{bucket.split('-')[0]}-PREFIX/*"]}
        else:
            assert statement["Resource"].endswith("-PREFIX/*"), statement


# ------------------------------------------------------------------ point 9: checkpoint integrity

SECRET = "checkpoint-secret-for-tests"


def _forge(s3: Any, out: str, key: str, **changes: Any) -> None:
    """Rewrite a part as whoever can write the output prefix would: other data, a checkpoint of their
    choosing (here: the file is done), its HMAC entry kept as it was."""
    head = s3.head_object(Bucket=out, Key=key)
    metadata = dict(head["Metadata"])
    cp = json.loads(metadata[CHECKPOINT_METADATA])
    cp.update(changes)
    metadata[CHECKPOINT_METADATA] = json.dumps(cp)
    s3.put_object(Bucket=out, Key=key, Body=b'{"forged": true}\n', Metadata=metadata)


def _delete_from(s3: Any, out: str, folder: str, chunk: int) -> None:
    for key in _keys(s3, out):
        index = layout.output_index(key.rsplit("/", 1)[-1])
        if key.startswith(folder) and index is not None and index >= chunk:
            s3.delete_object(Bucket=out, Key=key)


def test_a_forged_checkpoint_is_not_trusted_with_a_secret(s3: Any, buckets: tuple[str, str]) -> None:
    src, out = buckets
    acts = S3Activities(s3, Settings(checkpoint_secret=SECRET))
    obj = _upload(s3, src, "in/a.csv", _rows(40))
    folder = layout.file_dir("o/", obj.key)
    first = _run(acts, "process_file", _file(buckets, obj, chunk_records=10))
    assert first.chunks == 4
    macs = [s3.head_object(Bucket=out, Key=folder + layout.part_name(c))["Metadata"] for c in range(4)]
    assert all(CHECKPOINT_MAC_METADATA in m for m in macs)
    # Part 1 forged to say the file is complete after 11 records; parts 2 and 3 gone (an attempt crashed).
    _delete_from(s3, out, folder, 2)
    _forge(s3, out, folder + layout.part_name(1), next_record=11, records_written=11, done=True, chunk=2)
    again = _run(acts, "process_file", _file(buckets, obj, chunk_records=10))
    assert again.status == "succeeded" and again.resumed_from_record == 10  # from the last valid part
    rows, _ = _part_rows(s3, out, obj.key)
    assert [int(r["id"]) for r in rows] == list(range(40))  # the forged part was replaced
    cps = committed_parts(s3, out, folder)
    assert [cp.next_record for cp in cps] == [10, 20, 30, 40] and cps[-1].done


def test_without_a_secret_checkpoints_are_trusted_and_old_parts_resume(s3: Any, buckets: tuple[str, str]) -> None:
    """The trade-off: without a secret, output written by earlier releases (no HMAC) is reused, and
    so is a forged checkpoint. Turning a secret on makes those parts be processed again."""
    src, out = buckets
    plain = S3Activities(s3, Settings())
    obj = _upload(s3, src, "in/a.csv", _rows(30))
    folder = layout.file_dir("o/", obj.key)
    _run(plain, "process_file", _file(buckets, obj, chunk_records=10))
    assert all(
        CHECKPOINT_MAC_METADATA not in s3.head_object(Bucket=out, Key=folder + layout.part_name(c))["Metadata"]
        for c in range(3)
    )
    _delete_from(s3, out, folder, 2)
    resumed = _run(plain, "process_file", _file(buckets, obj, chunk_records=10))
    assert resumed.resumed_from_record == 20  # old output stays readable without a secret
    _delete_from(s3, out, folder, 2)
    secure = S3Activities(s3, Settings(checkpoint_secret=SECRET))
    secured = _run(secure, "process_file", _file(buckets, obj, chunk_records=10))
    assert secured.resumed_from_record == 0 and secured.records == 30  # parts without an HMAC: reprocessed
    assert [cp.next_record for cp in committed_parts(s3, out, folder)] == [10, 20, 30]
    assert all(
        CHECKPOINT_MAC_METADATA in s3.head_object(Bucket=out, Key=folder + layout.part_name(c))["Metadata"]
        for c in range(3)
    )
    # And without the secret a forged checkpoint is what the next attempt believes.
    _delete_from(s3, out, folder, 2)
    _forge(s3, out, folder + layout.part_name(1), next_record=30, records_written=30, done=True)
    trusted = _run(plain, "process_file", _file(buckets, obj, chunk_records=10))
    assert trusted.records == 30 and trusted.chunks == 2  # nothing was read again: the forged part stands


def test_no_process_wide_parser_state_decides_a_result(s3: Any, buckets: tuple[str, str]) -> None:
    """csv.field_size_limit is process-wide: whatever else in the worker lowered it, a CSV field is
    bounded by the job's max_record_bytes alone (each parser pins the limit to its maximum)."""
    obj = _upload(s3, buckets[0], "in/wide.csv", b"id,note\n0," + b"w" * 200_000 + b"\n1,short\n")
    previous = csv.field_size_limit(10)
    try:
        result = _run(S3Activities(s3, Settings()), "process_file", _file(buckets, obj))
    finally:
        csv.field_size_limit(previous)
    assert (result.records_written, result.rejected) == (2, 0)
    rows, _ = _part_rows(s3, buckets[1], obj.key)
    assert [len(r["note"]) for r in rows] == [200_000, 5]


def test_output_key_length_counts_the_chunks_the_byte_budget_can_make(s3: Any, buckets: tuple[str, str]) -> None:
    """A chunk may end before chunk_records (at the byte budget): a file's chunk count is bounded by its
    records only. 100 compressed bytes may hold 103,200 records, so chunk numbers of 6 digits: the last
    rejects key is 1,025 bytes, over S3's 1,024 (counted from chunk_records alone, it seemed to fit)."""
    key = "kkk/" + "/".join(["a" * 197] * 5) + ".jsonl.gz"
    body = gzip.compress(b'{"n": 1}\n' * 8)[:100].ljust(100, b"\0")
    obj = _upload(s3, buckets[0], key, body)
    assert len(layout.rejects_key("o/", key, 99_999).encode()) == 1024  # five digits fit exactly
    with pytest.raises(ApplicationError) as info:
        _run(S3Activities(s3, Settings()), "process_file", _file(buckets, obj, chunk_records=10_000))
    assert info.value.type == "OutputKeyTooLong" and "would be up to 1025 bytes" in info.value.message
    assert _keys(s3, buckets[1]) == []


def test_output_key_length_counts_a_splits_longer_names(s3: Any, buckets: tuple[str, str]) -> None:
    """A byte-range split writes ``rejects-SSS-CCCCC.jsonl``, 4 bytes longer than a whole file's names: a key
    whose whole-file names fit exactly fails its split at once, clearly, before writing anything (it used to
    fail at its first rejects' PUT with S3's own error)."""
    key = "kkk/" + "/".join(["a" * 200] * 5)[:-12] + ".jsonl"
    obj = _upload(s3, buckets[0], key, b'{"n": 1}\n' * 5)
    assert len(layout.longest_output_key("o/", key, obj.size + 1).encode()) == 1024  # the whole file's names fit
    split = SplitRange(index=1, count=2, start=20, end=45)
    with pytest.raises(ApplicationError) as info:
        _run(S3Activities(s3, Settings()), "process_file", _file(buckets, obj, chunk_records=1, split=split))
    assert info.value.type == "OutputKeyTooLong" and "would be up to 1028 bytes" in info.value.message
    assert "rejects-001-00000.jsonl" in info.value.message
    assert _keys(s3, buckets[1]) == []

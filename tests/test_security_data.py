"""Issue 19, the data path and the S3 side: no record contents in history, the report or logs
(point 2); ExpectedBucketOwner, allow-lists and server-side encryption (point 5); worker-side ceilings
and byte budgets (point 6); checkpoints that cannot be forged (point 9). Real SeaweedFS and a real
Temporal dev server, as everywhere."""

from __future__ import annotations

import base64
import json
import logging
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from google.protobuf.json_format import MessageToDict
from pydantic import BaseModel, ConfigDict, field_validator
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment
from temporalio.worker import Worker

from activities.s3_activities import S3Activities
from s3batch import layout
from s3batch.config import Settings
from s3batch.handlers import HandlerResult, Reject, chunk_handler
from s3batch.models import JobSpec, ObjectRef, ProcessFileInput, S3BatchInput
from s3batch.records import Record
from tests.helpers import committed_parts, history_events, read_jsonl, report

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


def _strings(value: Any) -> Iterator[str]:
    """Every string in a history event as a dict, with payload data base64-decoded."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield k
            if k == "data" and isinstance(v, str):
                yield base64.b64decode(v).decode(errors="replace")
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)
    elif isinstance(value, str):
        yield value


async def history_text(client: Client, workflow_id: str) -> str:
    events = await history_events(client, workflow_id)
    return "\n".join(s for e in events for s in _strings(MessageToDict(e)))


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
    fields: dict[str, Any] = {"format": "auto", "handler": "passthrough", "chunk_records": 500}
    fields["max_record_bytes"] = 1024 * 1024
    fields.update(options)
    return ProcessFileInput(job_id="sec", bucket=src, obj=obj, output_bucket=out, output_prefix="o/", **fields)


def _job(buckets: tuple[str, str], **options: Any) -> JobSpec:
    src, out = buckets
    return JobSpec(bucket=src, prefix="in/", output_bucket=out, output_prefix="o/", **options)


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

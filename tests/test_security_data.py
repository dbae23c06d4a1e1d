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

from google.protobuf.json_format import MessageToDict
from pydantic import BaseModel, ConfigDict, field_validator
from temporalio.client import Client
from temporalio.worker import Worker

from s3batch.handlers import HandlerResult, Reject, chunk_handler
from s3batch.models import S3BatchInput
from s3batch.records import Record
from tests.helpers import history_events, report

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


class _Unordered:
    """A reject line from a handler that raises, quoting the record, when compared (sorted)."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __lt__(self, other: Any) -> bool:
        raise ValueError(f"cannot order {self.value!r}")


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
        return HandlerResult([], [Reject(_Unordered(r.value), "x", r.value) for r in records], dropped=0)  # type: ignore[arg-type]
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


"""JSON values go through any handler exactly: integers beyond 64 bits and decimals a double cannot
hold are written (and, in rejects, quoted) digit for digit, never rounded."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

from s3batch.activities.s3_activities import S3Activities
from temporalio.testing import ActivityEnvironment

from s3batch import layout
from s3batch.handlers import record_handler
from s3batch.messages import ObjectRef, ProcessFileInput

LINES = [
    b'{"id": 123456789012345678901234567890, "amount": 0.1000000000000000055511151231257827}',
    b'{"id": -98765432109876543210, "amount": 1e400, "reject": true}',
    b'{"id": 7, "amount": 2.5}',
]


@record_handler("exact_tag")
def exact_tag(value: dict[str, Any]) -> dict[str, Any]:
    """Adds a field (so the output is encoded by the activity, not pre-encoded); rejects on demand."""
    if value.get("reject"):
        raise ValueError("asked to reject")
    return {**value, "seen": True}


def _body(s3: Any, bucket: str, key: str) -> bytes:
    return s3.get_object(Bucket=bucket, Key=key)["Body"].read()


def test_big_integers_and_long_decimals_survive_a_record_handler_and_the_rejects(s3: Any, buckets: tuple[str, str]):
    src, out = buckets
    key = "in/exact.jsonl"
    s3.put_object(Bucket=src, Key=key, Body=b"\n".join(LINES) + b"\n")
    head = s3.head_object(Bucket=src, Key=key)
    req = ProcessFileInput(
        job_id="job-exact",
        bucket=src,
        obj=ObjectRef(key=key, etag=head["ETag"].strip('"'), size=head["ContentLength"]),
        output_bucket=out,
        output_prefix="o/",
        format="auto",
        handler="exact_tag",
        chunk_records=100,
        max_record_bytes=1024 * 1024,
    )
    result = ActivityEnvironment().run(S3Activities(s3).process_file, req)
    assert (result.status, result.records_written, result.rejected) == ("succeeded", 2, 1)
    part = _body(s3, out, layout.part_key("o/", key, 0))
    assert part == (
        b'{"id":123456789012345678901234567890,"amount":0.1000000000000000055511151231257827,"seen":true}\n'
        b'{"id":7,"amount":2.5,"seen":true}\n'
    )
    rejects = _body(s3, out, layout.rejects_key("o/", key, 0)).splitlines()
    [reject] = [json.loads(line, parse_float=Decimal) for line in rejects]
    assert reject["line"] == 2 and "asked to reject" in reject["reason"]
    assert reject["record"] == {"id": -98765432109876543210, "amount": Decimal("1e400"), "reject": True}

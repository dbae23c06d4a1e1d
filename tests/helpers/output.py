"""What a job wrote to S3: output records, the report, committed parts."""

from __future__ import annotations

import json
from typing import Any

from s3batch import layout
from s3batch.checkpoint import CHECKPOINT_METADATA, Checkpoint


def list_keys(s3: Any, bucket: str, prefix: str = "") -> list[str]:
    """Every key under ``prefix``, in listing (key) order."""
    return [
        o["Key"]
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        for o in page.get("Contents", [])
    ]


def read_jsonl(s3: Any, bucket: str, prefix: str, kind: str = "part") -> list[Any]:
    """Every row of the ``part-*`` (or ``rejects-*``) objects under ``prefix``, in key order."""
    rows: list[Any] = []
    keys = sorted(k for k in list_keys(s3, bucket, prefix) if k.rsplit("/", 1)[-1].startswith(f"{kind}-"))
    for key in keys:
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        rows.extend(json.loads(line) for line in body.splitlines() if line)
    return rows


def report(s3: Any, bucket: str, prefix: str = "o/") -> dict[str, Any]:
    """The job report ``{prefix}_report.json``."""
    return json.loads(s3.get_object(Bucket=bucket, Key=layout.report_key(prefix))["Body"].read())


def committed_parts(s3: Any, bucket: str, file_prefix: str) -> list[Checkpoint]:
    """Checkpoints of the contiguous committed parts of one file, in order."""
    found: list[Checkpoint] = []
    while True:
        key = f"{file_prefix}part-{len(found):05d}.jsonl"
        try:
            head = s3.head_object(Bucket=bucket, Key=key)
        except s3.exceptions.ClientError:
            return found
        found.append(Checkpoint.model_validate_json(head["Metadata"][CHECKPOINT_METADATA]))


def has_part(s3: Any, bucket: str, file_prefix: str) -> bool:
    """Whether at least one part of the file under ``file_prefix`` is committed (one LIST)."""
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=f"{file_prefix}part-", MaxKeys=1)
    return bool(listed.get("KeyCount"))

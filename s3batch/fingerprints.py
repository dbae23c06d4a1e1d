"""The fingerprint of a job's options that shape a file's output: a checkpoint or part written under other
options is not reused (:mod:`s3batch.checkpoint`)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any


def fingerprint(
    *,
    fmt: str,
    compression: str | None,
    handler: str,
    chunk_records: int | None,
    max_record_bytes: int,
    reading: Mapping[str, Any] | None = None,
    sink: Mapping[str, Any] | None = None,
    redrive: str | None = None,
) -> str:
    """Hash of the options that shape a file's output; parts from other options are not reused.

    Args:
        chunk_records: None: left out (a table's rows fingerprint: where chunks end is not what the rows are).
        compression: gzip is hashed as ``"gzip": true``, as before zstd and bzip2 were read, so the
            parts of running jobs keep their fingerprint.
        reading: The reading options that differ from their defaults (CSV dialect, header, encoding:
            ``s3batch.formats.dialect``); empty for a job with the defaults, whose fingerprint is then
            the one earlier releases computed.
        sink: The sink's shape (``S3Sink.shape()``, ``PostgresSink.shape()``); None for the default
            JSONL parts, whose fingerprint is then the one earlier releases computed.
        redrive: A redrive of rejected records: the identity of the records it takes
            (``s3batch.activities.rejected.RejectedLines.identity``); None for any other job.
    """
    shape: dict[str, Any] = {"v": 1, "format": fmt, "gzip": compression == "gzip", "handler": handler}
    shape.update(chunk_records=chunk_records, max_record_bytes=max_record_bytes)
    if chunk_records is None:
        del shape["chunk_records"]
    if compression not in (None, "gzip"):
        shape["compression"] = compression
    if reading:
        shape["reading"] = dict(reading)
    if sink is not None:
        shape["sink"] = dict(sink)
    if redrive is not None:
        shape["redrive"] = redrive
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:16]

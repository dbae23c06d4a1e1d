"""Where s3batch writes: the output layout, in one place.

For a source key ``K``: records at ``{output_prefix}{K}/part-{chunk:05d}.jsonl``, rejects at
``{output_prefix}{K}/rejects-{chunk:05d}.jsonl``; the job report at ``{output_prefix}_report.json``.
Keys are plain concatenations, so every output key starts with ``output_prefix``.
"""

from __future__ import annotations

import hashlib
import json
import re

CHECKPOINT_METADATA = "s3batch-checkpoint"
"""User-metadata entry of every part object: the checkpoint committed with the part's data."""

_OUTPUT_RE = re.compile(r"(part|rejects)-(\d{5,})\.jsonl$")


def file_dir(output_prefix: str, key: str) -> str:
    return f"{output_prefix}{key}/"


def part_key(output_prefix: str, key: str, chunk: int) -> str:
    return f"{output_prefix}{key}/part-{chunk:05d}.jsonl"


def rejects_key(output_prefix: str, key: str, chunk: int) -> str:
    return f"{output_prefix}{key}/rejects-{chunk:05d}.jsonl"


def report_key(output_prefix: str) -> str:
    return f"{output_prefix}_report.json"


def segment_key(output_prefix: str, segment: int) -> str:
    return f"{output_prefix}_s3batch/report-{segment:05d}.jsonl"


def write_check_key(output_prefix: str) -> str:
    """Empty object written at the start of a job to prove the output is writable."""
    return f"{output_prefix}_s3batch/write-check"


def output_index(name: str) -> int | None:
    """Chunk index of a part or rejects object name, or None for anything else."""
    match = _OUTPUT_RE.search(name)
    return int(match.group(2)) if match else None


def fingerprint(*, fmt: str, gzip: bool, handler: str, chunk_records: int, max_record_bytes: int) -> str:
    """Hash of the options that shape a file's output; parts from other options are not reused."""
    shape = {
        "v": 1,
        "format": fmt,
        "gzip": gzip,
        "handler": handler,
        "chunk_records": chunk_records,
        "max_record_bytes": max_record_bytes,
    }
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:16]

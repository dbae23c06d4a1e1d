"""What comes in (issue 14): zstd and bzip2 beside gzip, CSV dialects and encodings, JSON documents,
each through a real job (the in-process worker on the test stack) and compared with a reference
reader: the csv module with the same dialect, ``json`` for JSON documents."""

from __future__ import annotations

import bz2
import gzip
import json
from typing import Any

import zstandard
from temporalio.client import Client
from temporalio.worker import Worker

from s3batch.models import S3BatchInput
from tests.helpers.data import csv_rows, make_csv, put_files
from tests.helpers.jobs import execute
from tests.helpers.output import read_jsonl, report


def zst(data: bytes) -> bytes:
    return zstandard.ZstdCompressor().compress(data)


def zst_frames(data: bytes, frame: int) -> bytes:
    """Several zstd frames one after the other (as ``zstd`` writes a stream, or ``cat a.zst b.zst``)."""
    return b"".join(zst(data[i : i + frame]) for i in range(0, len(data), frame))


def jsonl_events(n: int) -> bytes:
    line = b'{"n": %d, "big": 123456789012345678901234567890, "x": 0.1000000000000000055511}\n'
    return b"".join(line % i for i in range(n))


def job(src: str, out: str, **options: Any) -> S3BatchInput:
    return S3BatchInput(bucket=src, output_bucket=out, output_prefix="o/", chunk_records=300, **options)


def file_entry(s3: Any, out: str, key: str) -> dict[str, Any]:
    return next(f for f in report(s3, out, "o/")["files"] if f["key"] == key)


# ------------------------------------------------------------------------------------- compression


async def test_zstd_and_bzip2_files_are_read_exactly_with_their_inner_format(
    client: Client, worker: Worker, s3: Any, buckets: tuple[str, str]
) -> None:
    src, out = buckets
    rows = 2_000
    data = make_csv(rows)
    events = jsonl_events(1_500)
    files = {
        "in/a.csv.zst": zst_frames(data, 10_000),  # many frames
        "in/b.csv.bz2": bz2.compress(data[:30_000]) + bz2.compress(data[30_000:]),  # two streams
        "in/c.jsonl.bz2": bz2.compress(events),
        "in/d.JSONL.ZST": zst(events),
        "in/e.csv.gz": gzip.compress(data),
    }
    put_files(s3, src, files)
    result = await execute(client, worker.task_queue, job(src, out), "compressed")
    assert result.status == "succeeded"
    expected_events = [json.loads(line) for line in events.splitlines()]
    for key in ("in/a.csv.zst", "in/b.csv.bz2", "in/e.csv.gz"):
        assert read_jsonl(s3, out, f"o/{key}/") == csv_rows(rows), key
        entry = file_entry(s3, out, key)
        assert (entry["records"], entry["chunks"], entry["rejected"]) == (rows, 7, 0), key
    for key in ("in/c.jsonl.bz2", "in/d.JSONL.ZST"):
        assert read_jsonl(s3, out, f"o/{key}/") == expected_events, key  # big numbers kept exact


BAD_COMPRESSED = {
    "in/not-zstd.csv.zst": (b"id,name\n1,secret-value\n", "is not zstd data (it does not start with the zstd"),
    "in/truncated.csv.zst": (zst(make_csv(5_000))[:-200], "is truncated: its zstd stream ends"),
    "in/not-bzip2.jsonl.bz2": (b'{"secret": "value"}\n', "is not bzip2 data"),
    "in/truncated.jsonl.bz2": (bz2.compress(jsonl_events(5_000))[:-100], "is truncated: its bzip2 stream ends"),
    "in/corrupt.csv.bz2": (bz2.compress(make_csv(5_000))[:40] + b"\x00" * 300, "holds corrupt compressed data"),
}


async def test_corrupt_zstd_and_bzip2_files_fail_at_once_naming_the_file(
    client: Client, worker: Worker, s3: Any, buckets: tuple[str, str]
) -> None:
    src, out = buckets
    put_files(s3, src, {key: body for key, (body, _) in BAD_COMPRESSED.items()} | {"in/ok.csv.zst": zst(make_csv(10))})
    result = await execute(client, worker.task_queue, job(src, out, max_failed_files=10), "bad-compressed")
    assert result.status == "succeeded"  # within max_failed_files
    for key, (_, what) in BAD_COMPRESSED.items():
        entry = file_entry(s3, out, key)
        assert entry["status"] == "failed", key
        assert entry["attempts"] == 1, f"{key}: retried ({entry})"  # non-retryable
        assert entry["error"].startswith(f"BadFile: s3://{src}/{key} {what}"), entry["error"]
        assert "Upload it again" in entry["error"] and "retrying cannot fix it" in entry["error"]
        assert "secret" not in entry["error"]
    assert file_entry(s3, out, "in/ok.csv.zst")["status"] == "succeeded"

"""The benchmark's data: customers CSVs generated in memory (fast enough to stream 1 GB) and uploaded."""

from __future__ import annotations

import contextlib
import csv
import io
import random
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from s3batch.dev.sample_data import customer_row
from scripts.benchmark.common import SRC, log

HEADER = b"customer_id,email,name,country,amount,created_at\r\n"
_MARK = "#ID#"


def _row_templates(count: int = 5_000, seed: int = 7) -> list[tuple[bytes, bytes]]:
    """``count`` CSV rows with the id left out: row = str(id) + a + str(id) + b.

    About one name in five has a comma, one in fifty a double quote and one in a hundred a line
    break (all quoted, RFC 4180, CRLF). Every row is valid for ``s3batch.handlers.Customer``.
    """
    rng = random.Random(seed)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\r\n")
    out = []
    for _ in range(count):
        writer.writerow(customer_row(rng, _MARK, _MARK))
        line = buf.getvalue().encode()
        buf.seek(0)
        buf.truncate()
        empty, a, b = line.split(_MARK.encode())
        assert not empty
        out.append((a, b))
    return out


_TEMPLATES: list[tuple[bytes, bytes]] = []


def customers_csv(rows: int, start_id: int = 1, header: bool = True) -> Iterator[bytes]:
    """A customers CSV of ``rows`` rows, as chunks of ~400 KB: a pre-generated block of rows
    repeated with changing ids (fast enough to stream 1 GB in seconds, never held in memory)."""
    if not _TEMPLATES:
        _TEMPLATES.extend(_row_templates())
    if header:
        yield HEADER
    templates = _TEMPLATES
    block = len(templates)
    done = 0
    while done < rows:
        n = min(block, rows - done)
        base = start_id + done
        yield b"".join(b"%d%s%d%s" % (base + i, a, base + i, b) for i, (a, b) in enumerate(templates[:n]))
        done += n


def rows_for_bytes(target: int) -> int:
    if not _TEMPLATES:
        _TEMPLATES.extend(_row_templates())
    sample = b"".join(customers_csv(len(_TEMPLATES), start_id=1_000_000, header=False))
    return max(1, int(target / (len(sample) / len(_TEMPLATES))))


def upload_stream(s3: Any, bucket: str, key: str, chunks: Iterator[bytes], part_size: int = 16 * 1024 * 1024) -> int:
    """Multipart upload from a stream of chunks; at most one part is held in memory."""
    upload = s3.create_multipart_upload(Bucket=bucket, Key=key, ContentType="text/csv")
    parts: list[dict[str, Any]] = []
    pending: list[bytes] = []
    held = total = 0

    def flush() -> None:
        nonlocal held
        body = b"".join(pending)
        pending.clear()
        held = 0
        etag = s3.upload_part(
            Bucket=bucket, Key=key, UploadId=upload["UploadId"], PartNumber=len(parts) + 1, Body=body
        )["ETag"]
        parts.append({"ETag": etag, "PartNumber": len(parts) + 1})

    try:
        for chunk in chunks:
            pending.append(chunk)
            held += len(chunk)
            total += len(chunk)
            if held >= part_size:
                flush()
        if pending or not parts:
            flush()
        s3.complete_multipart_upload(
            Bucket=bucket, Key=key, UploadId=upload["UploadId"], MultipartUpload={"Parts": parts}
        )
    except BaseException:
        with contextlib.suppress(Exception):
            s3.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload["UploadId"])
        raise
    return total


def put_csv(s3: Any, key: str, rows: int, start_id: int = 1) -> int:
    """Upload one customers CSV (streamed, multipart past one part). Returns its size."""
    if rows <= 100_000:
        body = b"".join(customers_csv(rows, start_id))
        s3.put_object(Bucket=SRC, Key=key, Body=body)
        return len(body)
    return upload_stream(s3, SRC, key, customers_csv(rows, start_id))


def object_size(s3: Any, key: str) -> int | None:
    try:
        return int(s3.head_object(Bucket=SRC, Key=key)["ContentLength"])
    except s3.exceptions.ClientError:
        return None


def ensure_small_files(s3: Any, group: str, count: int, rows: int, first: int = 0) -> None:
    """``small/{group}/NNNNN.csv`` for ``first <= NNNNN < first + count``, ~1 KB each (the ones
    already there are skipped)."""
    existing = set()
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=SRC, Prefix=f"small/{group}/"):
        existing.update(item["Key"] for item in page.get("Contents", []))
    todo = [i for i in range(first, first + count) if f"small/{group}/{i:05d}.csv" not in existing]
    if not todo:
        return
    log(f"uploading {len(todo):,} small files ({rows} rows each) to small/{group}/")

    def put(i: int) -> None:
        body = b"".join(customers_csv(rows, start_id=i * rows + 1))
        s3.put_object(Bucket=SRC, Key=f"small/{group}/{i:05d}.csv", Body=body)

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(put, todo))

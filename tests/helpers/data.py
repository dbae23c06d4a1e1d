"""Source data for the tests: CSV builders and uploads."""

from __future__ import annotations

import csv
import io
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from s3batch.objects import addressable, data_stores


def make_csv(rows: int, pad: int = 0) -> bytes:
    """A CSV with an ``id`` column 0..rows-1, a quoted field with a comma, and ``pad`` filler bytes."""
    filler = "x" * pad
    lines = ["id,name,note"] + [f'{i},"name, {i}",{filler}' for i in range(rows)]
    return ("\n".join(lines) + "\n").encode()


def csv_rows(rows: int, pad: int = 0) -> list[dict[str, str]]:
    """The output records ``make_csv(rows, pad)`` must produce with the passthrough handlers."""
    return [{"id": str(i), "name": f"name, {i}", "note": "x" * pad} for i in range(rows)]


def put_files(s3: Any, bucket: str, files: dict[str, bytes]) -> None:
    """Upload ``{key: body}``, 16 at a time, through the data path's obstore stores of ``s3`` (a fifth of
    botocore's CPU a request: thousands of files are set up in seconds), boto3 for a key obstore would alter."""
    stores = data_stores(s3)

    def put(key: str, body: bytes) -> None:
        if stores is not None and addressable(key):
            stores.put(bucket, key, body, "binary/octet-stream", {})
        else:
            s3.put_object(Bucket=bucket, Key=key, Body=body)

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(put, files.keys(), files.values()))


def messy_csv(rows: int, bad_amounts: bool = False) -> bytes:
    """A CSV (CRLF) of ``rows`` rows of id, email, name, amount whose names are quoted with a comma, a
    quote or a line break, damaged at four places (an unterminated quote, blank lines, bad UTF-8, a short
    row): the fast CSV path must hand over to the exact parser and back. ``bad_amounts``: every 1,000th
    amount is ``n/a`` (a numeric column refuses it)."""
    body = [["id", "email", "name", "amount"]]
    for i in range(rows):
        name = ["Ann", "O'Brien, Pat", 'The "Boss"', "two\r\nlines", "é漢"][i % 5]
        amount = "n/a" if bad_amounts and i % 1_000 == 999 else f"{i % 997}.{i % 100:02d}"
        body.append([str(i), f"u{i}@example.com", name, amount])
    out = io.StringIO()
    csv.writer(out, lineterminator="\r\n").writerows(body)
    data = bytearray(out.getvalue().encode())
    for at, damage in ((1_000, b'"oops'), (20_000, b"\r\n\r\n"), (50_000, b"\xff\xfe"), (90_000, b"1,2\r\n")):
        cut = data.index(b"\r\n", len(data) * at // 100_000) + 2
        data[cut:cut] = damage
    return bytes(data)

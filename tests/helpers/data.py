"""Source data for the tests: CSV builders and uploads."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any


def make_csv(rows: int, pad: int = 0) -> bytes:
    """A CSV with an ``id`` column 0..rows-1, a quoted field with a comma, and ``pad`` filler bytes."""
    filler = "x" * pad
    lines = ["id,name,note"] + [f'{i},"name, {i}",{filler}' for i in range(rows)]
    return ("\n".join(lines) + "\n").encode()


def csv_rows(rows: int, pad: int = 0) -> list[dict[str, str]]:
    """The output records ``make_csv(rows, pad)`` must produce with the passthrough handlers."""
    return [{"id": str(i), "name": f"name, {i}", "note": "x" * pad} for i in range(rows)]


def put_files(s3: Any, bucket: str, files: dict[str, bytes]) -> None:
    """Upload ``{key: body}`` (16 at a time)."""
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda kv: s3.put_object(Bucket=bucket, Key=kv[0], Body=kv[1]), files.items()))

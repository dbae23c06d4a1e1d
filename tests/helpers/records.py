"""Walking a record parser, for the tests of the CSV and JSONL readers (``tests/test_records*.py``)."""

from __future__ import annotations

import io
from typing import Any

from s3batch.formats.common import Record
from s3batch.formats.csv import CsvParser
from s3batch.formats.jsonl import JsonlParser


def walk(parser: CsvParser | JsonlParser) -> tuple[list[Record], list[tuple[int, int]]]:
    """All records, and ``(offset, line)`` after each one (what a checkpoint after it would store)."""
    records, bounds = [], []
    for record in parser:
        records.append(record)
        bounds.append((parser.offset, parser.line))
    return records, bounds


def line_ends(fmt: str, data: bytes) -> int:
    """Line ends in ``data``: LF, CRLF or a lone CR in CSV (as the csv module counts them), LF in JSONL."""
    if fmt == "csv":
        return data.count(b"\n") + data.count(b"\r") - data.count(b"\r\n")
    return data.count(b"\n")


class ChunkedRaw(io.RawIOBase):
    """A raw stream whose reads return the given sizes in turn: block boundaries fall anywhere
    (inside a CRLF, a multi-byte character or UTF-16 unit, a BOM, a record)."""

    def __init__(self, data: bytes, sizes: list[int]) -> None:
        super().__init__()
        self._data = memoryview(data)
        self._pos = 0
        self._sizes = sizes
        self._turn = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        size = self._sizes[self._turn % len(self._sizes)]
        self._turn += 1
        n = min(len(buffer), size, len(self._data) - self._pos)
        buffer[:n] = self._data[self._pos : self._pos + n]
        self._pos += n
        return n


def chunked(data: bytes, sizes: list[int] | None, buffer_size: int | None = None) -> Any:
    """``data`` as a stream: whole (``sizes`` None), or read in pieces of ``sizes``, raw or through a
    ``buffer_size`` buffer."""
    if sizes is None:
        return io.BytesIO(data)
    raw = ChunkedRaw(data, sizes)
    return raw if buffer_size is None else io.BufferedReader(raw, buffer_size)

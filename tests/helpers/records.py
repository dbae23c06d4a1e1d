"""Walking a record parser, for the tests of the CSV and JSONL readers (``tests/test_records*.py``)."""

from __future__ import annotations

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

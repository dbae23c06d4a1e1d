"""The parser of a format, reading a stream from a checkpoint (Parquet is read by row group instead)."""

from __future__ import annotations

from typing import IO

from s3batch.formats.common import ParsedFormat
from s3batch.formats.csv import CsvParser
from s3batch.formats.fastcsv import FastCsvParser, fast_reading
from s3batch.formats.json import JsonDocumentParser
from s3batch.formats.jsonl import JsonlParser
from s3batch.formats.parquet import ParquetParser
from s3batch.reading import Reading

Parser = CsvParser | FastCsvParser | JsonlParser | JsonDocumentParser | ParquetParser


def make_parser(
    fmt: ParsedFormat,
    stream: IO[bytes],
    *,
    offset: int = 0,
    line: int = 1,
    header: list[str] | None = None,
    max_line_bytes: int = 8 * 1024 * 1024,
    reading: Reading | None = None,
    head: bytes | None = None,
    fast: bool = False,
) -> Parser:
    """Build the parser for ``fmt`` reading ``stream`` from ``offset`` (not Parquet, which is read by
    row group from a seekable file: see :mod:`s3batch.formats.parquet`); ``fast``: a CSV takes the fast path
    where it can (:mod:`s3batch.formats.fastcsv`)."""
    if fmt == "parquet":
        raise ValueError("a Parquet file is not read as a stream")
    if fmt == "csv":
        reading = reading or Reading()
        kind = FastCsvParser if fast and fast_reading(reading) else CsvParser
        return kind(stream, offset=offset, line=line, header=header, max_line_bytes=max_line_bytes, reading=reading)
    if fmt == "json":
        return JsonDocumentParser(stream, offset=offset, line=line, max_line_bytes=max_line_bytes, head=head)
    return JsonlParser(stream, offset=offset, line=line, max_line_bytes=max_line_bytes)

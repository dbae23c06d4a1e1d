"""Reading records: the formats s3batch reads, and how a file's format is told from its key.

Parsers: :class:`s3batch.formats.csv.CsvParser`, :class:`s3batch.formats.jsonl.JsonlParser` (each
yields :class:`s3batch.formats.common.Record` s and knows where the next record starts); opening a
file on S3 at a checkpoint (gzip, the CSV header on resume): :mod:`s3batch.formats.source`.
"""

from __future__ import annotations

from typing import IO

from s3batch.errors import UnknownFormatError
from s3batch.formats.common import ParsedFormat
from s3batch.formats.compression import Compression, split_suffix
from s3batch.formats.csv import CsvParser
from s3batch.formats.fastcsv import FastCsvParser, fast_reading
from s3batch.formats.json import JsonDocumentParser
from s3batch.formats.jsonl import JsonlParser
from s3batch.formats.parquet import ParquetParser
from s3batch.reading import Reading

# A ``.tsv`` (or ``.tab``) is CSV read with a tab as its default delimiter (s3batch.reading.Reading.of).
_CSV_EXTENSIONS = (".csv", ".tsv", ".tab")
_JSONL_EXTENSIONS = (".jsonl", ".ndjson")
_PARQUET_EXTENSIONS = (".parquet", ".pq")


def resolve_format(key: str, fmt: str) -> tuple[ParsedFormat, Compression | None]:
    """Return ``(format, compression)`` for an object key.

    Args:
        key: The object key; a ``.gz``, ``.zst`` or ``.bz2`` suffix names its compression, and the
            extension before it its format (``data.csv.zst``).
        fmt: ``csv``, ``jsonl``, ``json`` (a JSON document), ``parquet`` or ``auto`` (pick by
            extension). Parquet compresses inside the file: a ``.parquet.gz`` is refused.

    Raises:
        UnknownFormatError: ``fmt`` is ``auto`` and the extension is not recognised.
    """
    base, compression = split_suffix(key)
    if fmt == "csv":
        return "csv", compression
    if fmt == "jsonl":
        return "jsonl", compression
    if fmt == "json":
        return "json", compression
    if fmt == "parquet" or (fmt == "auto" and base.endswith(_PARQUET_EXTENSIONS)):
        if compression is not None:
            raise UnknownFormatError(
                f"{key!r} is a {compression}-compressed Parquet file, which s3batch cannot read in row groups; "
                "upload it uncompressed (Parquet compresses its own columns)"
            )
        return "parquet", None
    if fmt != "auto":
        raise UnknownFormatError(
            f"unknown format {fmt!r} for {key!r}: expected 'csv', 'jsonl', 'json', 'parquet' or 'auto'"
        )
    if base.endswith(_CSV_EXTENSIONS):
        return "csv", compression
    if base.endswith(_JSONL_EXTENSIONS):
        return "jsonl", compression
    if base.endswith(".json"):
        return "json", compression
    raise UnknownFormatError(
        f"cannot tell the format of {key!r} from its extension (expected .csv, .tsv, .jsonl, .ndjson or "
        ".json, optionally .gz, .zst or .bz2, or .parquet); set format to 'csv', 'jsonl' or 'json' (or 'parquet') "
        "in the job input"
    )


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

"""What an object key says about its file: its format (by extension) and its compression (by suffix).

Kept apart from the readers, which import pyarrow, zstandard and the rest: the client shows a file in
flight by its key (``s3batch status``) and imports only this.
"""

from __future__ import annotations

from typing import Literal

from s3batch.errors import UnknownFormatError
from s3batch.formats.common import ParsedFormat

Compression = Literal["gzip", "zstd", "bzip2"]

SUFFIXES: dict[str, Compression] = {".gz": "gzip", ".zst": "zstd", ".bz2": "bzip2"}
"""Key suffix (lower-cased) -> compression."""

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


def split_suffix(key: str) -> tuple[str, Compression | None]:
    """``(key without its compression suffix, compression)``; the key is lower-cased."""
    lowered = key.lower()
    for suffix, name in SUFFIXES.items():
        if lowered.endswith(suffix):
            return lowered[: -len(suffix)], name
    return lowered, None

"""Parquet parts: ``part-{chunk:05d}.parquet``, one Parquet file a chunk, in the same folder and with
the same checkpoint metadata as JSONL parts (``{"type": "s3", "format": "parquet"}``).

The columns are the fields of the handler's outputs (JSON objects), in the order they first appear
in the chunk; each column's type is what pyarrow infers from the values (CSV passthrough: all
strings; JSON numbers: int64, double, or decimal for exact decimals; objects and arrays: structs and
lists). A column whose values pyarrow cannot hold as one type (e.g. a number and a string, or an
integer beyond 64 bits) is written as strings: strings as they are, other values as their JSON text.
A field missing from an output is null there. The bytes are deterministic: the same records give
the same part (same writer options, no timestamps), so a retried chunk rewrites it harmlessly.
"""

from __future__ import annotations

import io
from typing import Any

# pyarrow ships no type hints (no py.typed): its names are Any here.
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]

from s3batch import layout
from s3batch.file_output import FileOutput
from s3batch.jsonvalues import encode_json
from s3batch.sinks.rows import decoded, field_names

_WRITER_OPTIONS: dict[str, Any] = {"compression": "zstd", "version": "2.6", "write_statistics": True}


def _column(values: list[Any]) -> pa.Array:
    """One column; as strings (JSON text for non-strings) when pyarrow cannot hold it as one type."""
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        text = [v if v is None or isinstance(v, str) else encode_json(v).decode() for v in values]
        return pa.array(text, pa.string())


def parquet_bytes(output: list[bytes], where: str) -> bytes:
    """A Parquet file holding ``output`` (JSON objects) as rows."""
    values = decoded(output)
    names = field_names(values, where, "Parquet parts")
    table = pa.table({name: _column([v.get(name) for v in values]) for name in names})
    sink = io.BytesIO()
    pq.write_table(table, sink, **_WRITER_OPTIONS)
    return sink.getvalue()


class ParquetOutput(FileOutput):
    """The file's output folder with Parquet parts (same checkpoints, rejects and layout otherwise)."""

    part_suffix = layout.PARQUET
    part_content_type = "application/vnd.apache.parquet"

    @classmethod
    def of(cls, folder: FileOutput) -> ParquetOutput:
        """The same folder (bucket, key, version, fingerprint, secret...), writing Parquet parts."""
        parquet = cls.__new__(cls)
        parquet.__dict__.update(folder.__dict__)
        return parquet

    def part_body(self, output: list[bytes]) -> bytes:
        return parquet_bytes(output, f"s3://{self.bucket}/{self.dir}")

"""Parquet input: records read row group by row group, with ranged GETs pinned to the listed version.

**Streaming.** The file is opened through :class:`PinnedFile`, a seekable stream that answers each
read with one ranged GET of exactly the bytes asked for (``IfMatch`` the listed ETag, ``VersionId``
once known). pyarrow reads the footer (the last 64 KiB, then the metadata if it is longer), then,
for each row group, its column chunks: a 1 GB file is never held in memory, only one row group's
columns and 1,024 rows of Python values at a time.

**Resume.** The checkpoint of a Parquet file is its ``next_record`` (rows committed): with the
footer's row counts (the same for the pinned version) that is a row group and a row within it.
A new attempt reads the footer and then only the row groups from that one on: earlier row groups
are never fetched. Its ``byte_offset`` is None (like a gzip file) and ``line`` is the row number.

**Rows.** A record is a row as a ``{column: value}`` dict, its ``line`` the row number (1-based),
so rejects name the row. Values map to JSON losslessly (:func:`json_values`):

=========================================  =====================================================
Parquet / Arrow type                       JSON value
=========================================  =====================================================
null                                       ``null`` (any null value, too)
boolean, integers (any width)              ``true``/``false``, an exact integer
float16/32/64                              a number (the exact double); NaN and infinities as the
                                           strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``
decimal (any precision)                    an exact number with its scale (``1.50`` stays ``1.50``)
string                                     a string
binary, fixed-size binary                  a base64 string (standard alphabet, padded)
date                                       ``"2026-12-01"``
time (s/ms/us/ns)                          ``"13:05:00.123"``, as many fraction digits as the unit
timestamp (s/ms/us/ns)                     ``"2026-12-01T13:05:00.123456Z"``: UTC with ``Z`` when
                                           the column has a time zone, no suffix when it has
                                           none; as many fraction digits as the unit; a value
                                           outside years 1-9999 as its integer count of units
duration                                   ISO 8601 ``"PT90.5S"`` (``"-PT1S"`` when negative)
list, large list, fixed-size list          an array
struct                                     an object (fields in schema order)
map                                        an array of ``{"key": k, "value": v}`` (keys can be
                                           of any type and repeat, so not an object)
dictionary-encoded                         its values' mapping
=========================================  =====================================================

Any other type (unions, intervals) fails the file (``BadFile`` naming the column and the type).
A corrupt or truncated file is a ``BadFile`` naming the object (never retried).
"""

from __future__ import annotations

import base64
import datetime
import math
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

# pyarrow ships no type hints (no py.typed): its names are Any here.
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]
from botocore.exceptions import BotoCoreError, ClientError

from s3batch.errors import BadFile, S3Error
from s3batch.formats.common import Record
from s3batch.s3io import STREAM_ERRORS, RangedReader, raise_s3_error

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

BATCH_ROWS = 1_024
"""Rows turned into Python values at a time."""

_EPOCH = datetime.datetime(1970, 1, 1)
_UNIT_DIGITS = {"s": 0, "ms": 3, "us": 6, "ns": 9}


class PinnedFile(RangedReader):
    """A seekable read-only stream over one object version: each read is one ranged GET of exactly
    the bytes asked for, pinned like :class:`~s3batch.s3io.RangedReader` (``IfMatch``, ``VersionId``).

    ``fetched`` counts the bytes received, ``requests`` the ranges asked for (``(start, length)``).
    """

    def __init__(
        self, client: S3Client, bucket: str, key: str, *, etag: str, size: int, version_id: str | None
    ) -> None:
        super().__init__(client, bucket, key, etag=etag, size=size, version_id=version_id)
        self.fetched = 0
        self.requests: list[tuple[int, int]] = []

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def read(self, size: int | None = -1) -> bytes:
        end = self._size if size is None or size < 0 else min(self._size, self._pos + size)
        if end <= self._pos:
            if not self._checked:
                self._check()
            return b""
        data = self._get(self._pos, end)
        self._pos += len(data)
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def _get(self, start: int, end: int) -> bytes:
        """Bytes ``start..end-1`` of the pinned version (a reset mid-body is retried)."""
        self.requests.append((start, end - start))
        kwargs: dict[str, Any] = {
            "Bucket": self._bucket,
            "Key": self._key,
            "Range": f"bytes={start}-{end - 1}",
            "IfMatch": f'"{self._etag}"',
        }
        for attempt in range(self._stream_retries + 1):
            if self._version_id:
                kwargs["VersionId"] = self._version_id
            try:
                response = self._client.get_object(**kwargs)
            except (ClientError, BotoCoreError) as err:
                raise_s3_error(err, "reading", self._bucket, self._key)
            self._checked = True
            version = response.get("VersionId")
            if self._version_id is None and version and version != "null":
                self._version_id = version
            try:
                data: bytes = response["Body"].read()
            except STREAM_ERRORS as err:
                if attempt == self._stream_retries:
                    raise_s3_error(err, "reading", self._bucket, self._key)
                time.sleep(0.2 * 2**attempt)
                continue
            self.fetched += len(data)
            if len(data) != end - start:
                where = f"s3://{self._bucket}/{self._key}"
                raise S3Error(f"reading {where}: {len(data)} bytes came back for a range of {end - start}")
            return data
        raise AssertionError("unreachable")


class ParquetParser:
    """The rows of a Parquet file from row ``next_record`` on, as :class:`Record` s.

    ``offset`` is an estimate of the source bytes behind the rows handed out (each row group's
    uncompressed size spread evenly over its rows): a deterministic function of the row number, so a
    chunk's byte budget ends it at the same row whether or not the attempt resumed. ``line`` is the
    number of the next row (1-based).
    """

    def __init__(self, file: PinnedFile, where: str, next_record: int) -> None:
        self.where = where
        self.file = file
        try:
            self.pf = pq.ParquetFile(file)
            meta = self.pf.metadata
            self.group_rows = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
            self.group_bytes = [meta.row_group(i).total_byte_size for i in range(meta.num_row_groups)]
        except (pa.ArrowException, OSError) as err:
            raise self.bad(err, 0) from None
        total = sum(self.group_rows)
        if next_record > total:
            raise BadFile(f"{where} has fewer rows ({total}) than its checkpoint ({next_record})")
        self.start = next_record
        self.line = next_record + 1
        self.offset = self._offset_at(next_record)

    def _offset_at(self, row: int) -> int:
        offset = 0
        for rows, size in zip(self.group_rows, self.group_bytes, strict=True):
            if row < rows:
                return offset + (size * row // rows if rows else 0)
            offset += size
            row -= rows
        return offset

    def bad(self, err: Exception, row: int) -> BadFile:
        """A corrupt or truncated file (never quotes its bytes)."""
        what = str(err).splitlines()[0] if str(err) else type(err).__name__
        return BadFile(
            f"{self.where} is not a readable Parquet file ({type(err).__name__}: {what[:200]}), at row {row + 1}. "
            "Upload it again (a truncated upload loses the footer), or give it another extension if it is "
            "not Parquet; retrying cannot fix it."
        )

    def start_group(self) -> tuple[int, int]:
        """The row group holding row ``start``, and the row within it."""
        row = self.start
        for group, rows in enumerate(self.group_rows):
            if row < rows:
                return group, row
            row -= rows
        return len(self.group_rows), 0

    def __iter__(self) -> Iterator[Record]:
        group, skip = self.start_group()
        row = self.start
        names = self.pf.schema_arrow.names
        for g in range(group, len(self.group_rows)):
            try:
                batches = self.pf.iter_batches(batch_size=BATCH_ROWS, row_groups=[g], use_threads=False)
                for batch in batches:
                    if skip:
                        if skip >= batch.num_rows:
                            skip -= batch.num_rows
                            continue
                        batch, skip = batch.slice(skip), 0
                    columns = [json_values(batch.column(j), names[j], self.where) for j in range(batch.num_columns)]
                    for values in zip(*columns, strict=True):
                        row += 1
                        self.line = row + 1
                        self.offset = self._offset_at(row)
                        yield Record(row, dict(zip(names, values, strict=True)))
            except (pa.ArrowException, OSError) as err:
                raise self.bad(err, row) from None


# ---------------------------------------------------------------------------- values


def json_values(array: pa.Array, column: str, where: str) -> list[Any]:
    """The values of ``array`` as JSON values, losslessly (the mapping is in the module docstring)."""
    t = array.type
    if pa.types.is_dictionary(t):
        return json_values(array.dictionary_decode(), column, where)
    if isinstance(t, pa.ExtensionType):
        return json_values(array.storage, column, where)
    valid = array.is_valid().to_pylist()
    if pa.types.is_struct(t):
        fields = [json_values(child, column, where) for child in array.flatten()]
        names = [t.field(i).name for i in range(t.num_fields)]
        return [dict(zip(names, vals, strict=True)) if ok else None for ok, *vals in zip(valid, *fields, strict=True)]
    if pa.types.is_map(t):
        offsets = array.offsets.to_pylist()
        lo, hi = offsets[0], offsets[-1]
        keys = json_values(array.keys.slice(lo, hi - lo), column, where)
        items = json_values(array.items.slice(lo, hi - lo), column, where)
        return [
            [{"key": keys[i - lo], "value": items[i - lo]} for i in range(a, b)] if ok else None
            for ok, a, b in zip(valid, offsets, offsets[1:], strict=False)
        ]
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        if pa.types.is_fixed_size_list(t):
            n = t.list_size
            offsets = [(array.offset + i) * n for i in range(len(array) + 1)]
        else:
            offsets = array.offsets.to_pylist()
        lo, hi = offsets[0], offsets[-1]
        values = json_values(array.values.slice(lo, hi - lo), column, where)
        return [values[a - lo : b - lo] if ok else None for ok, a, b in zip(valid, offsets, offsets[1:], strict=False)]
    leaf = _leaf(t, column, where)
    if leaf is None:
        return array.to_pylist()
    source = array.cast(pa.int32() if t.bit_width == 32 else pa.int64()) if _by_count(t) else array
    return [leaf(v) if v is not None else None for v in source.to_pylist()]


def _by_count(t: pa.DataType) -> bool:
    """Types converted from their integer count of units (exact at any unit)."""
    return pa.types.is_timestamp(t) or pa.types.is_time(t) or pa.types.is_duration(t)


def _leaf(t: pa.DataType, column: str, where: str) -> Any:
    """How a scalar of ``t`` becomes JSON (None: as pyarrow gives it, already exact JSON)."""
    if (
        pa.types.is_null(t)
        or pa.types.is_boolean(t)
        or pa.types.is_integer(t)
        or pa.types.is_decimal(t)
        or pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_string_view(t)
    ):
        return None
    if pa.types.is_floating(t):
        return _float
    binary = (pa.types.is_binary, pa.types.is_large_binary, pa.types.is_fixed_size_binary, pa.types.is_binary_view)
    if any(is_binary(t) for is_binary in binary):
        return lambda v: base64.b64encode(v).decode("ascii")
    if pa.types.is_date(t):
        return lambda v: v.isoformat()
    if pa.types.is_timestamp(t):
        digits, suffix = _UNIT_DIGITS[t.unit], ("Z" if t.tz else "")
        return lambda v: _timestamp(v, digits, suffix)
    if pa.types.is_time(t):
        digits = _UNIT_DIGITS[t.unit]
        return lambda v: _clock(v, digits)
    if pa.types.is_duration(t):
        digits = _UNIT_DIGITS[t.unit]
        return lambda v: ("-" if v < 0 else "") + "PT" + _seconds(abs(v), digits) + "S"
    raise BadFile(
        f"{where}: column {column!r} has the Arrow type {t}, which s3batch does not map to JSON "
        "(see the Parquet mapping in docs/reference/job-input.md); convert that column or leave it out of the file"
    )


def _float(v: float) -> float | str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "Infinity" if v > 0 else "-Infinity"
    return v


def _seconds(count: int, digits: int) -> str:
    """``count`` units (10**-digits s) as seconds with ``digits`` fraction digits."""
    whole, frac = divmod(count, 10**digits)
    return f"{whole}.{frac:0{digits}d}" if digits else str(whole)


def _split(count: int, digits: int) -> tuple[int, str]:
    whole, frac = divmod(count, 10**digits)
    return whole, (f".{frac:0{digits}d}" if digits else "")


def _timestamp(count: int, digits: int, suffix: str) -> str | int:
    seconds, frac = _split(count, digits)
    try:
        moment = _EPOCH + datetime.timedelta(seconds=seconds)
    except OverflowError:
        return count
    return moment.strftime("%Y-%m-%dT%H:%M:%S").rjust(19, "0") + frac + suffix


def _clock(count: int, digits: int) -> str:
    seconds, frac = _split(count, digits)
    hours, rest = divmod(seconds, 3600)
    return f"{hours:02d}:{rest // 60:02d}:{rest % 60:02d}{frac}"

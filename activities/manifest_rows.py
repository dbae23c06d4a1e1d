"""Reading a manifest's data files: which they are (``data_files``), their rows (``DataFileRows``), and
where a worker process's pages of them ended (``ManifestPositions``). The listing of a page, the
check at a job's start and the formats are described in ``s3batch.activities.manifests``."""

from __future__ import annotations

import codecs
import contextlib
import csv
import gzip
import json
import threading
import urllib.parse
from collections import OrderedDict, deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

# pyarrow ships no type hints (no py.typed): its names are Any here.
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]
from botocore.exceptions import BotoCoreError, ClientError

from s3batch.errors import InvalidInput
from s3batch.formats.parquet import PinnedFile
from s3batch.limits import allows, check_allowed, not_allowed
from s3batch.s3io import open_object, raise_s3_error, strip_etag
from s3batch.selection import split_s3_uri

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

    from s3batch.config import Settings

_WINDOW = 1024 * 1024
"""Bytes a ranged GET of a plain data file asks for at a time (a page of 1,000 rows is some 100 KB)."""
_GZIP_WINDOW = 16 * 1024 * 1024
"""The same for a gzip data file."""


class Row(NamedTuple):
    bucket: str
    key: str
    version_id: str | None


class DataFile(NamedTuple):
    bucket: str
    key: str
    kind: str
    """``csv`` (plain), ``jsonl`` (plain), ``inventory-csv`` or ``inventory-parquet``."""
    columns: tuple[str, ...] = ()
    """An inventory CSV's columns (its ``fileSchema``)."""
    pinned: tuple[str, int] | None = None
    """Its ETag and size, when already known (a plain list is the manifest itself)."""


def manifest_error(where: str, what: str) -> InvalidInput:
    """What is wrong with the manifest ``where``, and what to do."""
    return InvalidInput(f"the manifest {where} {what}; fix the manifest (or name another one) and start the job again")


def _get(s3: S3Client, bucket: str, key: str, what: str) -> Any:
    try:
        return s3.head_object(Bucket=bucket, Key=key)
    except (ClientError, BotoCoreError) as err:
        raise_s3_error(err, f"reading {what}", bucket, key)


def data_files(s3: S3Client, uri: str, settings: Settings) -> tuple[list[DataFile], str]:
    """The data files of the manifest ``uri`` (one for a plain list, read at the version returned) and
    the manifest's version (its ETag).

    The manifest and each data file an inventory's ``destinationBucket`` and ``files`` name must be
    allowed sources of this worker (``S3BATCH_ALLOWED_SOURCES``), checked before any is read: whoever
    writes a manifest under an allowed prefix cannot make the worker read elsewhere. A refused data
    file is named by its place in the manifest, not by its bucket and key.
    """
    bucket, key = split_s3_uri(uri)
    check_allowed(settings, "sources", bucket, key)
    lowered = key.lower().removesuffix(".gz")
    plain = "csv" if lowered.endswith(".csv") else "jsonl" if lowered.endswith((".jsonl", ".ndjson")) else None
    if plain is not None:
        head = _get(s3, bucket, key, "the manifest")
        etag = strip_etag(head["ETag"])
        return [DataFile(bucket, key, plain, pinned=(etag, head["ContentLength"]))], etag
    if not lowered.endswith(".json"):
        raise manifest_error(uri, "is neither an S3 Inventory manifest.json nor a .csv or .jsonl list of objects")
    try:
        response = s3.get_object(Bucket=bucket, Key=key)
        body = response["Body"].read()
    except (ClientError, BotoCoreError) as err:
        raise_s3_error(err, "reading the manifest", bucket, key)
    try:
        doc = json.loads(body)
        destination = str(doc["destinationBucket"]).rsplit(":", 1)[-1]
        fmt = str(doc.get("fileFormat", "CSV")).lower()
        columns = tuple(c.strip() for c in str(doc.get("fileSchema", "Bucket, Key")).split(","))
        files = [str(f["key"]) for f in doc["files"]]
    except (ValueError, KeyError, TypeError, AttributeError):
        what = "is not an S3 Inventory manifest (destinationBucket, fileFormat, fileSchema, files)"
        raise manifest_error(uri, what) from None
    if fmt not in ("csv", "parquet"):
        raise manifest_error(uri, f"lists {fmt.upper()} data files: s3batch reads CSV and Parquet inventories")
    if fmt == "csv" and not {"Bucket", "Key"} <= set(columns):
        raise manifest_error(uri, "has a fileSchema without Bucket and Key")
    allowed = allows(settings, "sources")
    for i, f in enumerate(files):
        if not allowed(destination, f):
            raise not_allowed(settings, "sources", f"the data file that destinationBucket and files[{i}] of {uri} name")
    return [DataFile(destination, f, f"inventory-{fmt}", columns) for f in files], strip_etag(response["ETag"])


Version = tuple[str, str, str]
"""A data file's bucket, key and ETag."""


class _Cursor:
    """A data file being read: its rows as ``(row number, row)``, the rows looked ahead, the streams."""

    def __init__(self, rows: Iterator[tuple[int, Row | None]], stack: contextlib.ExitStack) -> None:
        self.rows, self.stack = rows, stack
        self.ahead: deque[tuple[int, Row | None]] = deque()
        self.row = 0
        """The last row handed out."""

    def __iter__(self) -> _Cursor:
        return self

    def __next__(self) -> tuple[int, Row | None]:
        item = self.ahead.popleft() if self.ahead else next(self.rows)
        self.row = item[0]
        return item

    def more(self) -> bool:
        """Whether a row that names an object follows (read ahead, still to be handed out)."""
        if any(row is not None for _, row in self.ahead):
            return True
        for item in self.rows:
            self.ahead.append(item)
            if item[1] is not None:
                return True
        return False


class ManifestPositions:
    """Where a worker process's pages of manifest data files ended, so the next page starts there.

    A page of a manifest starts after the row the page before ended on (the token counts rows). Read
    from its first byte for every page, a data file made the listing quadratic in its rows (a
    million-row CSV: about half a second of reading a page, for 2,000 pages of 500). Kept by data
    file version (ETag): for a plain data file, the byte offsets where pages ended (the next page is
    a ranged GET from there); for a gzip one, which cannot be entered in the middle, the file itself,
    left open where the page ended (a few at most). A page handed to another worker process starts
    from the furthest position that process has. Parquet data files skip whole row groups instead
    (their metadata counts rows).
    """

    def __init__(self, files: int = 64, per_file: int = 16, open_files: int = 4) -> None:
        self._known: OrderedDict[Version, list[tuple[int, int]]] = OrderedDict()
        self._open: OrderedDict[Version, _Cursor] = OrderedDict()
        self._files, self._per_file, self._open_files = files, per_file, open_files
        self._lock = threading.Lock()  # activities run in a thread pool

    def nearest(self, version: Version, row: int) -> tuple[int, int]:
        """The furthest known ``(row, offset)`` at or before ``row`` (``(0, 0)``: the file's start):
        rows up to ``row`` end at ``offset``."""
        with self._lock:
            known = self._known.get(version, [])
            return max((p for p in known if p[0] <= row), default=(0, 0))

    def note(self, version: Version, row: int, offset: int) -> None:
        """Rows up to ``row`` of the data file ``version`` end at byte ``offset``."""
        with self._lock:
            known = self._known.setdefault(version, [])
            self._known.move_to_end(version)
            known.append((row, offset))
            del known[: -self._per_file]
            while len(self._known) > self._files:
                self._known.popitem(last=False)

    def reopen(self, version: Version, row: int) -> _Cursor | None:
        """The data file ``version`` left open at or before ``row``, taken (one page reads it at a time)."""
        with self._lock:
            cursor = self._open.get(version)
            if cursor is None or cursor.row > row:
                return None
            del self._open[version]
            return cursor

    def leave_open(self, version: Version, cursor: _Cursor) -> None:
        """Keep ``cursor`` for the next page of ``version`` (closing the oldest beyond ``open_files``)."""
        with self._lock:
            closing = [c for c in (self._open.pop(version, None),) if c is not None]
            self._open[version] = cursor
            while len(self._open) > self._open_files:
                closing.append(self._open.popitem(last=False)[1])
        for old in closing:
            old.stack.close()


class DataFileRows:
    """The rows of one data file after its row ``after``, in order, as ``(row number, row)``; the row
    None where it names no object to process (a header, a delete marker, a version that is not the
    latest), so row numbers stay the file's. Its streams close with ``stack`` (the page's) unless the
    file is left open for the next page.

    A row naming an object this worker may not read (``settings``' ``S3BATCH_ALLOWED_SOURCES``) raises
    ``InvalidInput`` naming the row, not the object, before anything looks the object up."""

    def __init__(
        self,
        s3: S3Client,
        data: DataFile,
        stack: contextlib.ExitStack,
        after: int,
        positions: ManifestPositions,
        settings: Settings,
    ) -> None:
        self.s3, self.data, self.after, self.positions, self.settings = s3, data, after, positions, settings
        if data.pinned is not None:
            self.etag, self.size = data.pinned
        else:
            head = _get(s3, data.bucket, data.key, "the manifest data file")
            self.etag, self.size = strip_etag(head["ETag"]), head["ContentLength"]
        self.version: Version = (data.bucket, data.key, self.etag)
        text = data.kind != "inventory-parquet"
        self.gzip = text and data.key.lower().endswith(".gz")
        self.plain = text and not self.gzip
        self.end = 0
        """Where the last row read ends in the file (plain data files)."""
        cursor = positions.reopen(self.version, after) if self.gzip else None
        if cursor is None:
            own = contextlib.ExitStack()
            cursor = _Cursor(self._read(own), own)
        self.cursor = cursor
        self._left_open = False
        stack.callback(lambda: None if self._left_open else cursor.stack.close())

    def __iter__(self) -> Iterator[tuple[int, Row | None]]:
        allowed = allows(self.settings, "sources")
        for n, row in self.cursor:
            if n > self.after:
                if row is not None and not allowed(row.bucket, row.key):
                    where = f"the object that row {n} of s3://{self.data.bucket}/{self.data.key} names"
                    raise not_allowed(self.settings, "sources", where)
                yield n, row

    def page_ended(self, row: int) -> bool:
        """The page ended on ``row``, the last row handed out: keep where the next page starts.
        Whether a row that names an object follows in this file."""
        if self.plain:
            self.positions.note(self.version, row, self.end)
        more = self.cursor.more()
        if self.gzip:
            self.positions.leave_open(self.version, self.cursor)
            self._left_open = True
        return more

    def _read(self, stack: contextlib.ExitStack) -> Iterator[tuple[int, Row | None]]:
        data, where = self.data, f"s3://{self.data.bucket}/{self.data.key}"
        if data.kind == "inventory-parquet":
            file = PinnedFile(self.s3, data.bucket, data.key, etag=self.etag, size=self.size, version_id=None)
            yield from _parquet_rows(stack.enter_context(file), where, self.after)
            return
        first, start = self.positions.nearest(self.version, self.after) if self.plain else (0, 0)
        window = _WINDOW if self.plain else _GZIP_WINDOW
        stream: Any = stack.enter_context(
            open_object(self.s3, data.bucket, data.key, etag=self.etag, size=self.size, start=start, window=window)
        )
        if self.gzip:
            stream = stack.enter_context(gzip.GzipFile(fileobj=stream, mode="rb"))
        self.end = start
        try:
            lines = self._lines(stream, at_start=start == 0)
            if data.kind == "jsonl":
                for n, line in enumerate(lines, first + 1):
                    yield n, _json_row(line, where, n) if line.strip() else None
            else:
                for n, fields in enumerate(csv.reader(lines), first + 1):
                    yield n, _csv_row(fields, data, where, n)
        except (UnicodeDecodeError, csv.Error, gzip.BadGzipFile, EOFError, OSError) as err:
            raise manifest_error(where, f"cannot be read ({type(err).__name__})") from None

    def _lines(self, stream: Any, *, at_start: bool) -> Iterator[str]:
        """The file's lines, counting their bytes (the CSV reader takes a row's lines, no more, before
        it yields the row: ``self.end`` is then where the row ends). ``at_start``: the stream starts at
        the file's first byte, where a UTF-8 byte order mark is dropped (spreadsheet tools write one
        before a CSV; it is no part of the first row's bucket or of a header)."""
        for line in stream:
            self.end += len(line)
            if at_start:
                at_start = False
                line = line.removeprefix(codecs.BOM_UTF8)
            yield line.decode("utf-8")


def _csv_row(fields: list[str], data: DataFile, where: str, n: int) -> Row | None:
    if data.kind == "csv":
        if not fields or (n == 1 and [f.strip().lower() for f in fields[:2]] == ["bucket", "key"]):
            return None
        if len(fields) < 2 or not fields[0] or not fields[1]:
            raise manifest_error(where, f"row {n} is not bucket,key[,version_id]")
        return Row(fields[0], fields[1], (fields[2] or None) if len(fields) > 2 else None)
    row = dict(zip(data.columns, fields, strict=False))
    if row.get("IsDeleteMarker", "false").lower() == "true" or row.get("IsLatest", "true").lower() != "true":
        return None
    if not row.get("Bucket") or "Key" not in row:
        raise manifest_error(where, f"row {n} has no Bucket and Key")
    return Row(row["Bucket"], urllib.parse.unquote_plus(row["Key"]), row.get("VersionId") or None)


def _json_row(line: str, where: str, n: int) -> Row:
    try:
        doc = json.loads(line)
        bucket, key, version = doc["bucket"], doc["key"], doc.get("version_id")
    except (ValueError, KeyError, TypeError):
        raise manifest_error(where, f"line {n} is not a JSON object with bucket and key") from None
    if not isinstance(bucket, str) or not isinstance(key, str) or not isinstance(version, str | None):
        raise manifest_error(where, f"line {n} has a bucket, key or version_id that is not a string")
    return Row(bucket, key, version or None)


def _parquet_rows(file: PinnedFile, where: str, after: int) -> Iterator[tuple[int, Row | None]]:
    try:
        pf = pq.ParquetFile(file)
        names = set(pf.schema_arrow.names)
        if not {"bucket", "key"} <= names:
            raise manifest_error(where, "has no bucket and key columns")
        wanted = [c for c in ("bucket", "key", "version_id", "is_latest", "is_delete_marker") if c in names]
        # The row groups wholly before the page are not read: their metadata says how many rows they hold.
        n, groups = 0, list(range(pf.num_row_groups))
        while groups and n + pf.metadata.row_group(groups[0]).num_rows <= after:
            n += pf.metadata.row_group(groups.pop(0)).num_rows
        if not groups:
            return
        for batch in pf.iter_batches(batch_size=10_000, row_groups=groups, columns=wanted, use_threads=False):
            for r in batch.to_pylist():
                n += 1
                if n <= after:
                    continue
                if r.get("is_delete_marker") or r.get("is_latest") is False:
                    yield n, None
                else:
                    yield n, Row(r["bucket"], r["key"], r.get("version_id") or None)
    except (pa.ArrowException, OSError) as err:
        raise manifest_error(where, f"is not readable Parquet ({type(err).__name__})") from None

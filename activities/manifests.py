"""Listing a job's objects from a manifest instead of a prefix: a page of the objects it names.

A manifest is ``s3://bucket/key`` of:

- an **S3 Inventory report**: its ``manifest.json`` (``sourceBucket``, ``destinationBucket``,
  ``fileFormat`` ``CSV`` or ``Parquet``, ``fileSchema``, ``files``), whose data files (gzip CSV
  without a header, keys URL-encoded, columns as ``fileSchema`` names them; or Parquet with the
  columns ``bucket``, ``key``, ``version_id``...) list the objects. Delete markers and versions that
  are not the latest are skipped: one version of each key is processed, the one inventoried;
- a **plain CSV** (``.csv``, ``.csv.gz``) of ``bucket,key[,version_id]`` rows (keys as they are, not
  URL-encoded; an optional header row ``bucket,key[,version_id]``), or a **JSONL** (``.jsonl``,
  ``.ndjson``, optionally ``.gz``) of ``{"bucket": ..., "key": ..., "version_id": ...}`` objects.

One manifest names the objects of one bucket (an inventory always does; output keys are
``output_prefix + key``, so two buckets' keys could collide), and each key once (a key named twice
would be processed twice into the same output): the job checks both at its start, reading the whole
manifest once (``check_manifest``), and fails with ``InvalidInput`` naming the rows. A row with a
version pins that version; every object is looked up (one HEAD, with its version) for its ETag and
size, and one missing in S3 is listed with the ETag ``"deleted"``: its file activity fails with
``NotFound``, so it is reported as a failed file, the job goes on. The job's filters apply to the
rows (keys, and the modification time HEAD gives).

Continuation token: ``"<data file>:<row>:<bucket>"``, the position after the last row of the page
(rows of a data file are counted from its start) and the bucket of the manifest's rows (empty until
the first row). The next page does not read the rows before it again (:class:`ManifestPositions`): a
plain data file is entered at the byte where the worker process saw the page end, a gzip one read on
where the process left it open, a Parquet one entered at its row group.
"""

from __future__ import annotations

import array
import contextlib
import csv
import gzip
import json
import threading
import urllib.parse
from collections import OrderedDict, deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, NamedTuple

# pyarrow ships no type hints (no py.typed): its names are Any here.
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]
from botocore.exceptions import BotoCoreError, ClientError

from s3batch.errors import InvalidInput
from s3batch.formats.parquet import PinnedFile
from s3batch.messages import ListObjectsInput, ListObjectsResult, ObjectRef
from s3batch.s3io import is_missing_object, open_object, raise_s3_error, strip_etag
from s3batch.selection import KeyFilter, split_s3_uri

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

_HEADS = 16
"""HEAD requests in flight while a page is looked up."""
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


def _fail(where: str, what: str) -> InvalidInput:
    return InvalidInput(f"the manifest {where} {what}; fix the manifest (or name another one) and start the job again")


def _get(s3: S3Client, bucket: str, key: str, what: str) -> Any:
    try:
        return s3.head_object(Bucket=bucket, Key=key)
    except (ClientError, BotoCoreError) as err:
        raise_s3_error(err, f"reading {what}", bucket, key)


def data_files(s3: S3Client, uri: str) -> list[DataFile]:
    """The data files of the manifest ``uri`` (one for a plain list)."""
    bucket, key = split_s3_uri(uri)
    lowered = key.lower().removesuffix(".gz")
    if lowered.endswith(".csv"):
        return [DataFile(bucket, key, "csv")]
    if lowered.endswith((".jsonl", ".ndjson")):
        return [DataFile(bucket, key, "jsonl")]
    if not lowered.endswith(".json"):
        raise _fail(uri, "is neither an S3 Inventory manifest.json nor a .csv or .jsonl list of objects")
    try:
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    except (ClientError, BotoCoreError) as err:
        raise_s3_error(err, "reading the manifest", bucket, key)
    try:
        doc = json.loads(body)
        destination = str(doc["destinationBucket"]).rsplit(":", 1)[-1]
        fmt = str(doc.get("fileFormat", "CSV")).lower()
        columns = tuple(c.strip() for c in str(doc.get("fileSchema", "Bucket, Key")).split(","))
        files = [str(f["key"]) for f in doc["files"]]
    except (ValueError, KeyError, TypeError, AttributeError):
        raise _fail(uri, "is not an S3 Inventory manifest (destinationBucket, fileFormat, fileSchema, files)") from None
    if fmt not in ("csv", "parquet"):
        raise _fail(uri, f"lists {fmt.upper()} data files: s3batch reads CSV and Parquet inventories")
    if fmt == "csv" and not {"Bucket", "Key"} <= set(columns):
        raise _fail(uri, "has a fileSchema without Bucket and Key")
    return [DataFile(destination, f, f"inventory-{fmt}", columns) for f in files]


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
    file is left open for the next page."""

    def __init__(
        self, s3: S3Client, data: DataFile, stack: contextlib.ExitStack, after: int, positions: ManifestPositions
    ) -> None:
        head = _get(s3, data.bucket, data.key, "the manifest data file")
        self.s3, self.data, self.after, self.positions = s3, data, after, positions
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
        for n, row in self.cursor:
            if n > self.after:
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
            lines = self._lines(stream)
            if data.kind == "jsonl":
                for n, line in enumerate(lines, first + 1):
                    yield n, _json_row(line, where, n) if line.strip() else None
            else:
                for n, fields in enumerate(csv.reader(lines), first + 1):
                    yield n, _csv_row(fields, data, where, n)
        except (UnicodeDecodeError, csv.Error, gzip.BadGzipFile, EOFError, OSError) as err:
            raise _fail(where, f"cannot be read ({type(err).__name__})") from None

    def _lines(self, stream: Any) -> Iterator[str]:
        """The file's lines, counting their bytes (the CSV reader takes a row's lines, no more, before
        it yields the row: ``self.end`` is then where the row ends)."""
        for line in stream:
            self.end += len(line)
            yield line.decode("utf-8")


def _csv_row(fields: list[str], data: DataFile, where: str, n: int) -> Row | None:
    if data.kind == "csv":
        if not fields or (n == 1 and [f.strip().lower() for f in fields[:2]] == ["bucket", "key"]):
            return None
        if len(fields) < 2 or not fields[0] or not fields[1]:
            raise _fail(where, f"row {n} is not bucket,key[,version_id]")
        return Row(fields[0], fields[1], (fields[2] or None) if len(fields) > 2 else None)
    row = dict(zip(data.columns, fields, strict=False))
    if row.get("IsDeleteMarker", "false").lower() == "true" or row.get("IsLatest", "true").lower() != "true":
        return None
    if not row.get("Bucket") or "Key" not in row:
        raise _fail(where, f"row {n} has no Bucket and Key")
    return Row(row["Bucket"], urllib.parse.unquote_plus(row["Key"]), row.get("VersionId") or None)


def _json_row(line: str, where: str, n: int) -> Row:
    try:
        doc = json.loads(line)
        bucket, key, version = doc["bucket"], doc["key"], doc.get("version_id")
    except (ValueError, KeyError, TypeError):
        raise _fail(where, f"line {n} is not a JSON object with bucket and key") from None
    if not isinstance(bucket, str) or not isinstance(key, str) or not isinstance(version, str | None):
        raise _fail(where, f"line {n} has a bucket, key or version_id that is not a string")
    return Row(bucket, key, version or None)


def _parquet_rows(file: PinnedFile, where: str, after: int) -> Iterator[tuple[int, Row | None]]:
    try:
        pf = pq.ParquetFile(file)
        names = set(pf.schema_arrow.names)
        if not {"bucket", "key"} <= names:
            raise _fail(where, "has no bucket and key columns")
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
        raise _fail(where, f"is not readable Parquet ({type(err).__name__})") from None


def _look_up(s3: S3Client, row: Row) -> tuple[ObjectRef, Any]:
    """The object a row names, pinned (ETag, size, the row's version), and its LastModified; the
    ETag ``"deleted"`` when it is not in S3."""
    kwargs: dict[str, Any] = {"Bucket": row.bucket, "Key": row.key}
    if row.version_id:
        kwargs["VersionId"] = row.version_id
    try:
        head = s3.head_object(**kwargs)
    except ClientError as err:
        if not is_missing_object(err):
            raise_s3_error(err, "reading", row.bucket, row.key)
        return ObjectRef(key=row.key, etag="deleted", size=0, version_id=row.version_id, bucket=row.bucket), None
    except BotoCoreError as err:
        raise_s3_error(err, "reading", row.bucket, row.key)
    ref = ObjectRef(
        key=row.key, etag=strip_etag(head["ETag"]), size=head["ContentLength"], version_id=row.version_id,
        bucket=row.bucket,
    )
    return ref, head.get("LastModified")


def list_manifest_page(s3: S3Client, req: ListObjectsInput, positions: ManifestPositions) -> ListObjectsResult:
    """The next page (at most ``req.page_size`` objects) of the manifest ``req.manifest``."""
    assert req.manifest is not None
    files = data_files(s3, req.manifest)
    file_index, row_index, bucket = _position(req.continuation_token)
    selection = req.selection or KeyFilter()
    taken: list[Row] = []
    seen: set[str] = set()
    more = False
    with contextlib.ExitStack() as stack:
        while file_index < len(files):
            reader = DataFileRows(s3, files[file_index], stack, row_index, positions)
            it = iter(reader)
            for n, row in it:
                if row is None:
                    continue
                bucket = bucket or row.bucket
                if row.bucket != bucket:
                    raise _two_buckets(req.manifest, bucket, row, files[file_index], n)
                if row.key not in seen and selection.takes_key(row.key):
                    seen.add(row.key)
                    taken.append(row)
                if len(taken) >= req.page_size:
                    break
            else:
                file_index, row_index = file_index + 1, 0
                continue
            row_index = n
            # The page is full: the listing goes on unless no row names an object after this one.
            more = reader.page_ended(n) or file_index < len(files) - 1
            break
    with ThreadPoolExecutor(_HEADS) as pool:
        found = list(pool.map(lambda r: _look_up(s3, r), taken))
    objects = [ref for ref, modified in found if selection.takes(ref.key, modified)]
    return ListObjectsResult(objects=objects, next_token=f"{file_index}:{row_index}:{bucket}" if more else None)


def _position(token: str | None) -> tuple[int, int, str]:
    if not token:
        return 0, 0, ""
    file_index, row_index, bucket = token.split(":", 2)
    return int(file_index), int(row_index), bucket


def _two_buckets(uri: str, bucket: str, row: Row, data: DataFile, n: int) -> InvalidInput:
    return _fail(
        uri,
        f"names objects of two buckets ({bucket!r}, then {row.bucket!r} in {data.key!r}, row {n}): one job "
        "reads one bucket; split it per bucket",
    )


def check_manifest(s3: S3Client, uri: str) -> None:
    """At the start of a job: the manifest can be read, names objects of one bucket, and each key once.

    A key named twice would be processed twice (into the same output: output keys are
    ``output_prefix + key``), and counted twice. The whole manifest is read once for it (4-5 s a
    million rows on 2 shared cores), holding 8 bytes a row (a hash of each key; the rows of a
    repeated hash are read again to name them).

    Raises:
        InvalidInput: A data file is not readable, or the rows name two buckets or a key twice.
    """
    files = data_files(s3, uri)
    hashes = array.array("Q")
    bucket = ""
    for data in files:
        with contextlib.ExitStack() as stack:
            for n, row in DataFileRows(s3, data, stack, 0, ManifestPositions()):
                if row is not None:
                    bucket = bucket or row.bucket
                    if row.bucket != bucket:
                        raise _two_buckets(uri, bucket, row, data, n)
                    hashes.append(hash(row.key) & _HASH_MASK)
    column = pa.Array.from_buffers(pa.uint64(), len(hashes), [None, pa.py_buffer(hashes)])
    if len(pc.unique(column)) < len(hashes):
        _refuse_repeats(s3, uri, files, column)


_HASH_MASK = (1 << 64) - 1


def _refuse_repeats(s3: S3Client, uri: str, files: list[DataFile], column: Any) -> None:
    """Name the keys the manifest repeats (where their hashes repeat: none, when the hashes collided)."""
    counts = pc.value_counts(column)
    repeated = set(counts.field("values").filter(pc.greater(counts.field("counts"), 1)).to_pylist())
    rows: dict[str, list[str]] = {}
    for data in files:
        with contextlib.ExitStack() as stack:
            for n, row in DataFileRows(s3, data, stack, 0, ManifestPositions()):
                if row is not None and hash(row.key) & _HASH_MASK in repeated:
                    rows.setdefault(row.key, []).append(f"row {n} of {data.key}")
    twice = {key: where for key, where in rows.items() if len(where) > 1}
    if twice:
        key, where = next(iter(twice.items()))
        others = f", and {len(twice) - 1} other key(s) more than once" if len(twice) > 1 else ""
        raise _fail(
            uri,
            f"names {key!r} {len(where)} times ({', '.join(where[:3])}){others}: a job processes each key once "
            "(its output is output_prefix + key); remove the repeated rows",
        )

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
``output_prefix + key``, so two buckets' keys could collide): a row naming another bucket fails the
job (``InvalidInput``). A row with a version pins that version; every object is looked up (one
HEAD, with its version) for its ETag and size, and one missing in S3 is listed with the ETag
``"deleted"``: its file activity fails with ``NotFound``, so it is reported as a failed file, the
job goes on. The job's filters apply to the rows (keys, and the modification time HEAD gives).

Continuation token: ``"<data file>:<row>:<bucket>"``, the position after the last row of the page
(rows of a data file are counted from its start, and skipped again by the next page) and the bucket
of the manifest's rows (empty until the first row).
"""

from __future__ import annotations

import contextlib
import csv
import gzip
import io
import json
import urllib.parse
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, NamedTuple

# pyarrow ships no type hints (no py.typed): its names are Any here.
import pyarrow as pa  # type: ignore[import-untyped]
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


def rows(s3: S3Client, data: DataFile, stack: contextlib.ExitStack) -> Iterator[Row | None]:
    """The rows of one data file, in order; None for a row that names no object to process (a
    header, a delete marker, a version that is not the latest), so row numbers stay the file's."""
    head = _get(s3, data.bucket, data.key, "the manifest data file")
    etag, size = strip_etag(head["ETag"]), head["ContentLength"]
    where = f"s3://{data.bucket}/{data.key}"
    if data.kind == "inventory-parquet":
        file = PinnedFile(s3, data.bucket, data.key, etag=etag, size=size, version_id=None)
        yield from _parquet_rows(stack.enter_context(file), where)
        return
    stream: Any = stack.enter_context(open_object(s3, data.bucket, data.key, etag=etag, size=size))
    if data.key.lower().endswith(".gz"):
        stream = stack.enter_context(gzip.GzipFile(fileobj=stream, mode="rb"))
    text = io.TextIOWrapper(stream, encoding="utf-8", newline="")
    try:
        if data.kind == "jsonl":
            for n, line in enumerate(text, 1):
                yield _json_row(line, where, n) if line.strip() else None
        else:
            for n, fields in enumerate(csv.reader(text), 1):
                yield _csv_row(fields, data, where, n)
    except (UnicodeDecodeError, csv.Error, gzip.BadGzipFile, EOFError, OSError) as err:
        raise _fail(where, f"cannot be read ({type(err).__name__})") from None


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


def _parquet_rows(file: PinnedFile, where: str) -> Iterator[Row | None]:
    try:
        pf = pq.ParquetFile(file)
        names = set(pf.schema_arrow.names)
        if not {"bucket", "key"} <= names:
            raise _fail(where, "has no bucket and key columns")
        wanted = [c for c in ("bucket", "key", "version_id", "is_latest", "is_delete_marker") if c in names]
        for batch in pf.iter_batches(batch_size=10_000, columns=wanted, use_threads=False):
            for r in batch.to_pylist():
                if r.get("is_delete_marker") or r.get("is_latest") is False:
                    yield None
                else:
                    yield Row(r["bucket"], r["key"], r.get("version_id") or None)
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


def list_manifest_page(s3: S3Client, req: ListObjectsInput) -> ListObjectsResult:
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
            it = rows(s3, files[file_index], stack)
            n = 0
            for row in it:
                n += 1
                if n <= row_index or row is None:
                    continue
                bucket = bucket or row.bucket
                if row.bucket != bucket:
                    raise _fail(
                        req.manifest,
                        f"names objects of two buckets ({bucket!r}, then {row.bucket!r} in {files[file_index].key!r}, "
                        f"row {n}): one job reads one bucket; split it per bucket",
                    )
                if row.key not in seen and selection.takes_key(row.key):
                    seen.add(row.key)
                    taken.append(row)
                if len(taken) >= req.page_size:
                    break
            else:
                file_index, row_index = file_index + 1, 0
                continue
            row_index = n
            # The page is full: the listing goes on unless this was the last row of the last file.
            more = file_index < len(files) - 1 or next(it, None) is not None or any(True for _ in it)
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


def check_manifest(s3: S3Client, uri: str) -> None:
    """At the start of a job: the manifest can be read and its data files exist."""
    for data in data_files(s3, uri):
        _get(s3, data.bucket, data.key, "the manifest data file")


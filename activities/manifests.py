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
  A UTF-8 byte order mark at the start of either (spreadsheet tools write one) is dropped.

One manifest names the objects of one bucket (an inventory always does; output keys are
``output_prefix + key``, so two buckets' keys could collide), and each key once (a key named twice
would be processed twice into the same output): the job checks both at its start, reading the whole
manifest once (``check_manifest``), and fails with ``InvalidInput`` naming the rows. A row with a
version pins that version; every object is looked up (one HEAD, with its version) for its ETag and
size, and one missing in S3 is listed with the ETag ``"deleted"``: its file activity fails with
``NotFound``, so it is reported as a failed file, the job goes on. The job's filters apply to the
rows (keys, and the modification time HEAD gives).

Every object a manifest names is an object the worker reads: the data files an inventory's
``destinationBucket`` and ``files`` name, and each row's object (HEADed here, processed later), are
checked against the worker's ``S3BATCH_ALLOWED_SOURCES`` before any request for them, at the job's
start and on every page (a data file may change between the two). A refused one fails the job with
``InvalidInput`` naming where in the manifest it is named (never its bucket and key).

Continuation token: ``"<data file>:<row>:<bucket>"``, the position after the last row of the page
(rows of a data file are counted from its start) and the bucket of the manifest's rows (empty until
the first row). The next page does not read the rows before it again (:class:`ManifestPositions`): a
plain data file is entered at the byte where the worker process saw the page end, a gzip one read on
where the process left it open, a Parquet one entered at its row group.
"""

from __future__ import annotations

import array
import contextlib
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

# pyarrow ships no type hints (no py.typed): its names are Any here.
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]
from botocore.exceptions import BotoCoreError, ClientError
from s3batch.activities.manifest_rows import DataFile, DataFileRows, ManifestPositions, Row, data_files, manifest_error

from s3batch.errors import InvalidInput
from s3batch.messages import ListObjectsInput, ListObjectsResult, ObjectRef
from s3batch.s3io import is_missing_object, raise_s3_error, strip_etag
from s3batch.selection import KeyFilter

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

    from s3batch.config import Settings

_HEADS = 16
"""HEAD requests in flight while a page is looked up."""


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


def list_manifest_page(
    s3: S3Client, req: ListObjectsInput, positions: ManifestPositions, settings: Settings
) -> ListObjectsResult:
    """The next page (at most ``req.page_size`` objects) of the manifest ``req.manifest``; every object
    it names checked against the worker's ``settings`` (allowed sources) before it is looked up."""
    assert req.manifest is not None
    files, version = data_files(s3, req.manifest, settings)
    if req.manifest_version is not None and version != req.manifest_version:
        raise manifest_error(
            req.manifest,
            f"changed since the job started (ETag {version!r}, not {req.manifest_version!r}): a job lists one "
            "version of its manifest (its pages count rows, which another version would miss or repeat); "
            "start a new job for the new version",
        )
    file_index, row_index, bucket = _position(req.continuation_token)
    selection = req.selection or KeyFilter()
    taken: list[Row] = []
    seen: set[str] = set()
    more = False
    with contextlib.ExitStack() as stack:
        while file_index < len(files):
            reader = DataFileRows(s3, files[file_index], stack, row_index, positions, settings)
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
    return manifest_error(
        uri,
        f"names objects of two buckets ({bucket!r}, then {row.bucket!r} in {data.key!r}, row {n}): one job "
        "reads one bucket; split it per bucket",
    )


def check_manifest(s3: S3Client, uri: str, settings: Settings) -> str:
    """At the start of a job: the manifest can be read, names objects of one bucket, and each key once.
    Its version (ETag), which every page of the job's listing checks.

    A key named twice would be processed twice (into the same output: output keys are
    ``output_prefix + key``), and counted twice. The whole manifest is read once for it (4-5 s a
    million rows on 2 shared cores), holding 8 bytes a row (a hash of each key; the rows of a
    repeated hash are read again to name them).

    Raises:
        InvalidInput: A data file is not readable, or the rows name two buckets or a key twice, or an
            object this worker may not read (``settings``' allowed sources; named by its row).
    """
    files, version = data_files(s3, uri, settings)
    hashes = array.array("Q")
    bucket = ""
    for data in files:
        with contextlib.ExitStack() as stack:
            for n, row in DataFileRows(s3, data, stack, 0, ManifestPositions(), settings):
                if row is not None:
                    bucket = bucket or row.bucket
                    if row.bucket != bucket:
                        raise _two_buckets(uri, bucket, row, data, n)
                    hashes.append(hash(row.key) & _HASH_MASK)
    column = pa.Array.from_buffers(pa.uint64(), len(hashes), [None, pa.py_buffer(hashes)])
    if len(pc.unique(column)) < len(hashes):
        _refuse_repeats(s3, uri, files, column, settings)
    return version


_HASH_MASK = (1 << 64) - 1


def _refuse_repeats(s3: S3Client, uri: str, files: list[DataFile], column: Any, settings: Settings) -> None:
    """Name the keys the manifest repeats (where their hashes repeat: none, when the hashes collided)."""
    counts = pc.value_counts(column)
    repeated = set(counts.field("values").filter(pc.greater(counts.field("counts"), 1)).to_pylist())
    rows: dict[str, list[str]] = {}
    for data in files:
        with contextlib.ExitStack() as stack:
            for n, row in DataFileRows(s3, data, stack, 0, ManifestPositions(), settings):
                if row is not None and hash(row.key) & _HASH_MASK in repeated:
                    rows.setdefault(row.key, []).append(f"row {n} of {data.key}")
    twice = {key: where for key, where in rows.items() if len(where) > 1}
    if twice:
        key, where = next(iter(twice.items()))
        others = f", and {len(twice) - 1} other key(s) more than once" if len(twice) > 1 else ""
        raise manifest_error(
            uri,
            f"names {key!r} {len(where)} times ({', '.join(where[:3])}){others}: a job processes each key once "
            "(its output is output_prefix + key); remove the repeated rows",
        )

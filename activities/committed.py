"""What a cancelled or failed file had committed, read back from its output when the workflow could not know it.

A file stopped by a cancel normally returns the counts of its last checkpoint itself
(:func:`s3batch.activities.files.process_file`). When it could not (the cancel found it between two
attempts, waiting for a retry, or its worker was gone), the workflow records it ``cancelled`` with
zero counts; a file that failed (its source changed or deleted mid-file, its attempts used up) is recorded
``failed`` with zero counts too, unless its error said how far it got. The report must still say what was
committed, so :func:`fill_cancelled` reads each such file's committed checkpoint and takes its counts (a
redrive resumes from exactly there): for S3 parts, the checkpoint of the last contiguous part of the file, or
of each of its byte-range splits (one LIST and one HEAD a file or split); for a PostgreSQL table, the file's
checkpoint row in the database, which the sink advances in the same transaction as the rows (one query for up
to 1,000 files, through the worker's pools).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from botocore.exceptions import BotoCoreError, ClientError
from pydantic import ValidationError

from s3batch import layout
from s3batch.checkpoint import CHECKPOINT_MAC_METADATA, CHECKPOINT_METADATA, Checkpoint, checkpoint_mac_ok
from s3batch.messages import FileResult, Totals
from s3batch.s3io import raise_s3_error
from s3batch.sinks.spec import PostgresSink, S3Sink

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

    from s3batch.sinks.postgres_pools import PostgresPools


def last_committed(
    s3: S3Client, bucket: str, output_prefix: str, key: str, etag: str, secret: bytes | None, split: int | None = None
) -> Checkpoint | None:
    """The checkpoint of the last contiguous part (``part-0`` ... ``part-n-1``) of ``key`` (or of its
    byte-range split ``split``) written for the source version ``etag``, or None when it has none."""
    folder = layout.file_dir(output_prefix, key)
    indices: dict[int, str] = {}  # chunk -> its part's key (.jsonl or .parquet, as the sink wrote it)
    start = f"{folder}part-" if split is None else f"{folder}part-{split:03d}-"
    try:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=start):
            for item in page.get("Contents", []):
                found = layout.output_of(item["Key"][len(folder) :])
                if found is not None and found[0] == "part" and found[1] == split:
                    indices[found[2]] = item["Key"]
    except (ClientError, BotoCoreError) as err:
        raise_s3_error(err, "listing output under", bucket, folder)
    n = 0
    while n in indices:
        n += 1
    if not n:
        return None
    part = indices[n - 1]
    try:
        metadata = s3.head_object(Bucket=bucket, Key=part).get("Metadata", {})
    except (ClientError, BotoCoreError) as err:
        raise_s3_error(err, "reading", bucket, part)
    raw = metadata.get(CHECKPOINT_METADATA)
    mac = metadata.get(CHECKPOINT_MAC_METADATA)
    if not raw or (secret is not None and not checkpoint_mac_ok(secret, bucket, part, raw, mac)):
        return None
    try:
        cp = Checkpoint.model_validate_json(raw)
    except ValidationError:
        return None
    return cp if cp.etag == etag and cp.chunk == n else None


def table_committed(
    spec: PostgresSink,
    pools: PostgresPools | None,
    bucket: str,
    files: list[FileResult],
    rejected_of: str | None = None,
) -> dict[tuple[str, str], Checkpoint]:
    """The checkpoints committed in the database of ``files`` (source ``bucket``, "" for a manifest job's)
    written into the table of ``spec``, by (key, etag): those of the files' versions only. A key found in
    several buckets of a manifest job with the same version is left out (which one is this job's is unknown).
    ``rejected_of``: a redrive of rejected records' (its checkpoint rows are its own)."""
    from s3batch.sinks.postgres_pools import pools_or_default, stored_checkpoints

    wanted = {(f.key, f.etag) for f in files}
    found: dict[tuple[str, str], Checkpoint] = {}
    seen: set[tuple[str, str]] = set()
    keys = list(dict.fromkeys(f.key for f in files))
    pool = pools_or_default(pools).for_table(spec)
    for key, raw in stored_checkpoints(pool, spec, bucket, keys, rejected_of):
        try:
            cp = Checkpoint.model_validate(raw) if raw is not None else None
        except ValidationError:
            cp = None
        if cp is None or (key, cp.etag) not in wanted or not cp.chunk:
            continue
        if (key, cp.etag) in seen:
            found.pop((key, cp.etag), None)
            continue
        seen.add((key, cp.etag))
        found[(key, cp.etag)] = cp
    return found


def fill_cancelled(
    s3: S3Client,
    bucket: str,
    output_prefix: str,
    files: list[FileResult],
    totals: Totals,
    secret: bytes | None,
    *,
    sink: S3Sink | PostgresSink | None = None,
    pools: PostgresPools | None = None,
    source_bucket: str = "",
    rejected_of: str | None = None,
) -> tuple[list[FileResult], Totals]:
    """``files`` and ``totals`` with each cancelled or failed file that reported nothing (no chunk) given the
    counts of its last committed checkpoint: read from its parts in ``bucket`` under ``output_prefix``,
    or, for a job whose ``sink`` is a PostgreSQL table, from the database through the worker's ``pools``
    (``source_bucket``: the job's source bucket, "" for a manifest job; ``rejected_of``: its ``rejected_of``)."""
    totals = totals.model_copy()
    files = [_split_parts(s3, bucket, output_prefix, f, totals, secret) if f.splits else f for f in files]
    silent = [f for f in files if _silent(f)]
    if not silent:
        return files, totals
    found: dict[tuple[str, str], dict[str, int]] = {}
    if isinstance(sink, PostgresSink):
        for where, cp in table_committed(sink, pools, source_bucket, silent, rejected_of).items():
            found[where] = dict(zip(_COUNTS, _counts(cp), strict=True))
    else:
        for f in silent:
            sums = _folder_committed(s3, bucket, output_prefix, f, secret)
            if sums is not None:
                found[(f.key, f.etag)] = sums
    filled: list[FileResult] = []
    for f in files:
        sums = found.get((f.key, f.etag)) if _silent(f) else None
        if sums is not None:
            f = f.model_copy(update=sums)
            for name in ("records", "records_written", "rejected", "dropped"):
                setattr(totals, name, getattr(totals, name) + sums[name])
        filled.append(f)
    return filled, totals


def _silent(f: FileResult) -> bool:
    """A cancelled or failed file that reported nothing of what it committed (a file refused before it wrote
    anything, ``InvalidInput``, is left as it is: what its folder or table holds is an earlier job's)."""
    if f.status == "failed" and (f.error or "").startswith("InvalidInput"):
        return False
    return f.status in ("cancelled", "failed") and f.chunks == 0 and f.records == 0 and not f.splits


def _counts(cp: Checkpoint) -> tuple[int, ...]:
    return cp.next_record, cp.records_written, cp.rejected, cp.dropped, cp.chunk


def _folder_committed(
    s3: S3Client, bucket: str, output_prefix: str, f: FileResult, secret: bytes | None
) -> dict[str, int] | None:
    """The counts committed in ``f``'s folder for its version: of its last contiguous part, or of each byte-range
    split's (a failed file does not say whether it ran in splits), summed; None when nothing is committed."""
    folder = layout.file_dir(output_prefix, f.key)
    splits: set[int | None] = set()
    try:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{folder}part-"):
            for item in page.get("Contents", []):
                found = layout.output_of(item["Key"][len(folder) :])
                if found is not None and found[0] == "part":
                    splits.add(found[1])
    except (ClientError, BotoCoreError) as err:
        raise_s3_error(err, "listing output under", bucket, folder)
    sums = dict.fromkeys(_COUNTS, 0)
    committed = False
    for split in [None] if None in splits else sorted(s for s in splits if s is not None):
        cp = last_committed(s3, bucket, output_prefix, f.key, f.etag, secret, split)
        if cp is not None:
            committed = True
            for name, value in zip(_COUNTS, _counts(cp), strict=True):
                sums[name] += value
    return sums if committed else None


_COUNTS = ("records", "records_written", "rejected", "dropped", "chunks")


def _split_parts(
    s3: S3Client, bucket: str, output_prefix: str, f: FileResult, totals: Totals, secret: bytes | None
) -> FileResult:
    """A cancelled file processed in splits (``f.splits``), counted from the last part of each split (a split
    the cancel found waiting for a retry reported nothing); ``totals`` adjusted. Other files as they are."""
    if f.status != "cancelled" or not f.splits:
        return f
    sums = dict.fromkeys(_COUNTS, 0)
    for split in range(f.splits):
        cp = last_committed(s3, bucket, output_prefix, f.key, f.etag, secret, split)
        if cp is not None:
            for name, value in zip(_COUNTS, _counts(cp), strict=True):
                sums[name] += value
    if all(sums[name] <= getattr(f, name) for name in _COUNTS):
        return f  # the splits' own results said as much
    for name in ("records", "records_written", "rejected", "dropped"):
        setattr(totals, name, getattr(totals, name) + sums[name] - getattr(f, name))
    return f.model_copy(update=sums)

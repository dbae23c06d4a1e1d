"""What a cancelled or failed file committed, read back from its output, and its output made exactly that.

A file stopped by a cancel normally returns the counts of its last checkpoint itself
(:func:`s3batch.activities.files.process_file`). When it could not (the cancel found it between two
attempts, waiting for a retry, or its worker was gone), the workflow records it ``cancelled`` with
zero counts; a file that failed (its source changed or deleted mid-file, its attempts used up) is recorded
``failed`` with zero counts too, unless its error said how far it got. The report must still say what was
committed, so :func:`fill_cancelled` reads each such file's committed checkpoint and takes its counts (a
redrive resumes from exactly there): for S3 parts, the checkpoint of the last contiguous part of the file, or
of each of its byte-range splits (one LIST a file and one HEAD a file or split); for a PostgreSQL table, the
file's checkpoint row in the database, which the sink advances in the same transaction as the rows (one query
for up to 1,000 files, through the worker's pools).

And the output must hold no more than that: what an attempt wrote past its last commit (the rejects file of a
chunk whose transaction did not commit, a part after a gap) and the output of splits that began inside a record
(``split_void``) are removed, so a stopped file's folder holds exactly what its report entry counts (found by
the soak: a cancelled file's rejects files held 16 rejects, its report 11).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from botocore.exceptions import BotoCoreError, ClientError
from pydantic import ValidationError

from s3batch import layout
from s3batch.checkpoint import CHECKPOINT_MAC_METADATA, CHECKPOINT_METADATA, Checkpoint, checkpoint_mac_ok
from s3batch.messages import FileResult, Totals
from s3batch.s3io import delete_keys, list_folder, raise_s3_error
from s3batch.sinks.spec import PostgresSink, S3Sink

if TYPE_CHECKING:
    from collections.abc import Sequence

    from mypy_boto3_s3 import S3Client

    from s3batch.sinks.postgres_pools import PostgresPools


class _Folder:
    """A file's output folder as one LIST found it: its output objects (parts and rejects files) by
    ``(kind, split, chunk)``."""

    def __init__(self, s3: S3Client, bucket: str, output_prefix: str, key: str) -> None:
        self.s3, self.bucket = s3, bucket
        self.dir = layout.file_dir(output_prefix, key)
        self.objects: dict[tuple[str, int | None, int], str] = {}
        for name in list_folder(s3, bucket, self.dir):
            found = layout.output_of(name)
            if found is not None:
                self.objects[found] = self.dir + name

    def splits(self) -> set[int | None]:
        """The splits (None: the whole file) it holds parts of."""
        return {split for kind, split, _ in self.objects if kind == "part"}

    def committed(self, etag: str, secret: bytes | None, split: int | None) -> Checkpoint | None:
        """The checkpoint of the last contiguous part (``part-0`` ... ``part-n-1``) of the whole file (or of its
        byte-range split ``split``) written for the source version ``etag``, or None when it has none."""
        n = 0
        while ("part", split, n) in self.objects:
            n += 1
        if not n:
            return None
        part = self.objects[("part", split, n - 1)]
        try:
            metadata = self.s3.head_object(Bucket=self.bucket, Key=part).get("Metadata", {})
        except (ClientError, BotoCoreError) as err:
            raise_s3_error(err, "reading", self.bucket, part)
        raw = metadata.get(CHECKPOINT_METADATA)
        mac = metadata.get(CHECKPOINT_MAC_METADATA)
        if not raw or (secret is not None and not checkpoint_mac_ok(secret, self.bucket, part, raw, mac)):
            return None
        try:
            cp = Checkpoint.model_validate_json(raw)
        except ValidationError:
            return None
        return cp if cp.etag == etag and cp.chunk == n else None

    def prune(self, chunks: dict[int | None, int]) -> None:
        """Remove every output object past the committed ``chunks`` of its split (a split not named: all of its):
        the rejects file of a chunk whose commit did not happen (written first, as a table's transaction does),
        parts after a gap, the output of splits that are void or of another way of cutting the file."""
        doomed = [key for (_, split, chunk), key in self.objects.items() if chunk >= chunks.get(split, 0)]
        if doomed:
            delete_keys(self.s3, self.bucket, sorted(doomed))


def table_committed(
    spec: PostgresSink,
    pools: PostgresPools | None,
    bucket: str,
    files: list[FileResult],
    rejected_of: str | None = None,
) -> dict[tuple[str, str], Checkpoint | None]:
    """The checkpoints committed in the database of ``files`` (source ``bucket``, "" for a manifest job's)
    written into the table of ``spec``, by (key, etag): those of the files' versions only. A key found in
    several buckets of a manifest job with the same version maps to None (which one is this job's is unknown).
    ``rejected_of``: a redrive of rejected records' (its checkpoint rows are its own)."""
    from s3batch.sinks.postgres_pools import pools_or_default, stored_checkpoints

    wanted = {(f.key, f.etag) for f in files}
    found: dict[tuple[str, str], Checkpoint | None] = {}
    keys = list(dict.fromkeys(f.key for f in files))
    pool = pools_or_default(pools).for_table(spec)
    for key, raw in stored_checkpoints(pool, spec, bucket, keys, rejected_of):
        try:
            cp = Checkpoint.model_validate(raw) if raw is not None else None
        except ValidationError:
            cp = None
        if cp is None or (key, cp.etag) not in wanted or not cp.chunk:
            continue
        found[(key, cp.etag)] = None if (key, cp.etag) in found else cp
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
    """``files`` and ``totals`` with each cancelled or failed file's output made exactly what it committed.

    Its folder in ``bucket`` under ``output_prefix`` is listed once; what lies past its committed checkpoint is
    removed (:meth:`_Folder.prune`), and a file that reported nothing (no chunk), or in splits, or ``split_void``,
    takes the counts of that checkpoint: the last contiguous part of the file or of each of its splits, or, for a
    job whose ``sink`` is a PostgreSQL table, the file's checkpoint row, read through the worker's ``pools``
    (``source_bucket``: the job's source bucket, "" for a manifest job; ``rejected_of``: its ``rejected_of``)."""
    totals = totals.model_copy()
    stopped = [f for f in files if _stopped(f)]
    if not stopped:
        return files, totals
    rows = table_committed(sink, pools, source_bucket, stopped, rejected_of) if isinstance(sink, PostgresSink) else None
    filled: list[FileResult] = []
    for f in files:
        if _stopped(f):
            sums = _committed(_Folder(s3, bucket, output_prefix, f.key), f, secret, rows)
            if sums is not None and (_silent(f) or f.split_void or any(sums[n] > getattr(f, n) for n in _COUNTS)):
                for name in ("records", "records_written", "rejected", "dropped"):
                    setattr(totals, name, getattr(totals, name) + sums[name] - getattr(f, name))
                f = f.model_copy(update=sums)
        filled.append(f)
    return filled, totals


_COUNTS = ("records", "records_written", "rejected", "dropped", "chunks")


def _stopped(f: FileResult) -> bool:
    """A cancelled or failed file, but one refused before it wrote anything (``InvalidInput``: what its folder or
    table holds is an earlier job's)."""
    if f.status == "failed" and (f.error or "").startswith("InvalidInput"):
        return False
    return f.status in ("cancelled", "failed")


def _silent(f: FileResult) -> bool:
    """A stopped file that reported nothing of what it committed."""
    return f.chunks == 0 and f.records == 0 and not f.splits


def _committed(
    folder: _Folder, f: FileResult, secret: bytes | None, rows: dict[tuple[str, str], Checkpoint | None] | None
) -> dict[str, int] | None:
    """The counts ``f`` committed (None: nothing), its folder pruned to them. Of its checkpoint row for a table
    (``rows``); else of the last contiguous part of the whole file (``split_void``: its splits' output is void),
    of each of its ``splits``, or, for a file that does not say (a failed one), of the whole file's where it has
    parts, else of each split found."""
    zero = dict.fromkeys(_COUNTS, 0)
    if rows is not None:
        where = (f.key, f.etag)
        if where in rows and rows[where] is None:
            return None  # a key of two buckets (a manifest job): which rejects are whose is unknown; left as is
        row = rows.get(where)
        folder.prune({None: row.chunk if row is not None else 0})
        return dict(zip(_COUNTS, _counts(row), strict=True)) if row is not None else (zero if f.split_void else None)
    found = folder.splits()
    splits: Sequence[int | None]
    if f.split_void or (not f.splits and None in found):
        splits = [None]
    elif f.splits:
        splits = range(f.splits)
    else:
        splits = sorted(s for s in found if s is not None)
    sums, chunks, any_committed = dict(zero), {}, False
    for split in splits:
        cp = folder.committed(f.etag, secret, split)
        chunks[split] = cp.chunk if cp is not None else 0
        if cp is not None:
            any_committed = True
            for name, value in zip(_COUNTS, _counts(cp), strict=True):
                sums[name] += value
    folder.prune(chunks)
    return sums if any_committed or f.split_void else None


def _counts(cp: Checkpoint) -> tuple[int, ...]:
    return cp.next_record, cp.records_written, cp.rejected, cp.dropped, cp.chunk

"""A file's attempt before it reads: its metrics, its sink (for this source version and these options)
and the check that its output keys fit S3's limit. Used by :class:`~s3batch.activities.file_job.FileJob`.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import TYPE_CHECKING

from s3batch.activities.write_behind import WriteBehind
from temporalio import activity

from s3batch import layout
from s3batch.checkpoint import Checkpoint, fingerprint
from s3batch.columns import encoder_of
from s3batch.errors import OutputKeyTooLong
from s3batch.file_output import FileOutput
from s3batch.formats.compression import MAX_RATIO
from s3batch.handlers import passthrough
from s3batch.limits import sse_params
from s3batch.sinks import Sink, open_sink
from s3batch.sinks.spec import PostgresSink

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from s3batch.activities.file_job import FileJob
    from s3batch.activities.rejected import RejectedLines

    from s3batch.config import Settings
    from s3batch.formats.common import ParsedFormat
    from s3batch.formats.keys import Compression
    from s3batch.messages import ProcessFileInput
    from s3batch.reading import Reading
    from s3batch.sinks.postgres_pools import PostgresPools


class FileMetrics:
    """The project's own metrics, next to the SDK's (exported by the worker's Prometheus endpoint)."""

    def __init__(self, handler: str) -> None:
        meter = activity.metric_meter().with_additional_attributes({"handler": handler})
        self.records = meter.create_counter("s3batch_records_processed", "Records read and handled", "records")
        self.rejected = meter.create_counter("s3batch_records_rejected", "Records sent to rejects", "records")
        self.bytes_read = meter.create_counter("s3batch_bytes_read", "Source bytes consumed", "bytes")
        self.chunks = meter.create_counter("s3batch_chunks_committed", "Parts written with their checkpoint")
        self.resumes = meter.create_counter("s3batch_resumes", "File attempts that resumed from a checkpoint")
        self.checkpoint_age = meter.create_histogram_float(
            "s3batch_checkpoint_age_seconds",
            "Age of a file's previous checkpoint when the next one is committed",
            "s",
        )

    def chunk_committed(self, before: Checkpoint, after: Checkpoint, records: int, last_commit: float) -> float:
        """Count one chunk committed (``before`` -> ``after``, ``records`` read); returns the time of this commit."""
        now = time.monotonic()
        self.records.add(records)
        if after.rejected > before.rejected:
            self.rejected.add(after.rejected - before.rejected)
        if after.byte_offset is not None and before.byte_offset is not None:
            self.bytes_read.add(after.byte_offset - before.byte_offset)
        self.chunks.add(1)
        self.checkpoint_age.record(now - last_commit)
        return now


def open_file_sink(
    s3: S3Client,
    settings: Settings,
    req: ProcessFileInput,
    fmt: ParsedFormat,
    compression: Compression | None,
    reading: Reading,
    where: str,
    log_extra: dict[str, str],
    pools: PostgresPools | None,
    redrive: RejectedLines | None = None,
) -> Sink:
    """The file's sink (by default its S3 output folder), for this source version and these options. A table's
    checkpoint is also this file's under another ``chunk_records`` (``rows_fingerprint``): its rows are the same,
    and it resumes at a record and byte position, not at a part. ``redrive``: a redrive of rejected records (its
    identity enters the fingerprints: ``s3batch.activities.rejected``)."""
    shaped = functools.partial(
        fingerprint,
        # Before the JSON reader, a .json file under format auto was read as JSON Lines; the JSON
        # reader reads JSON Lines content the same, so their committed parts keep their fingerprint
        # (what differs, a one-line array once read as one record, is one chunk: never resumed).
        fmt="jsonl" if fmt == "json" and req.format == "auto" else fmt,
        compression=compression,
        handler=req.handler,
        max_record_bytes=req.max_record_bytes,
        reading=reading.changed(),
        sink=req.sink.shape() if req.sink is not None else None,
        redrive=None if redrive is None else redrive.identity,
    )
    shape = shaped(chunk_records=req.chunk_records)
    rows = shaped(chunk_records=None) if isinstance(req.sink, PostgresSink) else None
    folder = FileOutput(
        s3,
        bucket=req.output_bucket,
        output_prefix=req.output_prefix,
        key=req.obj.key,
        etag=req.obj.etag,
        fingerprint=shape,
        secret=settings.checkpoint_secret.get_secret_value().encode() or None,
        put_params=sse_params(settings),
        log_extra=log_extra,
        rows_fingerprint=rows,
    )
    return open_sink(
        req.sink, folder, pools=pools, job_id=req.job_id, bucket=req.bucket, where=where, rejected_of=req.rejected_of
    )


def read_as_begun(job: FileJob, cp: Checkpoint) -> Checkpoint:
    """``cp``, where the file's attempt starts, and the file read as its import began: a table's import that
    writes unquoted empty CSV fields NULL (``Reading.empty_null``) says so in its checkpoints from the first on; one
    begun by a release that wrote them '' goes on so (its reading changed), not half one way, half the other."""
    if not job.reading.empty_null:
        return cp
    if not cp.next_record:
        return cp.model_copy(update={"empty_null": True})
    if not cp.empty_null:
        job.reading = job.source.reading = dataclasses.replace(job.reading, empty_null=False)
    return cp


def check_key_length(req: ProcessFileInput, compression: Compression | None, where: str) -> None:
    """Fail at once when the longest key this file can write is over S3's limit (1,024 bytes):
    otherwise it would fail at the first chunk with rejects, after writing parts."""
    # Records are at least one byte each, and decompression expands at most MAX_RATIO times.
    max_records = req.obj.size * (MAX_RATIO[compression] if compression else 1) + 1
    # A chunk holds at least one record and may end before chunk_records at the byte budget
    # (S3BATCH_MAX_CHUNK_BYTES): only the number of records bounds the number of chunks.
    max_chunks = max_records
    split = None if req.split is None else req.split.index
    longest = layout.longest_output_key(req.output_prefix, req.obj.key, max_chunks, split)
    size = len(longest.encode())
    if size > layout.MAX_KEY_BYTES:
        raise OutputKeyTooLong(
            f"the output keys of {where} would be up to {size} bytes, over S3's limit of "
            f"{layout.MAX_KEY_BYTES} bytes (output_prefix: {len(req.output_prefix.encode())} bytes, "
            f"the source key: {len(layout.encode_key(req.obj.key).encode())} bytes as written, then "
            f"'/{layout.rejects_name(0, split)}'); use a shorter output_prefix or a shorter source key. "
            "Nothing was written for this file."
        )


BEHIND_MIN_BYTES = 4 * 1024 * 1024
"""Smaller files are written at once: a thread for one or two parts costs more than the overlap saves."""


def chunk_paths(handler: object, output: object, size: int) -> tuple[bool, bool, WriteBehind]:
    """How a file's chunks are kept and written: into JSONL parts, the built-in ``passthrough`` and a handler
    with a block encoder (``s3batch.columns``) take runs of rows' documents at once from the fast CSV path
    (``packed``); into a table in insert mode passthrough keeps them as the file's own CSV for the
    database's CSV ``COPY`` (``as_csv``). A file of ``size`` bytes or more (``BEHIND_MIN_BYTES``) is written
    behind the chunk loop: its parts on S3 one chunk behind, its table's transactions as many as the sink
    allows (``PostgresOutput.writes_behind``, ``writes_at_once`` of them at once); a small file's chunks at
    once."""
    passing = handler is passthrough
    packed = (passing or encoder_of(handler) is not None) and type(output) is FileOutput
    as_csv = passing and bool(getattr(output, "takes_csv", False))
    depth = int(getattr(output, "writes_behind", 0)) or (1 if isinstance(output, FileOutput) else 0)
    threads = int(getattr(output, "writes_at_once", 1))
    return packed, as_csv, WriteBehind(bool(depth) and size >= BEHIND_MIN_BYTES, depth, threads)

"""Which job committed a file found done: an earlier job's output is not this job's to report as written.

A job over a file whose output an earlier job committed whole, with the same options (its table, or the same
output folder: the same job again under a new ID, a redrive), writes nothing for it; its report says so
(``FileResult.already_written``, ``records_written`` 0). A later attempt of the same job that finds the file
done (its result was lost) reports what the job wrote. Which job committed it:

- S3 parts (JSONL, Parquet): every part and rejects object carries the writing job's mark in its user metadata
  (:data:`JOB_METADATA`, a digest of the job's ID, so a long ID never crowds the 2 KB of metadata); the file's
  last part is read back (one HEAD). Parts written before marks existed carry none: counted as this job's, as
  before.
- A table: the file's checkpoint row names the job that last advanced it (``job_id``).

Asked only of a file found done at the start of an attempt (:meth:`FileJob.result`).
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from botocore.exceptions import BotoCoreError, ClientError

from s3batch import layout
from s3batch.file_output import FileOutput
from s3batch.s3io import is_missing_object, raise_s3_error

if TYPE_CHECKING:
    from s3batch.checkpoint import Checkpoint
    from s3batch.sinks import Sink
    from s3batch.sinks.postgres import PostgresOutput

JOB_METADATA = "s3batch-job-mark"
"""User-metadata entry of the parts and rejects objects a job writes: :func:`job_mark` of its ID."""


def job_mark(job_id: str) -> str:
    """A short digest of a job's ID, as :data:`JOB_METADATA` holds it."""
    return hashlib.sha256(job_id.encode()).hexdigest()[:16]


def mark_output(output: FileOutput, job_id: str) -> None:
    """Make the objects ``output`` writes carry the mark of job ``job_id``."""
    output.marks[JOB_METADATA] = job_mark(job_id)


def written_before(sink: Sink, cp: Checkpoint, job_id: str) -> bool:
    """Whether ``cp``, a file's final checkpoint found committed at the start of an attempt of job ``job_id``,
    was committed by another job (``sink``: the file's ``Sink``).

    Raises:
        S3BatchError: S3 or the database cannot be read (retryable when they may answer later).
    """
    if not cp.done or cp.chunk < 1:
        return False
    if isinstance(sink, FileOutput):
        return _part_mark(sink, cp.chunk - 1) not in (None, job_mark(job_id))
    from s3batch.sinks.postgres import PostgresOutput  # a table's job only: psycopg

    return isinstance(sink, PostgresOutput) and _row_job(sink, cp) not in (None, job_id)


def _part_mark(output: FileOutput, chunk: int) -> str | None:
    """The job mark of part ``chunk`` of ``output`` (None: no mark, or no such part)."""
    key = output.dir + layout.part_name(chunk, output.part_suffix, output.split)
    try:
        head = output.s3.head_object(Bucket=output.bucket, Key=key)
    except (ClientError, BotoCoreError) as err:
        if isinstance(err, ClientError) and is_missing_object(err):
            return None
        raise_s3_error(err, "reading", output.bucket, key)
    mark = head.get("Metadata", {}).get(JOB_METADATA)
    return mark if isinstance(mark, str) else None


def _row_job(sink: PostgresOutput, cp: Checkpoint) -> str | None:
    """The job that committed ``cp``, done, in the file's checkpoint row of the sink's table (None: no such row)."""
    import psycopg
    from psycopg import sql
    from psycopg_pool import PoolTimeout

    from s3batch.sinks.postgres_access import checkpoint_table
    from s3batch.sinks.postgres_session import database_error

    query = sql.SQL(
        "SELECT job_id FROM {} WHERE target = %s AND source_bucket = %s AND source_key = %s AND done "
        "AND etag = %s AND fingerprint = %s"
    ).format(checkpoint_table(sink.spec))
    args = (*sink.row.key, cp.etag, cp.fingerprint)
    try:
        with sink.pool.connection() as conn:
            row = conn.execute(query, args).fetchone()
    except (psycopg.Error, PoolTimeout) as err:
        raise database_error(err, "reading the checkpoint of", sink.spec, "retried (nothing was written)") from None
    return None if row is None else str(row[0])

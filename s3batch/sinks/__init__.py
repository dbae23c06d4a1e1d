"""Sinks: where a job's records go, chunk by chunk, each chunk committed with the file's checkpoint.

One interface (:class:`Sink`): open for a file (:func:`open_sink`), find the committed checkpoint to
resume from (``resume_point``), write a chunk with its checkpoint atomically (``commit``), and, once
the file is done, name the earlier output to remove (``stale``). The default sink is the S3 JSONL
parts of :class:`s3batch.file_output.FileOutput` (layout and bytes as before sinks existed); the job
input's ``sink`` (:mod:`s3batch.sinks.spec`) picks another: Parquet parts, or a PostgreSQL table
(:mod:`s3batch.sinks.postgres`, imported only by jobs that use it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from s3batch.sinks.spec import PostgresSink, S3Sink

if TYPE_CHECKING:
    from s3batch.checkpoint import Checkpoint
    from s3batch.file_output import FileOutput
    from s3batch.sinks.postgres_pools import PostgresPools

After = Callable[[], bool]
"""Given to a sink's write of a chunk while the write of the chunk before may still run on another thread
(``WriteBehind`` with more than one thread: a table in insert mode): waits for that write; whether it
committed."""


class Sink(Protocol):
    """What the chunk loop (``FileJob``) needs of a sink, for one file (one version, one set of options)."""

    dir: str
    """The file's output folder in the output bucket (parts, rejects)."""
    fingerprint: str
    """The options' fingerprint (``s3batch.checkpoint.fingerprint``), sink included."""

    def is_ours(self, cp: Checkpoint) -> bool:
        """Whether ``cp`` was written for this source version and these options."""
        ...

    def resume_point(self, heartbeat: Checkpoint | None, start: Checkpoint, *, fresh: bool) -> Checkpoint:
        """The committed checkpoint to resume from (``start`` when nothing is committed)."""
        ...

    def commit(
        self,
        cp: Checkpoint,
        new: Checkpoint,
        output: list[bytes],
        rejects: list[tuple[int, bytes]],
        lines: Sequence[int] = (),
    ) -> Checkpoint:
        """Write chunk ``cp.chunk`` (``output``: JSON documents; ``lines``: the source line of each)
        and its rejects with the checkpoint ``new``, atomically; return the checkpoint committed
        (``new``, or ``new`` with the rows the sink refused counted as rejects)."""
        ...

    def stale(self, cp: Checkpoint, listed: dict[str, str], where: str) -> list[str]:
        """Once the file is done at ``cp``: the names of the output objects in its folder (``listed``:
        name -> ETag) that are not this version's, to remove. Raises ``AccountingError`` when
        committed output is missing."""
        ...


def open_sink(
    spec: S3Sink | PostgresSink | None,
    output: FileOutput,
    *,
    pools: PostgresPools | None,
    job_id: str,
    bucket: str,
    where: str,
    rejected_of: str | None = None,
) -> Sink:
    """The sink of one file.

    Args:
        spec: The job's ``sink`` (None: JSONL parts).
        output: The file's S3 output folder (parts and rejects), its fingerprint computed with ``spec``.
        pools: The worker's PostgreSQL pools (needed by a ``postgres`` sink).
        job_id: The job's workflow ID (stored with a database checkpoint; its mark on the S3 objects written).
        bucket: The source bucket.
        where: ``s3://bucket/key`` of the source (error messages).
        rejected_of: The job's ``rejected_of`` (a redrive of rejected records: a table keeps its checkpoints apart).

    Raises:
        SinkInvalid: A ``postgres`` sink names a connection this worker lacks, or its table does not exist.
    """
    from s3batch.sinks.earlier import mark_output

    mark_output(output, job_id)  # its parts and rejects say which job wrote them
    if spec is None or isinstance(spec, S3Sink):
        if spec is not None and spec.format == "parquet":
            from s3batch.sinks.parquet import ParquetOutput

            return ParquetOutput.of(output)
        return output
    from s3batch.sinks.postgres import PostgresOutput
    from s3batch.sinks.postgres_pools import pools_or_default

    return PostgresOutput(
        spec, output, pools_or_default(pools), job_id=job_id, bucket=bucket, where=where, rejected_of=rejected_of
    )

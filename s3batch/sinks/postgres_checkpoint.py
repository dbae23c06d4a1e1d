"""A file's checkpoint row in the database (``{schema}.s3batch_checkpoints``), as the PostgreSQL sink's chunk
transactions use it: lock it and check where it is, advance it (conditionally), and take a chunk's turn.

Every chunk transaction of a file locks its row before it commits (``lock``, or the conditional ``advance``
where the row must hold exactly the checkpoint the chunk starts from): two attempts of one file (a zombie
worker) cannot both commit a chunk, and a chunk commits only where the one before it did. The turn of a chunk
(``take_turn``) orders the transactions of one file written at once on two connections
(``PostgresOutput._commit_alongside``): each takes its own chunk's first, and the next chunk's takes it too
before it advances the checkpoint, so it waits, in the database, for the one before to end.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

from s3batch.checkpoint import Checkpoint
from s3batch.errors import SinkError
from s3batch.sinks.postgres_pools import checkpoint_table, target_of
from s3batch.sinks.spec import PostgresSink


class CheckpointRow:
    """The checkpoint row of one source file written into one table.

    Args:
        spec: The job's sink.
        bucket: The source bucket.
        key: The source key.
        job_id: The job's workflow ID (stored with the checkpoint, for people).
        is_ours: Whether a checkpoint is this source version's, with these options.
        where: ``s3://bucket/key`` of the source (error messages).
    """

    def __init__(
        self, spec: PostgresSink, bucket: str, key: str, job_id: str, is_ours: Callable[[Checkpoint], bool], where: str
    ) -> None:
        self.target = target_of(spec)
        self.job_id = job_id
        self.is_ours = is_ours
        self.where = where
        self._table = checkpoint_table(spec)
        self._key = (self.target, bucket, key)
        self._turns = int.from_bytes(hashlib.sha256("\0".join(self._key).encode()).digest()[:4], "big", signed=True)
        """The file's advisory lock key (``take_turn``; another file with the same key only waits longer)."""

    def take_turn(self, conn: psycopg.Connection[Any], chunk: int) -> None:
        """Hold the lock of the file's ``chunk`` to the end of the transaction (a transaction-level advisory
        lock), first waiting for a transaction that holds it (the database breaks a deadlock, by rolling back
        one of the transactions in it with ``DeadlockDetected``)."""
        conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", (self._turns, chunk))

    def lock(self, conn: psycopg.Connection[Any], cp: Checkpoint) -> Checkpoint | None:
        """Lock the file's checkpoint row and return the checkpoint it holds; fail (``SinkError``) unless it
        is at ``cp`` (another attempt committed past it: this one must not write the chunk again)."""
        select = sql.SQL(
            "SELECT checkpoint FROM {} WHERE target = %s AND source_bucket = %s AND source_key = %s FOR UPDATE"
        ).format(self._table)
        row = conn.execute(select, self._key).fetchone()
        if row is None:  # the file's first chunk (of any version): its row is created, then locked
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} (target, source_bucket, source_key, job_id, etag, fingerprint, chunk, next_record, "
                    "done, checkpoint) VALUES (%s, %s, %s, %s, '', '', 0, 0, false, 'null') ON CONFLICT DO NOTHING"
                ).format(self._table),
                (*self._key, self.job_id),
            )
            row = conn.execute(select, self._key).fetchone()
        stored = Checkpoint.model_validate(row[0]) if row is not None and row[0] is not None else None
        ours = stored is not None and self.is_ours(stored)
        expected = (not ours) if cp.chunk == 0 else (ours and stored is not None and stored.chunk == cp.chunk)
        if not expected:
            at = f"chunk {stored.chunk}" if stored is not None and ours else "another version or options"
            raise SinkError(
                f"{self.where}: the checkpoint of this file in {self.target} is at {at}, not at chunk {cp.chunk} "
                "where this attempt is: another attempt committed it (a worker presumed dead); this one stops "
                "without writing, and the file resumes from the database's checkpoint"
            )
        return stored

    def advance(self, conn: psycopg.Connection[Any], new: Checkpoint, at: Checkpoint | None = None) -> bool:
        """Set the file's checkpoint to ``new`` (with ``at``: only where it is exactly ``at``); whether it was."""
        condition = " AND chunk = %s AND checkpoint = %s::jsonb" if at is not None else ""
        done = conn.execute(
            sql.SQL(
                "UPDATE {} SET job_id = %s, etag = %s, version_id = %s, fingerprint = %s, chunk = %s, "
                "next_record = %s, byte_offset = %s, done = %s, checkpoint = %s, updated_at = now() "
                "WHERE target = %s AND source_bucket = %s AND source_key = %s" + condition
            ).format(self._table),
            (
                self.job_id,
                new.etag,
                new.version_id,
                new.fingerprint,
                new.chunk,
                new.next_record,
                new.byte_offset,
                new.done,
                new.model_dump_json(),
                *self._key,
                *((at.chunk, at.model_dump_json()) if at is not None else ()),
            ),
        )
        return done.rowcount == 1

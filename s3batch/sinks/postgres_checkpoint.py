"""A file's checkpoint row in the database (``{schema}.s3batch_checkpoints``), as the PostgreSQL sink's chunk
transactions use it: lock it and check where it is, advance it (conditionally), and take a chunk's turn.

Every chunk transaction of a file locks its row before it commits (``lock``, or the conditional ``advance``
where the row must hold exactly the checkpoint the chunk starts from): two attempts of one file (a zombie
worker) cannot both commit a chunk, and a chunk commits only where the one before it did. The turn of a chunk
(``take_turn``) orders the transactions of one file written at once on two connections
(``PostgresOutput._commit_alongside``): each takes its own chunk's first, and the next chunk's takes it too
before it advances the checkpoint, so it waits, in the database, for the one before to end.

A file's first chunk, where the row holds the checkpoint of another import of the file (another version, or
options that write other rows), is where a re-import is decided (``check_reimport``): refused (``SinkInvalid``,
nothing written) where its rows would be written a second time; with ``on_reimport: replace`` the file's
earlier rows (found by the identity ``source_column`` holds, of any version of the file) are deleted in that
chunk's transaction, so they are gone exactly when the new import's first rows are in.

A redrive of rejected records (``rejected_of``) has a row of its own per file (its ``target`` names the report
redriven: ``target_of``), so the import's row stays as it is; it never deletes a file's earlier rows (they are the
rows accepted before, which it adds to): ``on_reimport: replace`` refuses there instead.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool, PoolTimeout

from s3batch.checkpoint import Checkpoint
from s3batch.errors import SinkError, SinkInvalid
from s3batch.sinks.postgres_access import CHECKPOINT_TABLE, checkpoint_table
from s3batch.sinks.postgres_pools import target_of
from s3batch.sinks.postgres_session import RETRIED, database_error, waited
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
        rejected_of: The job's ``rejected_of`` (a redrive of rejected records: a row of its own, see the module).
    """

    def __init__(
        self,
        spec: PostgresSink,
        bucket: str,
        key: str,
        job_id: str,
        is_ours: Callable[[Checkpoint], bool],
        where: str,
        rejected_of: str | None = None,
    ) -> None:
        self.target = target_of(spec)
        self.redrive = rejected_of is not None
        self.spec = spec
        self.job_id = job_id
        self.is_ours = is_ours
        self.where = where
        self.identity_prefix = f"s3://{bucket}/{key}#"
        """What the identity of every version of the file starts with (``identity``)."""
        self._table = checkpoint_table(spec)
        self._key = (target_of(spec, rejected_of), bucket, key)
        self._turns = int.from_bytes(hashlib.sha256("\0".join(self._key).encode()).digest()[:4], "big", signed=True)
        """The file's advisory lock key (``take_turn``; another file with the same key only waits longer)."""

    @property
    def key(self) -> tuple[str, str, str]:
        """The row's primary key: ``(target, source_bucket, source_key)``."""
        return self._key

    def identity(self, etag: str) -> str:
        """The identity of the file's version ``etag`` as rows carry it in ``source_column``:
        ``s3://bucket/key#etag`` (an ETag holds no ``#``: the identities of the file's versions are the values that
        start with ``identity_prefix`` and have no ``#`` after it)."""
        return self.identity_prefix + etag

    def read(self, pool: ConnectionPool[Any]) -> tuple[Checkpoint | None, str]:
        """The file's checkpoint as the database holds it (None: none committed), and the job that wrote it.

        Raises:
            SinkError: The database cannot be reached.
        """
        select = sql.SQL(
            "SELECT checkpoint, job_id FROM {} WHERE target = %s AND source_bucket = %s AND source_key = %s"
        ).format(self._table)
        try:
            with pool.connection() as conn:
                row = conn.execute(select, self._key).fetchone()
        except psycopg.errors.UndefinedTable:
            return None, ""  # no file of this schema was ever opened: nothing committed
        except (psycopg.Error, PoolTimeout) as err:
            raise database_error(err, "reading the checkpoint of", self.spec, "retried (nothing was written)") from None
        if row is None or row[0] is None:
            return None, ""
        return Checkpoint.model_validate(row[0]), str(row[1])

    def resume_point(self, pool: ConnectionPool[Any], start: Checkpoint, rows_fingerprint: str | None) -> Checkpoint:
        """The file's checkpoint in the database when it is this file's (``is_ours``: this version, options that
        write the same rows, whatever ``chunk_records``: a record and byte position), else ``start`` with what the
        file's checkpoints say of its rows (``rows_fingerprint``, ``source_column``). Over another import of the file
        it may be refused at once (:meth:`check_reimport`); its first chunk's transaction decides again (:meth:`lock`).

        Raises:
            SinkInvalid: The table holds rows of another import of the file that this one would write again.
            SinkError: The database cannot be reached.
        """
        stored, job = self.read(pool)
        if stored is not None and self.is_ours(stored):
            return stored
        if stored is not None:
            self.check_reimport(stored, job, start.etag)
        return start.model_copy(update={"rows_fingerprint": rows_fingerprint, "source_column": self.spec.source_column})

    def mark(self, values: list[Any], etag: str) -> None:
        """Give each row (a JSON object) the identity of version ``etag`` of the file in ``source_column``, if any."""
        column = self.spec.source_column
        if column is not None:
            identity = self.identity(etag)
            for value in values:
                if isinstance(value, dict):
                    value[column] = identity

    def unmarked(self, value: Any) -> Any:
        """A row as the handler gave it (:meth:`mark` undone): a reject shows it so."""
        column = self.spec.source_column
        return {k: v for k, v in value.items() if k != column} if column and isinstance(value, dict) else value

    def check_reimport(self, stored: Checkpoint, job: str, etag: str) -> None:
        """Whether version ``etag`` of the file may be imported where the table holds ``stored``, the checkpoint of
        another import of it (another version, or options that write other rows) by ``job``: with ``upsert`` (it
        writes over them by key), where ``stored`` wrote no row, or to replace rows marked in ``source_column``.

        Raises:
            SinkInvalid: Refused (its rows would be in the table twice): which table, job and version, what to do.
        """
        policy = self.spec.reimport
        if policy == "upsert" or not stored.records_written:
            return
        if policy == "replace" and stored.source_column == self.spec.source_column and not self.redrive:
            return
        raise SinkInvalid(self._refusal(stored, job, etag))

    def _refusal(self, stored: Checkpoint, job: str, etag: str) -> str:
        """Why a re-import is refused (:meth:`check_reimport`): what the table holds of the file, from which job and
        version, and what to do."""
        if self.redrive:
            return (
                f"{self.where}: its rejected records were not redriven into table {self.target}: a redrive of the same "
                f"job's rejected records, job {job or '(unknown)'}, wrote {stored.records_written} rows of them with "
                "other options (or other rejected lines, or another version of the file), and they would be written a "
                'second time. Nothing was written. Redrive them with that job\'s options, or with "mode": "upsert" and '
                'a "key" to write over them by key.'
            )
        held = f"{stored.records_written} rows of it"
        if not stored.done:
            held += f" (an import stopped at record {stored.next_record})"
        if stored.etag == etag:
            earlier = (
                f"this version (ETag {etag}) with other options (handler, reading options, max_record_bytes, mode, "
                "key or source_column)"
            )
        else:
            earlier = f"version ETag {stored.etag} (this is ETag {etag})"
        why = "its rows would be written a second time" if self.spec.mode == "insert" else 'on_reimport is "refuse"'
        upsert = 'use "mode": "upsert" with a "key" to write over them by key'
        marked = stored.source_column
        if marked is not None:
            ways = f'To import it, set "on_reimport": "replace" with "source_column": "{marked}" (where its rows carry '
            ways += f"their file) to replace them, or {upsert}."
        else:
            quoted = ", ".join("'" + value.replace("'", "''") + "'" for value in self._key)
            forget = (
                f"DELETE FROM {self.spec.schema_name}.{CHECKPOINT_TABLE} "
                f"WHERE (target, source_bucket, source_key) = ({quoted})"
            )
            ways = (
                'Its rows are not marked with their file (that import had no "source_column"), so "on_reimport": '
                f'"replace" cannot find them: to import it, delete them and the file\'s checkpoint row ({forget}), '
                'then import it with "on_reimport": "replace" and a "source_column" (a text column: later imports '
                f"then replace its rows); or {upsert}."
            )
        if stored.etag == etag and stored.done:
            ways += f" With the options of job {job or '(unknown)'} it is done (nothing to write)."
        return (
            f"{self.where} was not imported into table {self.target}: the table holds {held}, imported by job "
            f"{job or '(unknown)'} from {earlier}, and {why}. Nothing was written. {ways}"
        )

    def take_turn(self, conn: psycopg.Connection[Any], chunk: int) -> None:
        """Hold the lock of the file's ``chunk`` to the end of the transaction (a transaction-level advisory
        lock), first waiting for a transaction that holds it (the database breaks a deadlock, by rolling back
        one of the transactions in it with ``DeadlockDetected``)."""
        conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", (self._turns, chunk))

    def lock(self, conn: psycopg.Connection[Any], cp: Checkpoint) -> Checkpoint | None:
        """Lock the file's checkpoint row and return the checkpoint it holds; fail (``SinkError``) unless it
        is at ``cp`` (another attempt committed past it: this one must not write the chunk again). At the file's
        first chunk, over another import of the file: refused (``SinkInvalid``, :meth:`check_reimport`); with
        ``on_reimport: replace``, the file's earlier rows deleted (:meth:`_delete_earlier`), in this transaction."""
        select = sql.SQL(
            "SELECT checkpoint, job_id FROM {} WHERE target = %s AND source_bucket = %s AND source_key = %s FOR UPDATE"
        ).format(self._table)
        with self._waiting():
            row = conn.execute(select, self._key).fetchone()
            if row is None:  # the file's first chunk (of any version): its row is created, then locked
                conn.execute(
                    sql.SQL(
                        "INSERT INTO {} (target, source_bucket, source_key, job_id, etag, fingerprint, chunk, "
                        "next_record, done, checkpoint) VALUES (%s, %s, %s, %s, '', '', 0, 0, false, 'null') "
                        "ON CONFLICT DO NOTHING"
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
        if cp.chunk == 0:
            if stored is not None and row is not None:
                self.check_reimport(stored, str(row[1]), cp.etag)
            if self.spec.reimport == "replace" and not self.redrive:
                self._delete_earlier(conn)
        return stored

    def _delete_earlier(self, conn: psycopg.Connection[Any]) -> None:
        """Delete the rows of the table whose ``source_column`` holds the identity of a version of this file
        (:meth:`identity`): exactly those, never another key's (the key's ``%`` and ``_`` are escaped; a key that
        starts with this one and ``#`` is another file's, its identity has a ``#`` after the prefix)."""
        column = sql.Identifier(self.spec.source_column or "")
        table = sql.SQL("{}.{}").format(sql.Identifier(self.spec.schema_name), sql.Identifier(self.spec.table_name))
        prefix = self.identity_prefix
        pattern = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        conn.execute(
            sql.SQL(
                "DELETE FROM {table} WHERE {column} LIKE %s ESCAPE '\\' "
                "AND strpos(substr({column}, char_length(%s) + 1), '#') = 0"
            ).format(table=table, column=column),
            (pattern, prefix),
        )

    def advance(self, conn: psycopg.Connection[Any], new: Checkpoint, at: Checkpoint | None = None) -> bool:
        """Set the file's checkpoint to ``new`` (with ``at``: only where it is exactly ``at``); whether it was."""
        condition = " AND chunk = %s AND checkpoint = %s::jsonb" if at is not None else ""
        update = sql.SQL(
            "UPDATE {} SET job_id = %s, etag = %s, version_id = %s, fingerprint = %s, chunk = %s, "
            "next_record = %s, byte_offset = %s, done = %s, checkpoint = %s, updated_at = now() "
            "WHERE target = %s AND source_bucket = %s AND source_key = %s" + condition
        ).format(self._table)
        values = (
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
        )
        with self._waiting():
            return conn.execute(update, values).rowcount == 1

    @contextmanager
    def _waiting(self) -> Iterator[None]:
        """The statements that lock the row: a wait the session's timeouts ended says it was this row's lock (another
        session holds it, or the checkpoint table: ``waited``), a retryable ``SinkError``."""
        try:
            yield
        except (psycopg.errors.LockNotAvailable, psycopg.errors.QueryCanceled) as err:
            lock = f"the checkpoint row of {self.where} in {self.spec.schema_name}.{CHECKPOINT_TABLE} (or that table)"
            told = waited(err, self.spec, lock, f"locking the checkpoint row of {self.where}", RETRIED)
            assert told is not None
            raise told from None

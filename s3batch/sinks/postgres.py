"""The PostgreSQL sink: a file's rows into an existing table, each chunk committed together with the
file's checkpoint in one transaction.

The database is the checkpoint's source of truth for this sink: the row of the file in
``{schema}.s3batch_checkpoints`` (next to the target table) advances in the same transaction as the
chunk's rows, so a worker killed at any point leaves each chunk either wholly committed with its
checkpoint or not at all, and the next attempt resumes from the checkpoint it reads back. The
transaction first locks the file's checkpoint row and checks that it is where this attempt expects
it: a second attempt of the same file (a zombie worker) that committed first makes the other's
chunk fail with ``SinkError`` and roll back.

Rows are written with ``COPY`` (``insert``), or ``COPY`` into a temporary table and ``INSERT ... ON
CONFLICT (key) DO UPDATE`` (``upsert``). Values are the handler's JSON output, mapped to columns by
name and converted by the database. A row the database refuses (a bad date, a NULL in a NOT NULL
column, a duplicate key in ``insert`` mode) becomes a reject with the database's reason and the
source line: the chunk's write is retried in halves, each in a savepoint, down to the rows refused,
so the good rows keep ``COPY``'s speed. Rejects go to the S3 rejects files, as with the other sinks.
In insert mode a chunk is first written at once, every ``COPY`` straight in the transaction; only
when the database refuses a row is it rolled back and written again that way.

For a big file, a chunk's transaction runs while the chunk loop reads on (``WriteBehind``, at most
``WRITES_IN_FLIGHT`` in flight, committed in order): the database parses and indexes one chunk while
the worker parses the next. Its checkpoint is heartbeated only once the transaction committed; each
chunk's transaction starts from the checkpoint the database holds (:func:`carried_over`), so a kill at
any point still leaves each chunk committed once, with its checkpoint, or not at all (the chunks in
flight are read again), and memory holds at most ``WRITES_IN_FLIGHT`` + 1 chunks. In insert mode two
chunks are written at once, on two connections (two backends parse their rows): the later one's rows
first, then it waits in the database for the earlier one to end and advances the checkpoint only from
where that one left it (``_commit_alongside``, :mod:`s3batch.sinks.postgres_checkpoint`); where it cannot
(the earlier one refused rows or failed, or the database broke a deadlock over a key in both), it rolls
back and is written again after the earlier one, as if alone.

The job names a connection; its DSN comes from the worker's environment (``Settings.postgres_dsn``)
and never enters the job's history or heartbeats. One pool per connection name per worker
(:class:`PostgresPools`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import PoolTimeout

from s3batch import layout
from s3batch.checkpoint import Checkpoint
from s3batch.errors import SinkError, SinkInvalid
from s3batch.file_output import FileOutput
from s3batch.jsonvalues import encode_json
from s3batch.rejects import merge, reason_key
from s3batch.sinks import After
from s3batch.sinks.postgres_checkpoint import CheckpointRow
from s3batch.sinks.postgres_pools import (
    REFUSED,
    ROLLED_BACK,
    PostgresPools,
    bisect_refused,
    carried_over,
    copy_into,
    target_of,
)
from s3batch.sinks.postgres_session import UNUSABLE, database_error
from s3batch.sinks.postgres_upsert import upsert
from s3batch.sinks.rows import CsvRows, csv_head, decoded, field_names, runs, tuples
from s3batch.sinks.spec import PostgresSink

WRITES_IN_FLIGHT = 2
"""Chunks of a big file whose transactions may be in flight at once (with one, the database waited, at every
chunk, for the chunk loop to hand over the next one); in insert mode on two connections at once, so the
database parses two chunks' rows in two backends (``_commit_alongside``)."""

ROLLBACK_ATTEMPTS = 3
"""Times a chunk's transaction is tried when the database rolls it back to break a deadlock (or a
serialization failure): a key in two chunks written at once (``_commit_alongside``)."""


class _NotAfter(Exception):
    """Raised in a chunk's transaction written alongside the one before: the checkpoint is not where it ends."""


class PostgresOutput:
    """The PostgreSQL sink of one file (see the module docstring): the :class:`~s3batch.sinks.Sink` interface.

    Args:
        spec: The job's sink.
        output: The file's S3 output folder: its rejects files, its fingerprint.
        pools: The worker's pools.
        job_id: The job's workflow ID (stored with the checkpoint, for people).
        bucket: The source bucket.
        where: ``s3://bucket/key`` of the source.
        rejected_of: The job's ``rejected_of`` (a redrive of rejected records: a checkpoint row of its own).
    """

    def __init__(
        self, spec: PostgresSink, output: FileOutput, pools: PostgresPools, *, job_id: str, bucket: str, where: str,
        rejected_of: str | None = None,
    ) -> None:
        self.spec = spec
        self.output = output
        self.dir = output.dir
        self.fingerprint = output.fingerprint
        self.job_id = job_id
        self.bucket = bucket
        self.where = where
        self.target = target_of(spec)
        self.pool = pools.for_table(spec)
        self._pools = pools
        self.columns = pools.columns(spec)
        self._table = sql.SQL("{}.{}").format(sql.Identifier(spec.schema_name), sql.Identifier(spec.table_name))
        self.row = CheckpointRow(spec, bucket, output.key, job_id, output.is_ours, where, rejected_of)

    @property
    def writes_behind(self) -> int:
        """How many chunks' transactions may be in flight while the chunk loop reads on (``WriteBehind``): two,
        so the database goes from one chunk's ``COPY`` straight on to the next, one after the other on one
        connection. A checkpoint is heartbeated only once its transaction committed, and each transaction
        starts from the checkpoint the database holds (:func:`carried_over`)."""
        return WRITES_IN_FLIGHT

    @property
    def writes_at_once(self) -> int:
        """Chunks in flight written at once, each on a connection: all in insert mode (``_commit_alongside``)."""
        return WRITES_IN_FLIGHT if self.spec.mode == "insert" else 1

    @property
    def takes_csv(self) -> bool:
        """Whether the chunk loop may give rows as the file's own CSV (``commit(csv=...)``): in insert mode
        (upsert keeps the last row of a key, so its rows keep their order through one path), unless each row
        is given its file's identity (``source_column``: the file's CSV rows lack it)."""
        return self.spec.mode == "insert" and self.spec.source_column is None

    def is_ours(self, cp: Checkpoint) -> bool:
        return self.output.is_ours(cp)

    # ---------------------------------------------------------------- resume

    def resume_point(self, heartbeat: Checkpoint | None, start: Checkpoint, *, fresh: bool) -> Checkpoint:
        """The file's checkpoint in the database when it is this version's with options that write the same rows,
        else ``start``; refused over another import of the file (:meth:`CheckpointRow.resume_point`). The
        heartbeat is never ahead of it: it is sent after the commit."""
        return self.row.resume_point(self.pool, start, self.output.rows_fingerprint)

    # ---------------------------------------------------------------- commit

    def commit(
        self,
        cp: Checkpoint,
        new: Checkpoint,
        output: list[bytes],
        rejects: list[tuple[int, bytes]],
        lines: Sequence[int] = (),
        csv: CsvRows | None = None,
        after: After | None = None,
    ) -> Checkpoint:
        """One transaction: lock the checkpoint row (and check it is at ``cp``), write the rows, write
        the S3 rejects file (with the rows the database refused), advance the checkpoint to ``new``.

        ``csv``: more rows of the chunk as the file's own canonical CSV (the fast path of ``passthrough``
        in ``insert`` mode), given to the database's CSV ``COPY`` as they are; where it refuses a row they
        are read back into values and written as the others, so the refused rows are found alike. ``after``:
        the chunk before may still be committing (:meth:`_commit_alongside`); waits for it, tells if it did."""
        values = decoded(output)
        self.row.mark(values, self.output.etag)
        named = [*values, dict.fromkeys(csv.names)] if csv is not None and len(csv) else values
        columns = self._columns_of(named)
        try:
            if after is not None and self.spec.mode == "insert":
                done = self._commit_alongside(cp, new, columns, values, csv, rejects)
                if done is not None:
                    return done
                if not after():
                    raise SinkError(f"{self.where}: chunk {cp.chunk} not written: the chunk before was not committed")
            given = list(rejects)
            for attempt in range(1, ROLLBACK_ATTEMPTS + 1):
                rejects[:] = given
                try:
                    if self.spec.mode == "insert":
                        done = self._commit_at_once(cp, new, columns, values, csv, rejects)
                        if done is not None:
                            return done
                    return self._commit_row_by_row(cp, new, columns, list(values), list(lines), csv, rejects)
                except ROLLED_BACK:
                    if attempt == ROLLBACK_ATTEMPTS:
                        raise
            raise AssertionError("unreachable")
        except (psycopg.Error, PoolTimeout) as err:
            if isinstance(err, UNUSABLE):
                self._pools.columns(self.spec, fresh=True)  # says which privilege to grant or table to create
            raise database_error(err, "writing", self.spec) from None

    def _commit_alongside(
        self,
        cp: Checkpoint,
        new: Checkpoint,
        columns: list[str],
        values: list[Any],
        csv: CsvRows | None,
        rejects: list[tuple[int, bytes]],
    ) -> Checkpoint | None:
        """The chunk's transaction while the one before may still run, on another connection: the rows first
        (both ``COPY``s at once, in two backends), then, once the one before has ended (the database waits:
        :meth:`CheckpointRow.take_turn`), the checkpoint advanced where it is exactly ``cp``, so the two commit in
        order. None when this one rolled back instead: the checkpoint was not at ``cp`` (the chunk before refused
        rows or failed), a row was refused, the database broke a deadlock with it (a key in both chunks), or the
        session's ``lock_timeout`` ended its wait for the one before (a slow chunk); the caller then writes the chunk
        again, once the one before is done."""
        head = csv_head(values, csv)
        try:
            with self.pool.connection() as conn, conn.transaction():
                self.row.take_turn(conn, cp.chunk)
                self._copy_chunk(conn, columns, values, csv, head)
                self.row.take_turn(conn, cp.chunk - 1)
                if not self.row.advance(conn, new, at=cp):
                    raise _NotAfter
                self.output.write_rejects(cp.chunk, new, rejects)
        except (_NotAfter, psycopg.errors.LockNotAvailable, *ROLLED_BACK, *REFUSED):
            return None
        return new

    def _commit_at_once(
        self,
        cp: Checkpoint,
        new: Checkpoint,
        columns: list[str],
        values: list[Any],
        csv: CsvRows | None,
        rejects: list[tuple[int, bytes]],
    ) -> Checkpoint | None:
        """The chunk's transaction when the database takes every row (the common case, in insert mode): each
        ``COPY`` straight in the transaction, no savepoints. None when it refused a row: the transaction rolled
        back, nothing of the chunk is written, and :meth:`_commit_row_by_row` finds the rows refused."""
        head = csv_head(values, csv)
        try:
            with self.pool.connection() as conn, conn.transaction():
                self.row.take_turn(conn, cp.chunk)
                # The checkpoint advanced first where the database holds exactly ``cp`` (one statement locks,
                # checks and advances it); else locked, checked and carried over, then advanced.
                advanced = cp.chunk > 0 and self.row.advance(conn, new, at=cp)
                if not advanced:
                    new = carried_over(cp, new, self.row.lock(conn, cp))
                self._copy_chunk(conn, columns, values, csv, head)
                self.output.write_rejects(cp.chunk, new, rejects)
                if not advanced:
                    self.row.advance(conn, new)
        except REFUSED:
            return None
        return new

    def _commit_row_by_row(
        self,
        cp: Checkpoint,
        new: Checkpoint,
        columns: list[str],
        values: list[Any],
        lines: list[int],
        csv: CsvRows | None,
        rejects: list[tuple[int, bytes]],
    ) -> Checkpoint:
        """The chunk's transaction where rows may be refused: the writes in savepoints, halved down to the rows
        refused (``bisect_refused``), which become rejects."""
        with self.pool.connection() as conn, conn.transaction():
            self.row.take_turn(conn, cp.chunk)
            new = carried_over(cp, new, self.row.lock(conn, cp))
            refused = self._write(conn, columns, values)
            if csv is not None and len(csv) and not self._copy_csv_refused(conn, csv):
                more = csv.values()
                base = len(values)
                refused += [(base + i, err) for i, err in self._write(conn, columns, more)]
                values += more
                lines += csv.lines
            if refused:
                new = self._with_refused(new, refused, values, lines, rejects)
            self.output.write_rejects(cp.chunk, new, rejects)
            self.row.advance(conn, new)
        return new

    def _copy_chunk(
        self, conn: psycopg.Connection[Any], columns: list[str], values: list[Any], csv: CsvRows | None,
        head: bytes | None,
    ) -> None:
        """The chunk's rows at once: one CSV ``COPY`` after ``head`` (:func:`csv_head`), or the JSON rows' ``COPY``s
        (one a run of rows naming the same fields: :func:`~s3batch.sinks.rows.runs`)."""
        if values and head is None:
            for names, lo, hi in runs(values, columns):
                copy_into(conn, self._table, names, tuples(values[lo:hi], names))
        if csv is not None and len(csv):
            self._copy_csv(conn, csv, head or b"")

    def _copy_csv(self, conn: psycopg.Connection[Any], csv: CsvRows, head: bytes = b"") -> None:
        """``COPY`` the CSV rows (after ``head``, more rows in the same CSV) at once; raises what the database
        raises for a row it refuses. An unquoted empty field is NULL (``COPY``'s own convention, as the JSON path
        writes it: ``empty_as``), or '' with ``FORCE_NOT_NULL`` (``empty_as: string``)."""
        names = sql.SQL(", ").join(map(sql.Identifier, csv.names))
        force = sql.SQL("") if csv.nulls else sql.SQL(", FORCE_NOT_NULL ({})").format(names)
        statement = sql.SQL("COPY {} ({}) FROM STDIN WITH (FORMAT csv, DELIMITER {}, QUOTE {}{})").format(
            self._table, names, sql.Literal(csv.delimiter), sql.Literal(csv.quote), force
        )
        with conn.cursor() as cur, cur.copy(statement) as copy:
            if head:
                copy.write(head)
            for piece in csv.blocks():
                copy.write(piece)

    def _copy_csv_refused(self, conn: psycopg.Connection[Any], csv: CsvRows) -> bool:
        """:meth:`_copy_csv` in a savepoint; False when the database refused one of the rows."""
        try:
            with conn.transaction():
                self._copy_csv(conn, csv)
        except REFUSED:
            return False
        return True

    def _columns_of(self, values: list[Any]) -> list[str]:
        """The columns the chunk's outputs name, and the upsert key (in the table's order); each must exist, and
        none be a column the table always generates (checked before any row of the chunk is written). An output
        without the key is a reject (:class:`~s3batch.sinks.postgres_upsert.NullKey`), as any NULL key.

        Raises:
            SinkInvalid: An output names a column the table lacks or always generates.
        """
        named = field_names(values, self.where, f"a PostgreSQL sink (table {self.target})")
        missing = [name for name in named if name not in self.columns]
        if missing:
            self.columns = self._pools.columns(self.spec, fresh=True)  # added since it was looked up?
            missing = [name for name in named if name not in self.columns]
        if missing:
            shown = ", ".join(repr(m[:63]) for m in missing[:20])
            raise SinkInvalid(
                f"table {self.target} has no column for the fields {shown} of the handler's output for "
                f"{self.where}: add the columns, or a handler that outputs only the table's columns "
                f"({', '.join(self.columns)})"
            )
        generated = self._pools.generated(self.spec)
        always = [name for name in named if name in generated]
        if always:
            shown = ", ".join(f"{name!r} ({generated[name]})" for name in always)
            raise SinkInvalid(
                f"the handler's output for {self.where} names columns of table {self.target} that the table always "
                f"fills itself: {shown}; leave those fields out of the handler's output (a handler that drops "
                "them), or make an identity column GENERATED BY DEFAULT to write its values"
            )
        return [c for c in self.columns if c in named or c in (self.spec.key or ())]

    def _write(self, conn: psycopg.Connection[Any], columns: list[str], values: list[Any]) -> list[tuple[int, Any]]:
        """Write the outputs ``values``, each run naming the same fields in its own columns (a field an output lacks
        is the table's to fill: :func:`~s3batch.sinks.rows.runs`); return the ones refused, as ``(index, error)``."""
        refused: list[tuple[int, Exception]] = []
        for names, lo, hi in runs(values, columns, self.spec.key or ()):
            refused += [(lo + i, err) for i, err in self._write_run(conn, names, tuples(values[lo:hi], names))]
        return refused

    def _write_run(
        self, conn: psycopg.Connection[Any], columns: list[str], rows: list[tuple[Any, ...]]
    ) -> list[tuple[int, Exception]]:
        """Write ``rows`` (in ``columns``); return the ones the database refused, as ``(index, error)``."""
        if not rows:
            return []
        if self.spec.mode == "insert":
            return bisect_refused(conn, len(rows), lambda lo, hi: copy_into(conn, self._table, columns, rows[lo:hi]))
        return self._upsert(conn, columns, sql.SQL(", ").join(map(sql.Identifier, columns)), rows)

    def _upsert(
        self, conn: psycopg.Connection[Any], columns: list[str], names: sql.Composable, rows: list[tuple[Any, ...]]
    ) -> list[tuple[int, Exception]]:
        """Through a stage table of the written columns (:func:`~s3batch.sinks.postgres_upsert.upsert`): type
        errors found at its ``COPY``, constraint errors at the ``INSERT``; rows with a NULL key refused."""
        return upsert(conn, self._table, self.target, self.spec.key or [], columns, names, rows)

    def _with_refused(
        self,
        new: Checkpoint,
        refused: list[tuple[int, Exception]],
        values: list[Any],
        lines: Sequence[int],
        rejects: list[tuple[int, bytes]],
    ) -> Checkpoint:
        """``new`` with the refused rows moved from written to rejected; their rejects added to ``rejects``."""
        reasons: Counter[str] = Counter()
        for index, err in refused:
            diag = getattr(err, "diag", None)
            state = getattr(diag, "sqlstate", None) or "?"
            said = [getattr(diag, "message_primary", None)]
            if self.spec.reject_details:  # for foreign keys and exclusions, DETAIL quotes other rows of the table
                said.append(getattr(diag, "message_detail", None))
            detail = "; ".join(filter(None, said))
            line = lines[index] if index < len(lines) else new.line
            reason = f"refused by PostgreSQL (table {self.target}, SQLSTATE {state}): {detail or type(err).__name__}"
            summary = f"refused by PostgreSQL: {type(err).__name__} (SQLSTATE {state})"
            reasons[reason_key(summary)] += 1
            record = self.row.unmarked(values[index])
            rejects.append((line, encode_json({"line": line, "reason": reason, "record": record})))
        n = len(refused)
        return new.model_copy(
            update={
                "records_written": new.records_written - n,
                "rejected": new.rejected + n,
                "reject_reasons": merge(new.reject_reasons, reasons),
            }
        )

    # ---------------------------------------------------------------- the file's folder

    def stale(self, cp: Checkpoint, listed: dict[str, str], where: str) -> list[str]:
        """The output objects of the folder that are not this version's rejects files (the rows are in
        the table; parts there are another sink's or version's)."""
        found: list[str] = []
        for name in listed:
            kind = layout.output_kind(name)
            if kind is None:
                continue
            what, chunk = kind
            if what == "rejects" and chunk < cp.chunk and self.output.ours(name, chunk, "rejects", listed[name]):
                continue
            found.append(name)
        return sorted(found)

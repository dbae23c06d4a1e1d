"""The PostgreSQL sink's connections: the worker's pools (one per connection name, its DSN and settings from the
worker's environment), the target table's columns, the checkpoint table created next to it (and reading its rows
back); and the pieces of a chunk's write: ``COPY`` of rows, halving a write down to the rows the database refuses,
and the checkpoint carried over from the one it committed. What a job may touch and the role needs:
:mod:`s3batch.sinks.postgres_access`; the sessions' timeouts and DSN: :mod:`s3batch.sinks.postgres_session`. See
:mod:`s3batch.sinks.postgres` for the sink itself.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool, PoolTimeout

from s3batch.checkpoint import Checkpoint
from s3batch.errors import SinkInvalid
from s3batch.rejects import merge
from s3batch.sinks.postgres_access import check_allowed, check_privileges, checkpoint_table, create_checkpoint_table
from s3batch.sinks.postgres_session import database_error, parse_dsn, session_setup
from s3batch.sinks.spec import PostgresSink

if TYPE_CHECKING:
    from s3batch.config import PostgresConnection, Settings

COLUMNS_TTL = 30.0
"""Seconds a table's columns are reused before they are looked up again (a column added meanwhile is
then seen; a file whose output names a column the cache lacks looks again at once)."""


class PostgresPools:
    """The worker's connection pools, one per connection name (opened on first use).

    Args:
        settings: Where the DSNs and the connections' settings come from (``Settings.postgres_dsn``,
            ``Settings.postgres_connection``).
        max_size: Connections per pool at most (two per activity slot of the worker).
    """

    def __init__(self, settings: Settings, max_size: int = 8) -> None:
        self.settings = settings
        self.max_size = max_size
        self._pools: dict[str, ConnectionPool[Any]] = {}
        self._options: dict[str, PostgresConnection] = {}
        self._lock = threading.Lock()
        self._columns: dict[tuple[str, str], tuple[float, TableColumns]] = {}

    def columns(self, spec: PostgresSink, *, fresh: bool = False) -> list[str]:
        """The target table's columns (:func:`table_columns`), looked up at most every
        :data:`COLUMNS_TTL` seconds per connection and table (a group of small files asks once).

        Raises:
            SinkInvalid: Unknown connection, a table the connection may not write, missing table or key columns,
                privileges the role lacks.
            SinkError: The database cannot be reached.
        """
        return self._table(spec, fresh).names

    def generated(self, spec: PostgresSink) -> dict[str, str]:
        """The target table's columns it always fills itself (``TableColumns.generated``), from the same lookup
        as :meth:`columns` (cached alike).

        Raises:
            SinkInvalid: Unknown connection, missing table or key columns.
            SinkError: The database cannot be reached.
        """
        return self._table(spec, False).generated

    def _table(self, spec: PostgresSink, fresh: bool) -> TableColumns:
        cache_key = (spec.connection, spec.table)
        found = self._columns.get(cache_key)
        if found is not None and not fresh and time.monotonic() - found[0] < COLUMNS_TTL:
            return found[1]
        try:
            with self.for_table(spec).connection() as conn:
                columns = table_columns(conn, spec)
        except (psycopg.Error, PoolTimeout) as err:
            raise database_error(err, "opening", spec, "retried (nothing was written)") from None
        self._columns[cache_key] = (time.monotonic(), columns)
        return columns

    def for_table(self, spec: PostgresSink) -> ConnectionPool[Any]:
        """The pool of the sink's connection, once its table is one the connection may write
        (:func:`~s3batch.sinks.postgres_access.check_allowed`: checked on every call, before any statement).

        Raises:
            SinkInvalid: The table is refused, or the worker has no DSN for the connection.
        """
        check_allowed(spec, self.options(spec.connection))
        return self.pool(spec.connection)

    def options(self, name: str) -> PostgresConnection:
        """The settings of connection ``name`` besides its DSN (``Settings.postgres_connection``), read once.

        Raises:
            SinkInvalid: One is not valid (naming the variable).
        """
        found = self._options.get(name)
        if found is None:
            try:
                found = self._options[name] = self.settings.postgres_connection(name)
            except ValueError as err:
                raise SinkInvalid(
                    f"the settings of PostgreSQL connection {name!r}: {err}; fix the workers' environment"
                ) from None
        return found

    def pool(self, name: str) -> ConnectionPool[Any]:
        """The pool of connection ``name`` (its DSN parsed once; each session's timeouts set:
        :mod:`s3batch.sinks.postgres_session`).

        Raises:
            SinkInvalid: The worker has no DSN for ``name`` (or cannot read its DSN file, or parse it), or a setting of
                the connection is not valid.
        """
        options = self.options(name)
        with self._lock:
            found = self._pools.get(name)
            if found is not None:
                return found
            variable = f"S3BATCH_POSTGRES_{name.upper()}_DSN"
            try:
                dsn = self.settings.postgres_dsn(name)
            except OSError as err:
                raise SinkInvalid(
                    f"the sink's PostgreSQL connection {name!r}: cannot read the file {variable}_FILE names "
                    f"({type(err).__name__}); fix the worker's environment"
                ) from None
            if not dsn:
                raise SinkInvalid(
                    f"the sink names PostgreSQL connection {name!r}, which this worker does not have: set "
                    f"{variable} (or {variable}_FILE, a file holding the DSN) in the workers' environment, "
                    "or name another connection"
                )
            pool: ConnectionPool[Any] = ConnectionPool(
                kwargs=parse_dsn(name, dsn),
                min_size=1,
                max_size=self.max_size,
                open=True,
                name=f"s3batch-{name}",
                timeout=30,
                configure=session_setup(options),
            )
            self._pools[name] = pool
            return pool

    def close(self) -> None:
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.close()


def pools_or_default(pools: PostgresPools | None) -> PostgresPools:
    if pools is None:
        raise SinkInvalid("a PostgreSQL sink needs the worker's pools (S3Activities.pools); none were given")
    return pools


def target_of(spec: PostgresSink, rejected_of: str | None = None) -> str:
    """The ``target`` of the sink's checkpoint rows: ``schema.table``; a redrive of rejected records (``rejected_of``)
    keeps its own apart from the import's: ``schema.table rejected of s3://.../_report.json``."""
    table = f"{spec.schema_name}.{spec.table_name}"
    return table if rejected_of is None else f"{table} rejected of {rejected_of}"


def stored_checkpoints(
    pool: ConnectionPool[Any], spec: PostgresSink, bucket: str, keys: Sequence[str], rejected_of: str | None = None
) -> list[tuple[str, Any]]:
    """The checkpoint rows of the files ``keys`` of ``bucket`` written into the sink's table: ``(source_key,
    checkpoint)`` (the checkpoint as stored, JSON; a row created but never advanced holds None). ``bucket``
    "" (a manifest job's files carry no bucket in the report): the rows of those keys in any bucket.

    Raises:
        SinkError: The database cannot be reached.
    """
    found: list[tuple[str, Any]] = []
    # The keys as one JSON array: the pool's connections dump a list as JSON text (``postgres_session.session_setup``).
    where = "target = %s AND source_key IN (SELECT jsonb_array_elements_text(%s))" + (
        " AND source_bucket = %s" if bucket else ""
    )
    query = sql.SQL("SELECT source_key, checkpoint FROM {} WHERE " + where)
    try:
        with pool.connection() as conn:
            for start in range(0, len(keys), 1_000):
                batch = Jsonb(list(keys[start : start + 1_000]))
                args = (target_of(spec, rejected_of), batch, *([bucket] if bucket else []))
                found += conn.execute(query.format(checkpoint_table(spec)), args).fetchall()
    except psycopg.errors.UndefinedTable:
        return []  # no file of this schema was ever opened: nothing committed
    except (psycopg.Error, PoolTimeout) as err:
        raise database_error(err, "reading the checkpoints of", spec, "retried (nothing was written)") from None
    return found


class TableColumns(NamedTuple):
    """The target table's columns (:func:`table_columns`)."""

    names: list[str]
    """Every column, in the table's order."""
    generated: dict[str, str]
    """The columns the table always fills itself, and how (``GENERATED ALWAYS AS IDENTITY``, ``GENERATED ALWAYS
    AS (...) STORED``): an output naming one is refused (``COPY`` took a value for the first, past its sequence,
    and failed on the second with an error that is no reject; ``INSERT`` fails on both)."""


_GENERATED = {"a": "GENERATED ALWAYS AS IDENTITY", "s": "GENERATED ALWAYS AS (...) STORED"}
"""``pg_attribute``'s ``attidentity`` / ``attgenerated`` codes of the columns a table always fills itself."""


def table_columns(conn: psycopg.Connection[Any], spec: PostgresSink) -> TableColumns:
    """The columns of the target table, in order, and which it always generates; checks the role's privileges
    (:func:`~s3batch.sinks.postgres_access.check_privileges`) and creates the checkpoint table when missing.

    Raises:
        SinkInvalid: The table does not exist, the upsert key names a column it lacks or always generates, or the
            role lacks a privilege the sink needs.
    """
    rows = conn.execute(
        "SELECT a.attname, a.attidentity::text || a.attgenerated::text FROM pg_attribute a "
        "JOIN pg_class c ON c.oid = a.attrelid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
        (spec.schema_name, spec.table_name),
    ).fetchall()
    if not rows:
        raise SinkInvalid(
            f"the sink's table {spec.schema_name}.{spec.table_name} does not exist in the database of connection "
            f"{spec.connection!r}: create it first (s3batch writes rows into an existing table)"
        )
    columns = [r[0] for r in rows]
    generated = {name: _GENERATED[code] for name, code in rows if code in _GENERATED}
    missing = [k for k in spec.key or () if k not in columns]
    if missing:
        raise SinkInvalid(
            f"the sink's upsert key names columns that table {spec.schema_name}.{spec.table_name} lacks: "
            f"{', '.join(missing)} (it has {', '.join(columns)})"
        )
    always = [k for k in spec.key or () if k in generated]
    if always:
        one = len(always) == 1
        raise SinkInvalid(
            f"the sink's upsert key column{'' if one else 's'} {', '.join(map(repr, always))} of table "
            f"{spec.schema_name}.{spec.table_name} {'is' if one else 'are'} GENERATED ALWAYS (the table fills "
            f"{'it' if one else 'them'} itself), and the key must be in every row the handler outputs: use a key "
            "of columns the handler writes (with a unique index on them)"
        )
    if spec.key and not _has_unique_index(conn, spec):
        raise SinkInvalid(
            f"the sink's upsert key ({', '.join(spec.key)}) is not a primary key or unique index of table "
            f"{spec.schema_name}.{spec.table_name}: ON CONFLICT needs one; add it, or use mode 'insert'"
        )
    if not check_privileges(conn, spec):
        create_checkpoint_table(conn, spec)
    return TableColumns(columns, generated)


def _has_unique_index(conn: psycopg.Connection[Any], spec: PostgresSink) -> bool:
    """Whether the table has a primary key or unique index on exactly the upsert key's columns."""
    row = conn.execute(
        "SELECT 1 FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relname = %s AND i.indisunique AND i.indpred IS NULL AND ("
        "SELECT string_agg(a.attname::text, ',' ORDER BY a.attname::text COLLATE \"C\") FROM pg_attribute a "
        "WHERE a.attrelid = c.oid AND a.attnum = ANY(i.indkey)) = %s LIMIT 1",
        (spec.schema_name, spec.table_name, ",".join(sorted(spec.key or []))),
    ).fetchone()
    return row is not None


def check_sink(spec: PostgresSink, pools: PostgresPools) -> None:
    """At the start of a job: the connection is known and reachable, the table is one it may write and exists, the
    role has the privileges the sink needs, ``source_column`` is a text column of the table.

    Raises:
        SinkInvalid: Unknown connection, a table refused, missing table or key columns, privileges the role lacks,
            a ``source_column`` that is no text column.
        SinkError: The database cannot be reached.
    """
    pools.columns(spec)
    if spec.source_column is not None:
        _check_source_column(spec, pools)


_TEXT_TYPES = ("text", "character varying")
"""The types of a ``source_column`` (``format_type``, without a length): it holds ``s3://bucket/key#etag``."""


def _check_source_column(spec: PostgresSink, pools: PostgresPools) -> None:
    """``source_column`` is a text (or varchar) column of the table."""
    try:
        with pools.for_table(spec).connection() as conn:
            row = conn.execute(
                "SELECT format_type(a.atttypid, NULL) FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
                "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s "
                "AND a.attname = %s AND a.attnum > 0 AND NOT a.attisdropped",
                (spec.schema_name, spec.table_name, spec.source_column),
            ).fetchone()
    except (psycopg.Error, PoolTimeout) as err:
        raise database_error(err, "opening", spec, "retried (nothing was written)") from None
    table = f"{spec.schema_name}.{spec.table_name}"
    if row is None:
        raise SinkInvalid(
            f"table {table} has no column {spec.source_column!r} (the sink's source_column, where each row gets "
            "its file): add a text column (ALTER TABLE ... ADD COLUMN ... text), or name one the table has"
        )
    if row[0] not in _TEXT_TYPES:
        raise SinkInvalid(
            f"the sink's source_column {spec.source_column!r} of table {table} is not a text column (it is {row[0]}): "
            "it holds each row's file, s3://bucket/key#etag; name a text or varchar column"
        )


REFUSED = (psycopg.errors.DataError, psycopg.errors.IntegrityError)
"""What the database raises for a row it refuses (SQLSTATE classes 22 and 23): such rows are rejects."""

ROLLED_BACK = (psycopg.errors.TransactionRollback, psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure)
"""What the database raises for a transaction it rolled back (SQLSTATE class 40: to break a deadlock, a
serialization failure): it may be tried again."""


def copy_rows(conn: psycopg.Connection[Any], statement: sql.Composed, rows: Sequence[tuple[Any, ...]]) -> None:
    """``COPY`` ``rows`` (tuples in the statement's columns' order) with one ``write_row`` each."""
    with conn.cursor() as cur, cur.copy(statement) as copy:
        write = copy.write_row
        for row in rows:
            write(row)


def copy_into(
    conn: psycopg.Connection[Any], table: sql.Composable, columns: list[str], rows: Sequence[tuple[Any, ...]]
) -> None:
    """``COPY`` ``rows`` (in ``columns``) into ``table``; with no columns, each an ``INSERT ... DEFAULT VALUES``."""
    if not columns:
        for _ in rows:
            conn.execute(sql.SQL("INSERT INTO {} DEFAULT VALUES").format(table))
        return
    names = sql.SQL(", ").join(map(sql.Identifier, columns))
    copy_rows(conn, sql.SQL("COPY {} ({}) FROM STDIN").format(table, names), rows)


def bisect_refused(
    conn: psycopg.Connection[Any],
    n: int,
    attempt: Callable[[int, int], object],
    skip: set[int] | frozenset[int] = frozenset(),
) -> list[tuple[int, Exception]]:
    """Run ``attempt(lo, hi)`` over ``0..n`` in a savepoint; where the database refuses a row, retry
    the halves, down to the single rows refused (returned as ``(index, error)``). ``skip``: indices
    already refused (a range of only those is not attempted)."""
    refused: list[tuple[int, Exception]] = []
    todo = [(0, n)]
    while todo:
        lo, hi = todo.pop()
        if all(i in skip for i in range(lo, hi)):
            continue
        try:
            with conn.transaction():
                attempt(lo, hi)
        except REFUSED as err:
            if hi - lo == 1:
                refused.append((lo, err))
                continue
            mid = (lo + hi) // 2
            todo.append((mid, hi))
            todo.append((lo, mid))
    return refused


def carried_over(cp: Checkpoint, new: Checkpoint, stored: Checkpoint | None) -> Checkpoint:
    """``new`` (the chunk loop's checkpoint after ``cp``) with what the sink added to ``cp`` when it committed
    it (``stored``, at the same chunk): the rows the database refused, counted as rejects. Written one chunk
    behind (``WriteBehind``), the loop built ``new`` on ``cp`` before that commit ended; written at once it
    had the committed one, and nothing differs. The reasons added since ``cp`` are merged into the stored
    ones (exact unless the file has more distinct reasons than a tally keeps: see ``rejects.merge``)."""
    if stored is None or not cp.chunk or (stored.records_written, stored.rejected, stored.reject_reasons) == (
        cp.records_written,
        cp.rejected,
        cp.reject_reasons,
    ):
        return new
    added = Counter({str(reason): int(n) for reason, n in new.reject_reasons})
    added.subtract({str(reason): int(n) for reason, n in cp.reject_reasons})
    return new.model_copy(
        update={
            "records_written": new.records_written + stored.records_written - cp.records_written,
            "rejected": new.rejected + stored.rejected - cp.rejected,
            "reject_reasons": merge(stored.reject_reasons, +added),
        }
    )

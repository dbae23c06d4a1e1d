"""The PostgreSQL sink's ``upsert`` mode: a chunk's rows ``COPY``'d into a temporary stage table, then
``INSERT ... ON CONFLICT (key) DO UPDATE`` from it, each key's rows in their order, the last row of a key winning
(:func:`upsert`). Every row reaches the table, so a row the database refuses is a reject even where a later row
of its key follows in the chunk: which rows are rejected does not depend on where chunks end.

The stage holds only the written columns, with the table's types (type errors are found at its ``COPY``)
and none of its constraints, defaults or identity: the ``INSERT`` finds the constraint errors (NOT NULL,
CHECK, foreign keys), and the table fills the columns the chunk does not write (identity, ``serial``,
defaults, generated columns). A stage ``LIKE`` the table had its NOT NULL without its defaults, and refused
every row of a table with an identity, ``serial`` or ``DEFAULT now()`` column. See
:mod:`s3batch.sinks.postgres` for the sink itself.
"""

from __future__ import annotations

import functools
import hashlib
from typing import Any, NamedTuple

import psycopg
from psycopg import sql

from s3batch.sinks.postgres_pools import bisect_refused, copy_rows


def upsert(
    conn: psycopg.Connection[Any],
    table: sql.Composable,
    target: str,
    key: list[str],
    columns: list[str],
    names: sql.Composable,
    rows: list[tuple[Any, ...]],
) -> list[tuple[int, Exception]]:
    """Upsert ``rows`` (tuples in ``columns``' order; ``names``: the columns quoted, joined) into ``table``
    (``target``: ``schema.table``) on ``key``; return the rows refused, as ``(index, error)``, in order.

    The stage's ordinal column is named unlike any written column (:func:`_ordinal_name`). A row whose key is
    NULL is never staged but refused (:class:`NullKey`): a NULL never conflicts, so each re-run would insert it
    again. The staged rows go in by generation: the n-th statement writes the n-th row of each key (``ON
    CONFLICT`` cannot touch a row twice in one statement), so each row is checked by the table's constraints and
    a key's rows are applied in order (a ``DISTINCT ON`` of the key's last row left the rows before it unchecked,
    counted as written, refused in a chunk of their own)."""
    stage = sql.Identifier("s3batch_stage_" + hashlib.sha256(target.encode()).hexdigest()[:12])
    ordinal_name = _ordinal_name(columns)
    ordinal = sql.Identifier(ordinal_name)
    conn.execute(
        sql.SQL("CREATE TEMP TABLE {} ON COMMIT DROP AS SELECT {}, NULL::bigint AS {} FROM {} WITH NO DATA").format(
            stage, names, ordinal, table
        )
    )
    copy = sql.SQL("COPY {} ({}, {}) FROM STDIN").format(stage, names, ordinal)
    refused = _null_keys(rows, columns, key)
    nulls = {i for i, _ in refused}
    numbered = [(*row, i) for i, row in enumerate(rows)]

    def stage_rows(lo: int, hi: int) -> None:
        some = numbered[lo:hi]
        copy_rows(conn, copy, [r for r in some if r[-1] not in nulls] if nulls else some)

    refused += bisect_refused(conn, len(rows), stage_rows, skip=nulls)
    keys = sql.SQL(", ").join(map(sql.Identifier, key))
    updates = [c for c in columns if c not in key]
    action = (
        sql.SQL("DO UPDATE SET {}").format(
            sql.SQL(", ").join(sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(c)) for c in updates)
        )
        if updates
        else sql.SQL("DO NOTHING")
    )
    generation = sql.Identifier(_ordinal_name([*columns, ordinal_name]))
    insert = sql.SQL(
        "INSERT INTO {table} ({names}) SELECT {names} FROM (SELECT *, row_number() OVER (PARTITION BY {keys} "
        "ORDER BY {ord}) AS {gen} FROM {stage}) s WHERE {gen} = %s AND {ord} >= %s AND {ord} < %s "
        "ON CONFLICT ({keys}) {action}"
    ).format(table=table, names=names, keys=keys, stage=stage, ord=ordinal, gen=generation, action=action)
    count = sql.SQL("SELECT max(n) FROM (SELECT count(*) AS n FROM {} GROUP BY {}) c").format(stage, keys)
    generations = conn.execute(count).fetchone()
    for n in range(1, int((generations or (None,))[0] or 0) + 1):
        write = functools.partial(_write_generation, conn, insert, n)
        refused += bisect_refused(conn, len(rows), write, skip={i for i, _ in refused})
    conn.execute(sql.SQL("DROP TABLE {}").format(stage))  # the chunk's next run of rows stages other columns
    return sorted(refused, key=lambda r: r[0])


def _write_generation(conn: psycopg.Connection[Any], insert: sql.Composed, n: int, lo: int, hi: int) -> None:
    """Upsert the ``n``-th row of each key among the staged rows ``lo`` to ``hi`` (``insert``: :func:`upsert`'s)."""
    conn.execute(insert, (n, lo, hi))


class _Diag(NamedTuple):
    """The parts of a database error's ``diag`` a reject's reason is made of (``PostgresOutput._with_refused``)."""

    sqlstate: str
    message_primary: str
    message_detail: str | None = None


class NullKey(Exception):
    """A row of an upsert whose key is NULL in ``columns``: a reject, never written. A NULL never conflicts (a
    unique index takes any number of them), so the row would be inserted again by every re-run of its file.
    Its ``diag`` is a database error's (SQLSTATE 23502, not-null violation, as a primary key's NULL), so the
    reject's reason is made as for the rows the database refuses."""

    def __init__(self, columns: list[str]) -> None:
        one = len(columns) == 1
        message = (
            f"the upsert key column{'' if one else 's'} {', '.join(columns)} {'is' if one else 'are'} NULL: NULL "
            "keys cannot be upserted (a NULL never conflicts, so each run would insert the row again); give every "
            "row its key"
        )
        super().__init__(message)
        self.diag = _Diag("23502", message)


def _null_keys(rows: list[tuple[Any, ...]], columns: list[str], key: list[str]) -> list[tuple[int, Exception]]:
    """The rows whose upsert key is NULL in a column or more, as ``(index, NullKey)``."""
    where = [(name, columns.index(name)) for name in key]
    found: list[tuple[int, Exception]] = []
    for i, row in enumerate(rows):
        if any(row[at] is None for _, at in where):
            found.append((i, NullKey([name for name, at in where if row[at] is None])))
    return found


def _ordinal_name(columns: list[str]) -> str:
    """A name for the stage's ordinal column that none of the written ``columns`` has (the stage holds them
    under their own names): ``s3batch_ord``, else ``s3batch_ord1``, ``s3batch_ord2``, ..."""
    taken = set(columns)
    return next(name for name in (f"s3batch_ord{i or ''}" for i in range(len(columns) + 1)) if name not in taken)

"""What a job may make the PostgreSQL sink touch, and what the database role needs for it (docs/explanation/security.md,
"The PostgreSQL sink").

- The connection's table allow-list (``S3BATCH_POSTGRES_<NAME>_TABLES``: globs of ``schema.table``, see
  :class:`~s3batch.config.PostgresConnection`): a job's table outside it is refused (``SinkInvalid``) at the job's
  start check and by every file, before any statement. The system schemas (``pg_catalog``, ``pg_toast``, any
  ``pg_*``, ``information_schema``) and the checkpoint table itself (a job writing there could rewrite other
  files' checkpoints) are refused whatever the list says; the checkpoint table lives in the target's schema, so
  it is never created in a system schema either (:func:`check_allowed`).
- The privileges the job's mode needs (:func:`check_privileges`): a role that lacks one fails the job at its start
  check, and a file at once (``SinkInvalid``, not retried), with the ``GRANT`` statements to run.
- The checkpoint table (:data:`CHECKPOINT_DDL`): created on first use where the role may (CREATE on the schema),
  or created in advance by the operator, so that the role needs no CREATE; it is looked up before it is created.
"""

from __future__ import annotations

import re
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from s3batch.errors import SinkInvalid

if TYPE_CHECKING:
    from s3batch.config import PostgresConnection
    from s3batch.sinks.spec import PostgresSink

CHECKPOINT_TABLE = "s3batch_checkpoints"
"""The table of the files' checkpoints, in the target table's schema (created when missing, if the role may)."""

CHECKPOINT_DDL = """
CREATE TABLE IF NOT EXISTS {table} (
    target text NOT NULL,
    source_bucket text NOT NULL,
    source_key text NOT NULL,
    job_id text NOT NULL,
    etag text NOT NULL,
    version_id text,
    fingerprint text NOT NULL,
    chunk integer NOT NULL,
    next_record bigint NOT NULL,
    byte_offset bigint,
    done boolean NOT NULL,
    checkpoint jsonb NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (target, source_bucket, source_key)
)
"""
"""The checkpoint table (``{table}``: ``schema.s3batch_checkpoints``), as docs/how-to/postgres.md gives it to
operators."""


def checkpoint_table(spec: PostgresSink) -> sql.Composed:
    return sql.SQL("{}.{}").format(sql.Identifier(spec.schema_name), sql.Identifier(CHECKPOINT_TABLE))


def check_allowed(spec: PostgresSink, connection: PostgresConnection) -> None:
    """Refuse the sink's table when it is in a system schema, is the checkpoint table, or is outside the
    connection's ``tables`` globs (``schema.table``, case-sensitive; empty: any).

    Raises:
        SinkInvalid: Refused; the message says why and what to do.
    """
    schema, table = spec.schema_name, spec.table_name
    name = f"{schema}.{table}"
    if schema.lower().startswith("pg_") or schema.lower() == "information_schema":
        raise SinkInvalid(
            f"the sink's table {name} is in the system schema {schema}: s3batch never writes into a system schema "
            "(nor creates its checkpoint table there), whatever the workers' settings say; name a table of a "
            "schema of your own"
        )
    if table == CHECKPOINT_TABLE:
        raise SinkInvalid(
            f"the sink's table {name} is s3batch's checkpoint table: a job cannot write into it (its rows say "
            "where each file's import stands); name another table"
        )
    globs = connection.table_globs()
    if globs and not any(fnmatchcase(name, glob) for glob in globs):
        variable = f"S3BATCH_POSTGRES_{spec.connection.upper()}_TABLES"
        raise SinkInvalid(
            f"the sink's table {name} is not one that jobs may write through PostgreSQL connection "
            f"{spec.connection!r}: it is not matched by {variable} ({', '.join(globs)}). Name a table it allows, "
            "or ask the workers' operator to add it"
        )


def check_privileges(conn: psycopg.Connection[Any], spec: PostgresSink) -> bool:
    """Whether the checkpoint table exists; refuse a role that lacks a privilege the sink's mode needs (the
    table exists: looked up before).

    Raises:
        SinkInvalid: The privileges missing, as the ``GRANT`` statements to run (and the checkpoint table to
            create, where the role may not).
    """
    row = conn.execute(
        "SELECT current_user::text, has_schema_privilege(n.oid, 'USAGE'), has_schema_privilege(n.oid, 'CREATE'), "
        "has_any_column_privilege(t.oid, 'INSERT'), has_any_column_privilege(t.oid, 'SELECT'), "
        "has_any_column_privilege(t.oid, 'UPDATE'), has_table_privilege(t.oid, 'DELETE'), "
        "has_database_privilege(current_database(), 'TEMPORARY'), c.oid IS NOT NULL, "
        "has_table_privilege(c.oid, 'SELECT'), has_table_privilege(c.oid, 'INSERT'), "
        "has_table_privilege(c.oid, 'UPDATE') "
        "FROM pg_namespace n JOIN pg_class t ON t.relnamespace = n.oid AND t.relname = %s "
        "LEFT JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = %s WHERE n.nspname = %s",
        (spec.table_name, CHECKPOINT_TABLE, spec.schema_name),
    ).fetchone()
    if row is None:
        return False  # dropped meanwhile: the next lookup says so
    role, usage, create, insert, select, update, delete, temporary, exists, *on_checkpoints = row
    needed = {"INSERT": insert}
    if spec.mode == "upsert":
        needed |= {"SELECT": select, "UPDATE": update}
    if spec.reimport == "replace":
        needed |= {"SELECT": select, "DELETE": delete}
    who = _name(role)
    schema = _name(spec.schema_name)
    table = f"{schema}.{_name(spec.table_name)}"
    grants = [f"GRANT USAGE ON SCHEMA {schema} TO {who}"] if not usage else []
    lacking = [p for p in ("SELECT", "INSERT", "UPDATE", "DELETE") if p in needed and not needed[p]]
    if lacking:
        grants.append(f"GRANT {', '.join(lacking)} ON TABLE {table} TO {who}")
    if spec.mode == "upsert" and not temporary:
        grants.append(f"GRANT TEMPORARY ON DATABASE {_name(conn.info.dbname)} TO {who}")
    checkpoints = f"{schema}.{CHECKPOINT_TABLE}"
    if exists and not all(on_checkpoints):
        grants.append(f"GRANT SELECT, INSERT, UPDATE ON TABLE {checkpoints} TO {who}")
    if not exists and not create:
        grants.append(
            f"GRANT CREATE ON SCHEMA {schema} TO {who} (or create the checkpoint table {checkpoints} in advance, "
            f"as 'Grants' in docs/how-to/postgres.md shows, and GRANT SELECT, INSERT, UPDATE ON TABLE {checkpoints} "
            f"TO {who})"
        )
    if grants:
        raise SinkInvalid(
            f"the role {who} of PostgreSQL connection {spec.connection!r} lacks privileges the sink needs to write "
            f"table {spec.schema_name}.{spec.table_name} (mode {spec.mode}"
            f"{', on_reimport replace' if spec.reimport == 'replace' else ''}); nothing was written. Run: "
            f"{'; '.join(grants)}"
        )
    return bool(exists)


def create_checkpoint_table(conn: psycopg.Connection[Any], spec: PostgresSink) -> None:
    """Create the checkpoint table in the target's schema (where it is missing and the role may)."""
    try:
        with conn.transaction():
            conn.execute(sql.SQL(CHECKPOINT_DDL).format(table=checkpoint_table(spec)))
    except psycopg.errors.UniqueViolation:
        pass  # created at the same moment by another worker


def _name(identifier: str) -> str:
    """``identifier`` as SQL writes it: as it is when it needs no quotes, else double-quoted."""
    if re.fullmatch(r"[a-z_][a-z0-9_$]*", identifier):
        return identifier
    return '"' + identifier.replace('"', '""') + '"'

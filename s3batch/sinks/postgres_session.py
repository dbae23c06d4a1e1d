"""A PostgreSQL connection's sessions, as the sink's pools open them (:class:`~s3batch.sinks.postgres_pools.
PostgresPools`): the DSN parsed once, its text never in an error or a log; each session's timeouts (a lock held
by another session, a statement or a transaction that never ends, cannot block a file for ever); what a wait
that timed out says.

A DSN libpq cannot parse (a password with an unencoded ``%``) is refused when the pool would be built, saying
which variable and what to encode, never quoting it: libpq's own message quotes the token it failed on, and the
pool's background thread logged it on every reconnect. The secrets of the DSNs a worker uses (passwords, the DSN
texts) are also taken out of every record of the ``psycopg`` loggers (:class:`RedactSecrets`).
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.adapt import Dumper
from psycopg.conninfo import conninfo_to_dict

from s3batch.errors import SinkError, SinkInvalid
from s3batch.jsonvalues import encode_json

if TYPE_CHECKING:
    from collections.abc import Callable

    from s3batch.config import PostgresConnection
    from s3batch.sinks.spec import PostgresSink


def parse_dsn(name: str, dsn: str) -> dict[str, Any]:
    """The connection parameters of ``dsn`` (the DSN of connection ``name``), parsed once; its secrets are
    redacted from the ``psycopg`` loggers from now on.

    Raises:
        SinkInvalid: libpq cannot parse it; the message names the variable, never the DSN's text.
    """
    REDACT.add(dsn)
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.Error:
        variable = f"S3BATCH_POSTGRES_{name.upper()}_DSN"
        raise SinkInvalid(
            f"the DSN of PostgreSQL connection {name!r} ({variable}, or the file {variable}_FILE names) cannot be "
            "parsed (its text is not shown: it holds the password): in a postgresql:// URL, percent-encode the "
            "characters % @ : / ? # of the user name and password (% as %25, @ as %40); fix the workers' environment"
        ) from None
    password = params.get("password")
    if password:
        REDACT.add(str(password))
    return params


def session_setup(options: PostgresConnection) -> Callable[[psycopg.Connection[Any]], None]:
    """What the pool does to each new connection (``ConnectionPool(configure=...)``): the session's
    ``lock_timeout``, ``statement_timeout`` and ``idle_in_transaction_session_timeout`` from ``options``, and
    JSON objects and arrays given to ``COPY`` as JSON text."""
    timeouts = tuple(
        f"{max(1, round(seconds * 1000))}ms"  # 0 would turn the timeout off
        for seconds in (
            options.lock_timeout_seconds,
            options.statement_timeout_seconds,
            options.idle_in_transaction_timeout_seconds,
        )
    )

    def configure(conn: psycopg.Connection[Any]) -> None:
        conn.adapters.register_dumper(dict, _JsonText)
        conn.adapters.register_dumper(list, _JsonText)
        conn.execute(
            "SELECT set_config('lock_timeout', %s, false), set_config('statement_timeout', %s, false), "
            "set_config('idle_in_transaction_session_timeout', %s, false)",
            timeouts,
        )
        conn.commit()  # the pool takes the connection idle only

    return configure


class _JsonText(Dumper):
    """Objects and arrays of the handler's output as their JSON text (for json/jsonb/text columns)."""

    def dump(self, obj: Any) -> bytes:
        return encode_json(obj)


def waited(err: BaseException, spec: PostgresSink, lock: str, doing: str, outcome: str) -> SinkError | None:
    """``err`` as a retryable ``SinkError`` when it is a wait the session's timeouts ended (None otherwise): a
    lock another session holds (``lock_timeout``, SQLSTATE 55P03), or a statement that ran too long
    (``statement_timeout``, 57014). ``lock``: the lock waited for, for people; ``doing``: the statement's work
    (``writing table public.t``); ``outcome``: what happens next."""
    setting = f"S3BATCH_POSTGRES_{spec.connection.upper()}_"
    if isinstance(err, psycopg.errors.LockNotAvailable):
        return SinkError(
            f"PostgreSQL connection {spec.connection!r}: waited longer than its lock_timeout for {lock}, which "
            "another session holds (a LOCK TABLE, an ALTER TABLE, a long transaction: see pg_locks and "
            f"pg_stat_activity); {outcome}. Waits that long are expected? Raise {setting}LOCK_TIMEOUT_SECONDS "
            "(below the job's heartbeat timeout)"
        )
    if isinstance(err, psycopg.errors.QueryCanceled):
        return SinkError(
            f"PostgreSQL connection {spec.connection!r}: {doing} took longer than its statement_timeout; {outcome}. "
            f"Statements that long are expected? Raise {setting}STATEMENT_TIMEOUT_SECONDS (below the job's heartbeat "
            "timeout), or lower chunk_records"
        )
    return None


UNUSABLE = (psycopg.errors.InsufficientPrivilege, psycopg.errors.UndefinedTable)
"""What the database raises where the role lacks a privilege (SQLSTATE 42501) or a table is missing (42P01): no
retry helps; the file fails at once (:func:`database_error`)."""

RETRIED = "the chunk was not committed and is retried from the database's checkpoint"
"""What follows a failed chunk's transaction (:func:`database_error`'s default ``outcome``)."""


def database_error(
    err: BaseException, doing: str, spec: PostgresSink, outcome: str = RETRIED
) -> SinkError | SinkInvalid:
    """A database failure as a retryable ``SinkError`` (SQLSTATE and class, never the server's text, which may
    quote values; a wait the session's timeouts ended says which: :func:`waited`); ``outcome``: what happens next.
    A privilege the role lacks or a missing table (:data:`UNUSABLE`) is a ``SinkInvalid`` instead, not retried."""
    table = f"{spec.schema_name}.{spec.table_name}"
    lock = f"a lock on table {table} (the table, a key or a row of it; or the file's turn, held by another attempt)"
    timed_out = waited(err, spec, lock, f"{doing} table {table}", outcome)
    if timed_out is not None:
        return timed_out
    state = getattr(getattr(err, "diag", None), "sqlstate", None)
    code = f", SQLSTATE {state}" if state else ""
    if isinstance(err, UNUSABLE):
        return SinkInvalid(
            f"PostgreSQL connection {spec.connection!r} failed while {doing} table {table} ({type(err).__name__}"
            f"{code}): the table or its checkpoint table {spec.schema_name}.s3batch_checkpoints is missing, or the "
            "connection's role lacks a privilege on it (or on the sequence of a serial column: GRANT USAGE ON "
            "SEQUENCE); not retried: create it, or grant what 'Grants' in docs/how-to/postgres.md lists for the sink's "
            "mode"
        )
    return SinkError(
        f"PostgreSQL connection {spec.connection!r} failed while {doing} table {table} ({type(err).__name__}{code}); "
        f"{outcome}"
    )


class RedactSecrets(logging.Filter):
    """Takes the secrets it holds (the DSNs' passwords and texts) out of the records of the loggers it filters:
    the connection pool logs the error of every failed connection attempt as libpq words it."""

    def __init__(self) -> None:
        super().__init__()
        self._secrets: set[str] = set()
        self._lock = threading.Lock()
        self._installed = False

    def add(self, secret: str) -> None:
        """Redact ``secret`` from now on (installs the filter on the ``psycopg`` loggers the first time)."""
        with self._lock:
            self._secrets.add(secret)
            if not self._installed:
                for name in ("psycopg", "psycopg.pool"):
                    logging.getLogger(name).addFilter(self)
                self._installed = True

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except (TypeError, ValueError):
            return True  # a record that cannot be formatted: logging reports it as such, without its arguments
        found = [s for s in self._secrets if s in text]
        if found:
            for secret in sorted(found, key=len, reverse=True):
                text = text.replace(secret, "[redacted]")
            record.msg, record.args = text, None
        error = record.exc_info[1] if record.exc_info else None
        if error is not None and any(s in str(error) for s in self._secrets):
            record.msg, record.args = f"{record.getMessage()} ({type(error).__name__}: message redacted)", None
            record.exc_info, record.exc_text = None, None
        return True


REDACT = RedactSecrets()
"""The filter of the ``psycopg`` loggers (a logger's filters see only the records logged on it, so both)."""

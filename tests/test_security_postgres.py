"""Least privilege for the PostgreSQL sink (issue 36, findings 2, 3, 5, 7, 8), against a real PostgreSQL server
started for this module and jobs on in-process workers:

- a lock another session holds (``LOCK TABLE`` on the target, on ``s3batch_checkpoints``) fails the file's attempt
  after the connection's ``lock_timeout`` (a ``SinkError`` naming the lock, not a heartbeat timeout); the file
  finishes once the lock is released, each row once, no session left waiting;
- the connection's table allow-list (``S3BATCH_POSTGRES_<NAME>_TABLES``) and the schemas always refused, at the
  job's start check and per file; the grants per mode of docs/how-to/postgres.md are enough (a role of its own, the
  checkpoint table created in advance: no CREATE); a grant missing fails the job at its start with the ``GRANT`` to
  run, and a file at once, not after every attempt;
- a DSN libpq cannot parse (a password with an unencoded ``%``) never reaches a log, the history or an error;
- rejects carry PostgreSQL's DETAIL text (which may quote other rows) only when the job asks for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from temporalio.client import Client, WorkflowFailureError
from temporalio.worker import Worker

from s3batch.checkpoint import Checkpoint
from s3batch.config import PostgresConnection, Settings
from s3batch.dev.postgres import PostgresServer, server_bindir
from s3batch.dev.stack import Stack
from s3batch.errors import SinkInvalid
from s3batch.file_output import FileOutput
from s3batch.jsonvalues import encode_json
from s3batch.models import S3BatchInput
from s3batch.plugin import S3BatchPlugin
from s3batch.s3io import make_client
from s3batch.sinks.postgres import PostgresOutput
from s3batch.sinks.postgres_access import CHECKPOINT_DDL
from s3batch.sinks.postgres_pools import PostgresPools
from s3batch.sinks.postgres_session import parse_dsn
from s3batch.sinks.spec import PostgresSink
from tests.helpers import wait_for
from tests.helpers.data import make_csv
from tests.helpers.history import history_events, local_activity
from tests.helpers.jobs import execute, start
from tests.helpers.output import read_jsonl

GRANTS_PAGE = Path(__file__).resolve().parent.parent / "docs" / "how-to" / "postgres.md"
"""Where the operators' grants are written (the site's "PostgreSQL imports in depth", section Grants)."""


@pytest.fixture(scope="module")
def pg() -> Iterator[PostgresServer]:
    bindir = server_bindir()
    if bindir is None:
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) not found: pg_config --bindir, /usr/lib/postgresql")
    server = PostgresServer(bindir)
    try:
        server.start()
    except (RuntimeError, KeyError) as err:  # KeyError: no postgres user to run it as root
        server.remove()
        pytest.skip(f"cannot start a PostgreSQL server here: {err}")
    try:
        yield server
    finally:
        server.remove()


@pytest.fixture
def table(pg: PostgresServer) -> str:
    """A fresh ``public.items_<hex>`` (id int primary key, name text, note text)."""
    name = f"items_{uuid.uuid4().hex[:8]}"
    pg.execute(f"CREATE TABLE public.{name} (id integer PRIMARY KEY, name text NOT NULL, note text)")
    return name


@contextlib.asynccontextmanager
async def pg_worker(stack: Stack, task_queue: str, settings: Settings) -> AsyncIterator[Worker]:
    """An in-process worker with these settings."""
    plain = await Client.connect(stack.config.temporal_address)
    plugin = S3BatchPlugin(make_client(), settings=settings, register_search_attributes=False)
    async with Worker(plain, task_queue=task_queue, plugins=[plugin], max_concurrent_activities=4) as w:
        yield w


def _settings(dsn: str, **options: Any) -> Settings:
    return Settings.explicit(postgres_dsns={"test": dsn}, postgres_connections={"test": PostgresConnection(**options)})


def _job(src: str, out: str, table: str, **kw: Any) -> S3BatchInput:
    sink = {"type": "postgres", "connection": "test", "table": table, **kw.pop("sink", {})}
    options: dict[str, Any] = {"prefix": "in/", "output_bucket": out, "output_prefix": "o/", "chunk_records": 100}
    return S3BatchInput.model_validate({"bucket": src, "sink": sink, "group_max_files": 1, **options, **kw})


async def _failure(client: Client, task_queue: str, spec: S3BatchInput, timeout: float = 30) -> tuple[str, str]:
    """The failed job's ``(type, message)`` of the innermost cause."""
    handle = await start(client, task_queue, spec, "pgsec")
    try:
        await asyncio.wait_for(handle.result(), timeout)
    except WorkflowFailureError as err:
        cause: BaseException = err
        while cause.__cause__ is not None:
            cause = cause.__cause__
        return str(getattr(cause, "type", type(cause).__name__)), str(cause)
    finally:
        with contextlib.suppress(Exception):
            await handle.terminate("test over")
    raise AssertionError("the job succeeded")


def _ids(pg: PostgresServer, table: str) -> list[int]:
    return [int(str(r[0])) for r in pg.execute(f"SELECT id FROM {table} ORDER BY id")]


def _output(s3: Any, out: str, key: str) -> FileOutput:
    """The S3 output folder of a file ``key`` (version ``e1``) of a sink called directly."""
    return FileOutput(
        s3, bucket=out, output_prefix="o/", key=key, etag="e1", fingerprint="f", secret=None, put_params={},
        log_extra={},
    )


# ---------------------------------------------------------------------------------- finding 2: locks and timeouts


def test_each_session_carries_its_connections_timeouts(pg: PostgresServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """``lock_timeout``, ``statement_timeout`` and ``idle_in_transaction_session_timeout`` on every pooled session:
    the defaults below the default heartbeat timeout, per connection from ``S3BATCH_POSTGRES_<NAME>_...``."""
    defaults = Settings.explicit().postgres_connection("any")
    assert (defaults.lock_timeout_seconds, defaults.statement_timeout_seconds) == (10.0, 20.0)
    assert max(defaults.lock_timeout_seconds, defaults.statement_timeout_seconds) < 30  # the default heartbeat timeout
    monkeypatch.setenv("S3BATCH_POSTGRES_TEST_DSN", pg.dsn)
    monkeypatch.setenv("S3BATCH_POSTGRES_TEST_LOCK_TIMEOUT_SECONDS", "0.5")
    monkeypatch.setenv("S3BATCH_POSTGRES_TEST_STATEMENT_TIMEOUT_SECONDS", "2")
    monkeypatch.setenv("S3BATCH_POSTGRES_TEST_IDLE_IN_TRANSACTION_TIMEOUT_SECONDS", "3")
    pools = PostgresPools(Settings())
    try:
        with pools.pool("test").connection() as conn:
            shown = conn.execute(
                "SELECT current_setting('lock_timeout'), current_setting('statement_timeout'), "
                "current_setting('idle_in_transaction_session_timeout')"
            ).fetchone()
        assert shown == ("500ms", "2s", "3s")
    finally:
        pools.close()
    monkeypatch.setenv("S3BATCH_POSTGRES_TEST_LOCK_TIMEOUT_SECONDS", "soon")
    with pytest.raises(SinkInvalid, match="S3BATCH_POSTGRES_TEST_LOCK_TIMEOUT_SECONDS"):
        PostgresPools(Settings()).pool("test")


@pytest.mark.parametrize("held", ["table", "checkpoints"])
async def test_a_lock_held_elsewhere_fails_the_attempt_and_the_file_finishes_once_released(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, stack: Stack, pg: PostgresServer,
    table: str, held: str,
) -> None:
    """Another session holds ``LOCK TABLE`` on the target table, or on ``s3batch_checkpoints`` (every checkpoint row
    with it): each attempt of the file fails after the connection's ``lock_timeout`` with a ``SinkError`` naming the
    lock (the worker heartbeats on: the failure is no heartbeat timeout) and is retried; once the lock is released
    the file finishes, every row once, and no session of the sink is left waiting or idle in a transaction."""
    src, out = buckets
    s3.put_object(Bucket=src, Key="in/a.csv", Body=make_csv(250))
    settings = _settings(pg.dsn, lock_timeout_seconds=0.5)
    spec = _job(src, out, f"public.{table}", heartbeat_timeout_seconds=10, max_attempts=30)
    ready = PostgresPools(settings)
    try:
        assert isinstance(spec.sink, PostgresSink)
        ready.columns(spec.sink)  # the checkpoint table exists before it is locked
    finally:
        ready.close()
    locked = f"public.{table}" if held == "table" else "public.s3batch_checkpoints"
    holder = psycopg.connect(pg.dsn)
    holder.execute(f"LOCK TABLE {locked} IN {'ACCESS EXCLUSIVE' if held == 'table' else 'EXCLUSIVE'} MODE")
    try:
        async with pg_worker(stack, task_queue, settings):
            handle = await start(client, task_queue, spec, "pglock")

            async def retried() -> Any:
                pending = (await handle.describe()).raw_description.pending_activities
                files = [p for p in pending if p.activity_type.name == "s3batch.process_file"]
                return files[0] if files and files[0].attempt >= 3 else None

            pending = await wait_for(retried, 30, "the file's third attempt, after two lock timeouts")
            failure = pending.last_failure
            assert not failure.HasField("timeout_failure_info"), failure  # not taken for a dead worker
            assert failure.application_failure_info.type == "SinkError", failure
            assert "waited longer than its lock_timeout" in failure.message, failure.message
            expected = f"a lock on table public.{table}" if held == "table" else "in public.s3batch_checkpoints"
            assert expected in failure.message and "LOCK_TIMEOUT_SECONDS" in failure.message, failure.message
            holder.rollback()  # the lock released
            result = await asyncio.wait_for(handle.result(), 60)
    finally:
        holder.close()
    assert result.status == "succeeded" and result.totals.records_written == 250
    assert _ids(pg, f"public.{table}") == list(range(250))
    stuck = pg.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() "
        "AND (wait_event_type = 'Lock' OR state LIKE 'idle in transaction%%')"
    )
    assert stuck == [(0,)]


# ---------------------------------------------------------------------------------- finding 3: which tables


async def test_a_table_outside_the_connections_allow_list_is_refused_at_start(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, stack: Stack, pg: PostgresServer,
    table: str,
) -> None:
    """``S3BATCH_POSTGRES_TEST_TABLES=public.items_*``: a table of another schema is refused before any statement
    (its schema gets no checkpoint table); one the globs match is imported."""
    src, out = buckets
    s3.put_object(Bucket=src, Key="in/a.csv", Body=make_csv(5))
    other = f"other_{uuid.uuid4().hex[:8]}"
    pg.execute(f"CREATE SCHEMA {other}; CREATE TABLE {other}.items (id integer PRIMARY KEY, name text, note text)")
    async with pg_worker(stack, task_queue, _settings(pg.dsn, tables="public.items_*, staging.x")):
        kind, message = await _failure(client, task_queue, _job(src, out, f"{other}.items"))
        assert kind == "InvalidInput", message
        assert f"table {other}.items is not one that jobs may write through PostgreSQL connection 'test'" in message
        assert "S3BATCH_POSTGRES_TEST_TABLES (public.items_*, staging.x)" in message, message
        assert pg.execute(f"SELECT to_regclass('{other}.s3batch_checkpoints')") == [(None,)]
        result = await execute(client, task_queue, _job(src, out, f"public.{table}", output_prefix="o2/"))
    assert result.status == "succeeded" and _ids(pg, f"public.{table}") == list(range(5))


async def test_system_schemas_and_the_checkpoint_table_are_refused_whatever_the_list(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, stack: Stack, pg: PostgresServer,
) -> None:
    """With an owner's DSN (the test server's superuser) and no allow-list: a job into ``information_schema`` or
    into the checkpoint table fails at start, and no checkpoint table is created in ``information_schema``."""
    src, out = buckets
    s3.put_object(Bucket=src, Key="in/a.csv", Body=b"feature_id,feature_name\n1,x\n")
    async with pg_worker(stack, task_queue, _settings(pg.dsn)):
        kind, message = await _failure(client, task_queue, _job(src, out, "information_schema.sql_features"))
        assert kind == "InvalidInput" and "is in the system schema information_schema" in message, message
        assert pg.execute("SELECT to_regclass('information_schema.s3batch_checkpoints')") == [(None,)]
        kind, message = await _failure(client, task_queue, _job(src, out, "public.s3batch_checkpoints"))
        assert kind == "InvalidInput" and "is s3batch's checkpoint table" in message, message
    for name in ("pg_catalog.pg_authid", "pg_toast.x", "PG_CATALOG.pg_class", "pg_temp.t"):
        spec = PostgresSink(type="postgres", connection="test", table=name)
        with pytest.raises(SinkInvalid, match="system schema"):
            PostgresPools(_settings(pg.dsn, tables="*")).for_table(spec)


def test_each_file_checks_the_allow_list_before_any_statement(
    s3: Any, buckets: tuple[str, str], pg: PostgresServer, table: str
) -> None:
    """A file's sink (the start check skipped: a workflow input reaches the file activity as it is) is refused before
    its connection is used."""
    src, out = buckets
    spec = PostgresSink(type="postgres", connection="test", table=f"public.{table}")
    pools = PostgresPools(_settings(pg.dsn, tables="staging.*"))
    with pytest.raises(SinkInvalid, match="S3BATCH_POSTGRES_TEST_TABLES"):
        PostgresOutput(spec, _output(s3, out, "in/a.csv"), pools, job_id="j", bucket=src, where="s3://x/y")
    assert pools._pools == {}  # no connection was opened


# ---------------------------------------------------------------------------------- finding 3 and 7: grants

SCHEMA, TABLE, ROLE = "warehouse", "customers", "s3batch_writer"
"""The names the documented grants use."""

GRANTS = {
    "every mode": [
        "GRANT USAGE ON SCHEMA warehouse TO s3batch_writer",
        "GRANT SELECT, INSERT, UPDATE ON TABLE warehouse.s3batch_checkpoints TO s3batch_writer",
    ],
    "insert": ["GRANT INSERT ON TABLE warehouse.customers TO s3batch_writer"],
    "upsert": ["GRANT SELECT, INSERT, UPDATE ON TABLE warehouse.customers TO s3batch_writer"],
    "replace": ["GRANT SELECT, DELETE ON TABLE warehouse.customers TO s3batch_writer"],
}
"""The documented minimal grants, by what needs them (each statement is on the page as it is here)."""


def _readme_ddl() -> str:
    """The documented ``CREATE TABLE warehouse.s3batch_checkpoints (...)``."""
    found = re.search(r"CREATE TABLE warehouse\.s3batch_checkpoints \(.*?\n\);", GRANTS_PAGE.read_text(), re.S)
    assert found, "the grants page gives the checkpoint table's CREATE TABLE"
    return found.group(0)


def _least_privileged(pg: PostgresServer, grants: list[str], checkpoints: bool = True) -> tuple[str, str, str]:
    """A schema with the table ``customers`` (id, name, note, src), a role that may log in and has only ``grants``
    (the documented ones, for its names), the checkpoint table created in advance by the operator;
    ``(schema, role, dsn)``."""
    tag = uuid.uuid4().hex[:8]
    schema, role = f"wh_{tag}", f"writer_{tag}"
    pg.execute(f"CREATE ROLE {role} LOGIN; CREATE SCHEMA {schema}")
    pg.execute(f"CREATE TABLE {schema}.customers (id integer PRIMARY KEY, name text NOT NULL, note text, src text)")
    if checkpoints:
        pg.execute(_readme_ddl().replace("warehouse.", f"{schema}."))
    for grant in grants:
        pg.execute(grant.replace("warehouse", schema).replace("s3batch_writer", role))
    return schema, role, pg.dsn.replace("app@", f"{role}@")


def test_the_docs_give_the_grants_and_the_checkpoint_table_the_code_needs() -> None:
    text = GRANTS_PAGE.read_text()
    for statements in GRANTS.values():
        for statement in statements:
            assert f"{statement};" in text, statement
    words = re.sub(r"\s+", " ", _readme_ddl()).rstrip(";")
    expected = re.sub(r"\s+", " ", CHECKPOINT_DDL.format(table="warehouse.s3batch_checkpoints")).strip()
    assert words == expected.replace("IF NOT EXISTS ", ""), words
    assert "never the tables' owner or a superuser" in text


@pytest.mark.parametrize("mode", ["insert", "upsert", "replace"])
async def test_a_role_with_the_documented_grants_imports_without_create(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, stack: Stack, pg: PostgresServer, mode: str,
) -> None:
    """A role of its own with exactly the documented grants for the mode, the checkpoint table created in advance (no
    CREATE on any schema): the file is imported, and a new version of it again (upserted, or replacing the rows)."""
    src, out = buckets
    grants = GRANTS["every mode"] + GRANTS["insert" if mode == "replace" else mode] + GRANTS.get(mode, [])
    schema, role, dsn = _least_privileged(pg, list(dict.fromkeys(grants)))
    assert pg.execute(f"SELECT has_schema_privilege('{role}', '{schema}', 'CREATE')") == [(False,)]
    sink: dict[str, Any] = {"mode": "upsert", "key": ["id"]} if mode == "upsert" else {}
    if mode == "replace":
        sink = {"on_reimport": "replace", "source_column": "src"}
    async with pg_worker(stack, task_queue, _settings(dsn)):
        for version, rows in enumerate((6,) if mode == "insert" else (6, 4)):
            s3.put_object(Bucket=src, Key="in/a.csv", Body=make_csv(rows))
            spec = _job(src, out, f"{schema}.customers", sink=sink, output_prefix=f"o{version}/")
            result = await execute(client, task_queue, spec)
            assert result.status == "succeeded" and result.totals.records_written == rows, result
    assert _ids(pg, f"{schema}.customers") == list(range(4 if mode == "replace" else 6))


async def test_a_grant_missing_fails_the_job_at_its_start_with_what_to_grant(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, stack: Stack, pg: PostgresServer,
) -> None:
    """Not retried until the attempts run out: ``InvalidInput`` at the start check, naming the ``GRANT`` to run
    (the table's INSERT; the checkpoint table missing and no CREATE: CREATE, or the table created in advance)."""
    src, out = buckets
    s3.put_object(Bucket=src, Key="in/a.csv", Body=make_csv(5))
    schema, role, dsn = _least_privileged(pg, GRANTS["every mode"])
    bare, bare_role, bare_dsn = _least_privileged(pg, [GRANTS["every mode"][0], *GRANTS["insert"]], checkpoints=False)
    for where, url, grant in (
        (schema, dsn, f"GRANT INSERT ON TABLE {schema}.customers TO {role}"),
        (bare, bare_dsn, f"GRANT CREATE ON SCHEMA {bare} TO {bare_role} (or create the checkpoint table"),
    ):
        async with pg_worker(stack, task_queue, _settings(url)):
            handle = await start(client, task_queue, _job(src, out, f"{where}.customers", max_attempts=3), "pggrant")
            with pytest.raises(WorkflowFailureError) as failed:
                await asyncio.wait_for(handle.result(), 30)
        cause = failed.value.cause
        while cause.__cause__ is not None:
            cause = cause.__cause__
        assert getattr(cause, "type", None) == "InvalidInput" and grant in str(cause), cause
        events = await history_events(client, handle.id)
        ran = [step for e in events if (step := local_activity(e)) is not None]  # the check is a local activity
        assert [(step["activity_type"], step["attempt"]) for step in ran] == [("s3batch.check_job", 1)]  # once
    assert _ids(pg, f"{schema}.customers") == []


def test_a_grant_revoked_or_the_table_dropped_mid_job_fails_the_file_at_once(
    s3: Any, buckets: tuple[str, str], pg: PostgresServer
) -> None:
    """After the start check: the chunk's write fails with ``SinkInvalid`` (not retried), naming the GRANT or the
    table to create, not a retryable ``SinkError``."""
    src, out = buckets
    schema, role, dsn = _least_privileged(pg, GRANTS["every mode"] + GRANTS["insert"])
    spec = PostgresSink(type="postgres", connection="test", table=f"{schema}.customers")
    pools = PostgresPools(_settings(dsn))
    start_cp = Checkpoint(etag="e1", fingerprint="f")
    new = start_cp.model_copy(update={"chunk": 1, "next_record": 1, "records_written": 1, "line": 2})
    rows = [encode_json({"id": 1, "name": "n"})]
    try:
        sink = PostgresOutput(spec, _output(s3, out, "in/a.csv"), pools, job_id="j", bucket=src,
                              where=f"s3://{src}/in/a.csv")
        pg.execute(f"REVOKE INSERT ON {schema}.customers FROM {role}")
        with pytest.raises(SinkInvalid, match=re.escape(f"GRANT INSERT ON TABLE {schema}.customers TO {role}")):
            sink.commit(start_cp, new, list(rows), [], [2])
        pg.execute(f"GRANT INSERT ON {schema}.customers TO {role}")
        sink = PostgresOutput(spec, _output(s3, out, "in/b.csv"), pools, job_id="j", bucket=src,
                              where=f"s3://{src}/in/b.csv")
        pg.execute(f"DROP TABLE {schema}.customers")
        with pytest.raises(SinkInvalid, match=f"table {schema}.customers does not exist"):
            sink.commit(start_cp, new, list(rows), [], [2])
    finally:
        pools.close()


# ---------------------------------------------------------------------------------- finding 5: the DSN


PASSWORD = "Zq7-s3cr%t-pw"
"""A password with an unencoded ``%`` (libpq's error quotes the token it cannot decode)."""


async def test_a_malformed_dsn_never_reaches_the_logs_the_history_or_the_error(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, stack: Stack, pg: PostgresServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    src, out = buckets
    s3.put_object(Bucket=src, Key="in/a.csv", Body=make_csv(5))
    dsn = f"postgresql://app:{PASSWORD}@127.0.0.1:{pg.port}/postgres"
    async with pg_worker(stack, task_queue, _settings(dsn)):
        handle = await start(client, task_queue, _job(src, out, "public.t"), "pgdsn")
        try:
            with pytest.raises(WorkflowFailureError) as failed:
                await asyncio.wait_for(handle.result(), 20)
        finally:
            with contextlib.suppress(Exception):
                await handle.terminate("test over")
    events = await history_events(client, handle.id)
    for secret in (PASSWORD, "s3cr%t", "s3cr"):
        assert secret not in caplog.text and not any(secret in r.getMessage() for r in caplog.records)
        assert secret.encode() not in b"".join(e.SerializeToString() for e in events)
    cause = failed.value.cause
    while cause.__cause__ is not None:
        cause = cause.__cause__
    assert getattr(cause, "type", None) == "InvalidInput", cause
    assert "S3BATCH_POSTGRES_TEST_DSN" in str(cause) and "percent-encode" in str(cause), cause


def test_the_pool_loggers_never_show_a_dsns_password(caplog: pytest.LogCaptureFixture) -> None:
    """Whatever the pool logs (libpq words its errors), the passwords of the DSNs in use are taken out."""
    caplog.set_level(logging.DEBUG)
    parse_dsn("test", "postgresql://app:Wx9-long-secret@db.example/warehouse")
    logging.getLogger("psycopg.pool").warning("error connecting in %r: %s", "s3batch-test", "password=Wx9-long-secret")
    logging.getLogger("psycopg").warning("plain Wx9-long-secret")
    assert "Wx9-long-secret" not in caplog.text and caplog.text.count("[redacted]") == 2, caplog.text
    with pytest.raises(SinkInvalid, match="S3BATCH_POSTGRES_TEST_DSN") as refused:
        parse_dsn("test", f"postgresql://app:{PASSWORD}@db.example/warehouse")
    assert PASSWORD not in str(refused.value) and "s3cr" not in str(refused.value)


# ---------------------------------------------------------------------------------- finding 8: DETAIL


async def test_rejects_carry_postgresqls_detail_only_when_the_job_asks(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, stack: Stack, pg: PostgresServer,
) -> None:
    """An exclusion constraint's DETAIL quotes the row already in the table that a refused row conflicts with: not in
    the rejects file by default; with ``"reject_details": true`` it is."""
    src, out = buckets
    name = f"public.booking_{uuid.uuid4().hex[:8]}"
    pg.execute(f"CREATE TABLE {name} (id integer PRIMARY KEY, during int4range, EXCLUDE USING gist (during WITH &&))")
    pg.execute(f"INSERT INTO {name} VALUES (1, '[424242,434343)')")  # another row, not in the file
    async with pg_worker(stack, task_queue, _settings(pg.dsn)):
        for n, asked in enumerate((False, True)):
            s3.put_object(Bucket=src, Key=f"in{n}/a.csv", Body=b'id,during\n2,"[430000,430001)"\n3,"[5,6)"\n')
            sink = {"reject_details": True} if asked else {}
            spec = _job(src, out, name, sink=sink, prefix=f"in{n}/", output_prefix=f"o{n}/")
            result = await execute(client, task_queue, spec)
            assert (result.totals.records_written, result.totals.rejected) == (1, 1), result
            [reject] = read_jsonl(s3, out, f"o{n}/", "rejects")
            assert reject["line"] == 2 and "violates exclusion constraint" in reject["reason"], reject
            assert ("424242" in reject["reason"]) is asked, reject
            pg.execute(f"DELETE FROM {name} WHERE id = 3")

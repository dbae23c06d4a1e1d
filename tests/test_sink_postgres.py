"""The PostgreSQL sink against a real PostgreSQL server started for this module (``s3batch.dev.postgres``):
rows exactly once with the checkpoint in the same transaction (also across SIGKILLs of a real worker),
upsert re-runs, rows the database refuses as rejects, a missing table or columns, an unknown connection."""

from __future__ import annotations

import concurrent.futures
import json
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import pytest
from s3batch.activities import file_setup
from s3batch.activities.committed import fill_cancelled
from s3batch.activities.s3_activities import S3Activities
from temporalio.api.enums.v1 import PendingActivityState
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client, WorkflowFailureError
from temporalio.testing import ActivityEnvironment
from temporalio.worker import Worker

import tests.fault_handlers  # registers explode_until_fixed for in-process workers
import tests.slow_handlers  # noqa: F401 - registers slow_passthrough for in-process workers
from s3batch import client as api
from s3batch.checkpoint import Checkpoint
from s3batch.cli.render import print_report, report_destination
from s3batch.config import PostgresConnection, Settings
from s3batch.dev.postgres import PostgresServer, server_bindir
from s3batch.dev.stack import Stack
from s3batch.dev.workers import WorkerProcess
from s3batch.errors import SinkError, SinkInvalid
from s3batch.file_output import FileOutput
from s3batch.jsonvalues import encode_json
from s3batch.messages import FileResult, ObjectRef, ProcessFileInput, Totals
from s3batch.models import S3BatchInput
from s3batch.plugin import S3BatchPlugin
from s3batch.s3io import make_client
from s3batch.sinks.postgres import PostgresOutput
from s3batch.sinks.postgres_pools import PostgresPools
from s3batch.sinks.rows import CsvRows
from s3batch.sinks.spec import PostgresSink
from tests.helpers import wait_for
from tests.helpers.assertions import assert_invalid_input
from tests.helpers.data import make_csv, messy_csv
from tests.helpers.jobs import execute, new_id, progress, start
from tests.helpers.output import report
from tests.helpers.workers import worker_process


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


@pytest.fixture
async def pg_worker(stack: Stack, pg: PostgresServer, task_queue: str) -> AsyncIterator[Worker]:
    """An in-process worker whose settings know connection ``test`` (and no other)."""
    plain = await Client.connect(stack.config.temporal_address)
    settings = Settings.explicit(postgres_dsns={"test": pg.dsn})
    plugin = S3BatchPlugin(make_client(), settings=settings, register_search_attributes=False)
    async with Worker(plain, task_queue=task_queue, plugins=[plugin], max_concurrent_activities=4) as w:
        yield w


def _job(src: str, out: str, table: str, **kw: Any) -> S3BatchInput:
    sink = kw.pop("sink", {"type": "postgres", "connection": "test", "table": f"public.{table}"})
    options: dict[str, Any] = {"prefix": "in/", "output_bucket": out, "output_prefix": "o/", "chunk_records": 100}
    return S3BatchInput.model_validate({"bucket": src, "sink": sink, **options, **kw})


def _ids(pg: PostgresServer, table: str) -> list[int]:
    return [int(r[0]) for r in pg.execute(f"SELECT id FROM public.{table} ORDER BY id")]  # type: ignore[call-overload]


def _checkpoint(pg: PostgresServer, bucket: str, key: str) -> dict[str, Any] | None:
    """The checkpoint row of ``bucket``/``key`` (the table is shared by the module's tests, and each
    test has its own source bucket: a key alone would find an earlier test's finished file)."""
    if pg.execute("SELECT to_regclass('public.s3batch_checkpoints')") == [(None,)]:
        return None  # no worker has opened the table yet
    rows = pg.execute(
        "SELECT checkpoint FROM public.s3batch_checkpoints WHERE source_bucket = %s AND source_key = %s", (bucket, key)
    )
    return rows[0][0] if rows else None  # type: ignore[return-value]


async def test_rows_land_once_with_their_checkpoint(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, pg: PostgresServer, table: str,
    pg_worker: Worker,
) -> None:
    src, out = buckets
    s3.put_object(Bucket=src, Key="in/a.csv", Body=make_csv(1_050))
    result = await execute(client, task_queue, _job(src, out, table), "pg")
    assert result.status == "succeeded"
    assert result.totals.records_written == 1_050
    rows = pg.execute(f"SELECT id, name, note FROM public.{table} ORDER BY id")
    assert rows == [(i, f"name, {i}", None) for i in range(1_050)]  # an unquoted empty field: NULL, as COPY loads it
    cp = _checkpoint(pg, src, "in/a.csv")
    assert cp is not None and cp["done"] and cp["chunk"] == 11 and cp["next_record"] == 1_050
    # The rows are in the table: no parts in the output bucket.
    listed = s3.list_objects_v2(Bucket=out, Prefix="o/in/a.csv/").get("KeyCount", 0)
    assert listed == 0
    # The same file again (a new job): the database's checkpoint says it is done, nothing is written twice.
    again = await execute(client, task_queue, _job(src, out, table, output_prefix="o2/"), "pg")
    assert again.status == "succeeded"
    assert _ids(pg, table) == list(range(1_050))


async def test_status_and_report_name_the_table_the_rows_went_to(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, pg: PostgresServer, table: str,
    pg_worker: Worker, capsys: pytest.CaptureFixture[str],
) -> None:
    """``s3batch status`` (the ``progress`` query) and ``s3batch report`` say where the rows went: the table,
    its connection and mode, and the folder of the rejects and report."""
    src, out = buckets
    s3.put_object(Bucket=src, Key="in/a.csv", Body=make_csv(120))
    handle = await start(client, task_queue, _job(src, out, table, sink={
        "type": "postgres", "connection": "test", "table": table, "mode": "upsert", "key": ["id"],
    }), "pg")
    assert (await handle.result()).totals.records_written == 120
    expected = f"PostgreSQL table public.{table} (connection 'test', upsert, key id); rejects and report in s3://{out}/o/"
    assert (await progress(handle)).destination == expected  # a closed job's query: replayed by the worker
    metadata = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    assert metadata.current_details.startswith(f"**succeeded** s3://{src}/in/ -> {expected}\n")  # the Web UI's
    stored = await api.report(client, handle.id)
    assert report_destination(stored.report) == expected
    print_report(stored)
    shown = " ".join(capsys.readouterr().out.split())  # rich wraps long lines at the console's width
    assert f"s3://{src}/in/ -> {expected}" in shown


async def test_upsert_rerun_of_a_corrected_file_updates_rows(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, pg: PostgresServer, table: str,
    pg_worker: Worker,
) -> None:
    src, out = buckets
    sink = {"type": "postgres", "connection": "test", "table": table, "mode": "upsert", "key": ["id"]}
    s3.put_object(Bucket=src, Key="in/a.csv", Body=b"id,name,note\n1,a,x\n2,b,y\n3,c,z\n")
    assert (await execute(client, task_queue, _job(src, out, table, sink=sink))).status == "succeeded"
    # Corrected: row 2 changed, row 4 added, and row 1 twice in one chunk (the last one wins).
    s3.put_object(Bucket=src, Key="in/a.csv", Body=b"id,name,note\n1,a,x\n2,B,fixed\n4,d,w\n1,A,last\n")
    result = await execute(client, task_queue, _job(src, out, table, sink=sink, output_prefix="o2/"))
    assert result.status == "succeeded"
    rows = pg.execute(f"SELECT id, name, note FROM public.{table} ORDER BY id")
    assert rows == [(1, "A", "last"), (2, "B", "fixed"), (3, "c", "z"), (4, "d", "w")]


@pytest.mark.parametrize("behind", [False, True], ids=["at-once", "written-behind"])
async def test_rows_the_database_refuses_become_rejects_with_its_reason_and_line(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, pg: PostgresServer, pg_worker: Worker,
    behind: bool, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Written behind (the next chunk read while one commits), a chunk's checkpoint still counts the rows the
    database refused in the chunk before (``carried_over``): the same counts, rows and rejects as at once."""
    if behind:
        monkeypatch.setattr(file_setup, "BEHIND_MIN_BYTES", 0)  # this small file's transactions one chunk behind
    src, out = buckets
    name = f"people_{uuid.uuid4().hex[:8]}"
    pg.execute(f"CREATE TABLE public.{name} (id integer PRIMARY KEY, born date NOT NULL)")
    lines = ["id,born"] + [f"{i},2020-01-{1 + i % 28:02d}" for i in range(300)]
    lines[1 + 17] = "17,2020-13-45"  # not a date: source line 19
    lines[1 + 150] = "150,soon"  # line 152
    lines[1 + 151] = "5,2021-01-01"  # a duplicate id: line 153
    s3.put_object(Bucket=src, Key="in/p.csv", Body=("\n".join(lines) + "\n").encode())
    result = await execute(client, task_queue, _job(src, out, name), "pg")
    assert result.status == "succeeded"
    assert result.totals.records_written == 297 and result.totals.rejected == 3
    ids = _ids(pg, name)
    assert ids == sorted(set(range(300)) - {17, 150, 151})
    assert pg.execute(f"SELECT born::text FROM public.{name} WHERE id = 5") == [("2020-01-06",)]
    rejects = []
    for chunk in (0, 1):
        body = s3.get_object(Bucket=out, Key=f"o/in/p.csv/rejects-{chunk:05d}.jsonl")["Body"].read()
        rejects += [json.loads(line) for line in body.splitlines()]
    assert [r["line"] for r in rejects] == [19, 152, 153]
    assert "SQLSTATE 22008" in rejects[0]["reason"] and "date/time field value out of range" in rejects[0]["reason"]
    assert "SQLSTATE 22007" in rejects[1]["reason"] and rejects[1]["record"] == {"id": "150", "born": "soon"}
    assert "SQLSTATE 23505" in rejects[2]["reason"]
    entry = report(s3, out, "o/")["files"][0]
    assert entry["rejected"] == 3 and entry["records_written"] == 297
    # The report's reasons name the error class, never the value.
    reasons = " ".join(r["reason"] for r in entry["reject_reasons"])
    assert "DatetimeFieldOverflow" in reasons and "2020-13-45" not in reasons


async def test_missing_table_and_missing_columns_fail_clearly(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, pg: PostgresServer, pg_worker: Worker,
) -> None:
    src, out = buckets
    s3.put_object(Bucket=src, Key="in/a.csv", Body=make_csv(10))
    message = await _failure(client, task_queue, _job(src, out, "no_such_table"), s3)
    assert "InvalidInput" in message and "public.no_such_table does not exist" in message, message
    narrow = f"narrow_{uuid.uuid4().hex[:8]}"
    pg.execute(f"CREATE TABLE public.{narrow} (id integer)")
    message = await _failure(client, task_queue, _job(src, out, narrow), s3)
    assert f"table public.{narrow} has no column for the fields 'name', 'note'" in message, message
    assert pg.execute(f"SELECT count(*) FROM public.{narrow}") == [(0,)]
    # An upsert key that is no unique index of the table: refused at start.
    sink = {"type": "postgres", "connection": "test", "table": narrow, "mode": "upsert", "key": ["id"]}
    message = await _failure(client, task_queue, _job(src, out, narrow, sink=sink, output_prefix="o4/"), s3)
    assert "InvalidInput" in message and "(id) is not a primary key or unique index" in message, message
    # The columns added, the same worker sees them at once (its cached columns are looked up again).
    pg.execute(f"ALTER TABLE public.{narrow} ADD COLUMN name text, ADD COLUMN note text")
    result = await execute(client, task_queue, _job(src, out, narrow, output_prefix="o3/"))
    assert result.status == "succeeded" and _ids(pg, narrow) == list(range(10))


async def _failure(client: Client, task_queue: str, spec: S3BatchInput, s3: Any) -> str:
    """The job's failure as text: the workflow failure and, for a failed file, its report entry's error."""
    handle = await start(client, task_queue, spec, "pgfail")
    try:
        result = await handle.result()
    except Exception as err:  # noqa: BLE001 - the failure chain is inspected as text
        chain = []
        cause: BaseException | None = err
        while cause is not None:
            chain.append(f"{type(cause).__name__}: {cause} {getattr(cause, 'type', '')}")
            cause = cause.__cause__
        if "JobFailed" in chain[-1]:
            chain += [str(f.get("error")) for f in report(s3, spec.output_bucket, spec.output_prefix)["files"]]
        return " | ".join(chain)
    raise AssertionError(f"the job succeeded: {result}")


async def test_unknown_connection_fails_at_start(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, pg_worker: Worker,
) -> None:
    src, out = buckets
    s3.put_object(Bucket=src, Key="in/a.csv", Body=make_csv(10))
    sink = {"type": "postgres", "connection": "warehouse", "table": "public.t"}
    message = await _failure(client, task_queue, _job(src, out, "t", sink=sink), s3)
    assert "InvalidInput" in message and "S3BATCH_POSTGRES_WAREHOUSE_DSN" in message, message


async def test_bad_sink_objects_are_refused_naming_the_field(client: Client, task_queue: str, worker: Worker) -> None:
    cases = [
        ({"type": "kafka"}, "sink"),
        ({"type": "postgres", "connection": "w", "table": "t", "colour": "red"}, "sink.postgres.colour"),
        ({"type": "postgres", "connection": "w", "table": "t", "mode": "upsert"}, "sink.postgres"),
        ({"type": "s3", "format": "csv"}, "sink.s3.format"),
    ]
    for sink, field in cases:
        workflow_id = new_id("badsink")
        raw = {"bucket": "src-x", "output_bucket": "out-x", "sink": sink}
        await client.start_workflow("S3BatchWorkflow", raw, id=workflow_id, task_queue=task_queue)
        await assert_invalid_input(client, workflow_id, [field])


@pytest.mark.slow
@pytest.mark.parametrize("pad", [0, 700], ids=["at-once", "written-behind"])
async def test_exactly_once_into_the_table_across_sigkills_mid_file(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, tmp_path: Path, pg: PostgresServer,
    table: str, pad: int,
) -> None:
    """Killed three times mid-file; with ``pad`` the file is big enough (``BEHIND_MIN_BYTES``) for each chunk's
    transaction to run while the next chunk is read: a kill then lands with a transaction in flight too."""
    src, out = buckets
    rows = 6_000
    body = make_csv(rows, pad)
    assert (len(body) >= file_setup.BEHIND_MIN_BYTES) == bool(pad)
    s3.put_object(Bucket=src, Key="in/big.csv", Body=body)
    env = {"S3BATCH_POSTGRES_TEST_DSN": pg.dsn, "S3BATCH_TEST_HANDLER_DELAY": "0.05"}
    spec = _job(src, out, table, handler="slow_passthrough", heartbeat_timeout_seconds=4, max_attempts=20)
    procs: list[WorkerProcess] = []
    try:
        procs.append(worker_process(task_queue, tmp_path, "w0", **env))
        procs[-1].wait_ready()
        handle = await start(client, task_queue, spec, "pgkill")
        seen = 0
        for kill in range(3):
            def progressed(floor: int = seen) -> int | None:
                cp = _checkpoint(pg, src, "in/big.csv")
                return cp["next_record"] if cp and cp["next_record"] > floor + 300 else None

            seen = await wait_for(progressed, 90, f"rows committed past {seen} (kill {kill + 1})")
            assert seen < rows, "the kill must land mid-file"
            procs[-1].kill()
            # Every committed row is in the table, once; nothing beyond the committed checkpoint.
            committed = _checkpoint(pg, src, "in/big.csv")
            assert committed is not None
            assert _ids(pg, table) == list(range(committed["next_record"]))
            procs.append(worker_process(task_queue, tmp_path, f"w{kill + 1}", **env))
            procs[-1].wait_ready()
        started = time.monotonic()
        result = await handle.result()
        assert result.status == "succeeded", result
        assert time.monotonic() - started < 120
    finally:
        for proc in procs:
            proc.stop()
    assert _ids(pg, table) == list(range(rows))
    entry = report(s3, out, "o/")["files"][0]
    assert entry["records_written"] == rows and entry["attempts"] >= 4
    assert entry["resumed_from_record"] > 0


def _table_books(pg: PostgresServer, table: str) -> tuple[int, int, int]:
    """Rows, distinct ids and the highest id + 1 of ``table`` (all three equal: ids 0..n-1, each once)."""
    query = f"SELECT count(*), count(DISTINCT id), coalesce(max(id) + 1, 0) FROM public.{table}"
    [(n, distinct, top)] = pg.execute(query)
    return int(n), int(distinct), int(top)  # type: ignore[call-overload]


@pytest.mark.slow
async def test_exactly_once_through_the_fast_csv_copy_written_behind_across_sigkills(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, tmp_path: Path, pg: PostgresServer,
    table: str,
) -> None:
    """The benchmark's path: ``passthrough`` of a big CSV into a table, the fast CSV path giving each chunk's rows
    to a CSV ``COPY``, its transaction running while the next chunk is read. Killed twice at full speed (a
    transaction is then most likely in flight): every row once, each kill leaving exactly the rows of the
    checkpoint the database committed."""
    src, out = buckets
    rows = 300_000
    body = make_csv(rows)
    assert len(body) >= file_setup.BEHIND_MIN_BYTES
    s3.put_object(Bucket=src, Key="in/big.csv", Body=body)
    env = {"S3BATCH_POSTGRES_TEST_DSN": pg.dsn}
    spec = _job(src, out, table, handler="passthrough", chunk_records=2_000, heartbeat_timeout_seconds=4,
                max_attempts=20)
    procs: list[WorkerProcess] = []
    try:
        procs.append(worker_process(task_queue, tmp_path, "w0", **env))
        procs[-1].wait_ready()
        handle = await start(client, task_queue, spec, "pgkill-fast")
        seen = 0
        for kill in range(2):
            def progressed(floor: int = seen) -> int | None:
                cp = _checkpoint(pg, src, "in/big.csv")
                return cp["next_record"] if cp and cp["next_record"] > floor + 20_000 else None

            seen = await wait_for(progressed, 90, f"rows committed past {seen} (kill {kill + 1})", interval=0.01)
            procs[-1].kill()
            committed = _checkpoint(pg, src, "in/big.csv")
            assert committed is not None and committed["next_record"] < rows, "the kill must land mid-file"
            n = committed["next_record"]
            assert _table_books(pg, table) == (n, n, n), f"kill {kill + 1}: the table is not the committed rows"
            procs.append(worker_process(task_queue, tmp_path, f"w{kill + 1}", **env))
            procs[-1].wait_ready()
        result = await handle.result()
        assert result.status == "succeeded", result
        log = "".join(p.log() for p in procs)
    finally:
        for proc in procs:
            proc.stop()
    assert _table_books(pg, table) == (rows, rows, rows)
    assert re.search(r"\(([1-9]\d{4,}) records read by the fast path\)", log), "the fast CSV path was not taken"
    entry = report(s3, out, "o/")["files"][0]
    assert entry["records_written"] == rows and entry["attempts"] >= 3 and entry["resumed_from_record"] > 0


async def test_json_values_map_to_columns_exactly(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, pg: PostgresServer, pg_worker: Worker,
) -> None:
    src, out = buckets
    name = f"docs_{uuid.uuid4().hex[:8]}"
    pg.execute(f"CREATE TABLE public.{name} (id bigint, amount numeric, meta jsonb, tags jsonb, ok boolean, note text)")
    lines = [
        '{"id": 1, "amount": 123456789012345678901234567890.000000001, "meta": {"a": [1, 2]}, "tags": ["x"], '
        '"ok": true}',
        '{"id": 2, "amount": 0.1, "meta": null, "tags": [], "ok": false, "note": "n"}',
    ]
    s3.put_object(Bucket=src, Key="in/d.jsonl", Body=("\n".join(lines) + "\n").encode())
    assert (await execute(client, task_queue, _job(src, out, name))).status == "succeeded"
    rows = pg.execute(f"SELECT id, amount::text, meta::text, tags::text, ok, note FROM public.{name} ORDER BY id")
    assert rows == [
        (1, "123456789012345678901234567890.000000001", '{"a": [1, 2]}', '["x"]', True, None),
        (2, "0.1", None, "[]", False, "n"),
    ]


def test_a_second_attempt_of_a_file_cannot_commit_a_chunk_twice(
    s3: Any, buckets: tuple[str, str], pg: PostgresServer, table: str
) -> None:
    """A zombie: two attempts of the same file (a worker presumed dead still running), both at chunk 0, then both
    at the same checkpoint past it."""
    src, out = buckets
    pools = PostgresPools(Settings.explicit(postgres_dsns={"test": pg.dsn}))
    spec = PostgresSink(type="postgres", connection="test", table=table)

    def attempt(etag: str = "e1") -> PostgresOutput:
        folder = FileOutput(
            s3, bucket=out, output_prefix="o/", key="in/a.csv", etag=etag, fingerprint="f", secret=None,
            put_params={}, log_extra={},
        )
        return PostgresOutput(spec, folder, pools, job_id="j", bucket=src, where=f"s3://{src}/in/a.csv")

    try:
        first, zombie = attempt(), attempt()
        start = Checkpoint(etag="e1", fingerprint="f")
        assert first.resume_point(None, start, fresh=False) == start
        new = start.model_copy(update={"chunk": 1, "next_record": 2, "records_written": 2, "line": 4})
        rows = [encode_json({"id": i, "name": "n"}) for i in range(2)]
        assert first.commit(start, new, list(rows), [], [2, 3]) == new
        with pytest.raises(SinkError, match="another attempt committed it"):
            zombie.commit(start, new, list(rows), [], [2, 3])
        assert _ids(pg, table) == [0, 1]
        assert zombie.resume_point(None, start, fresh=False) == new  # it resumes from the database's checkpoint
        # Past the first chunk: both attempts at the same checkpoint (the same chunk read the same way), each
        # advancing it by one conditional UPDATE; the second to commit finds it moved on and writes nothing.
        after = new.model_copy(update={"chunk": 2, "next_record": 4, "records_written": 4, "line": 6})
        more = [encode_json({"id": i, "name": "n"}) for i in range(2, 4)]
        assert first.commit(new, after, list(more), [], [4, 5]) == after
        with pytest.raises(SinkError, match="is at chunk 2, not at chunk 1"):
            zombie.commit(new, after, list(more), [], [4, 5])
        assert _ids(pg, table) == [0, 1, 2, 3]
        # Written beside the chunk before (``after``: a big file's chunks two at once), the late attempt's rows
        # are copied first (other ids here, so the table's key does not refuse them), but the checkpoint is not
        # where its chunk starts: rolled back, then refused as above.
        other = [encode_json({"id": i, "name": "z"}) for i in (20, 21)]
        with pytest.raises(SinkError, match="is at chunk 2, not at chunk 1"):
            zombie.commit(new, after, other, [], [4, 5], after=lambda: True)
        assert _ids(pg, table) == [0, 1, 2, 3]
        assert _checkpoint(pg, src, "in/a.csv") == json.loads(after.model_dump_json())
        # A changed source (another ETag) in insert mode is refused, at its start and in its first chunk's
        # transaction: its rows would be added to the old version's (tests/test_sink_postgres_reimport.py).
        changed = attempt("e2")
        fresh = Checkpoint(etag="e2", fingerprint="f")
        with pytest.raises(SinkInvalid, match="imported by job j from version ETag e1"):
            changed.resume_point(None, fresh, fresh=False)
        later = [encode_json({"id": i, "name": "v2"}) for i in range(10, 12)]
        with pytest.raises(SinkInvalid, match="Nothing was written"):
            changed.commit(fresh, fresh.model_copy(update={"chunk": 1, "next_record": 2}), later, [], [2, 3])
        assert _ids(pg, table) == [0, 1, 2, 3]
    finally:
        pools.close()


async def test_rows_exactly_once_across_a_database_restart_mid_job(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, pg: PostgresServer, table: str,
    pg_worker: Worker,
) -> None:
    src, out = buckets
    rows = 3_000
    s3.put_object(Bucket=src, Key="in/r.csv", Body=make_csv(rows))
    spec = _job(src, out, table, handler="slow_passthrough", heartbeat_timeout_seconds=10)
    handle = await start(client, task_queue, spec, "pgrestart")

    def progressed() -> bool:
        cp = _checkpoint(pg, src, "in/r.csv")
        return cp is not None and 500 <= cp["next_record"] < rows

    await wait_for(progressed, 60, "rows committed mid-file")
    pg.restart()  # immediate shutdown: the pool's connections die mid-use
    result = await handle.result()
    assert result.status == "succeeded"
    assert _ids(pg, table) == list(range(rows))
    entry = report(s3, out, "o/")["files"][0]
    assert entry["records_written"] == rows and entry["attempts"] >= 2, entry


@pytest.mark.slow
async def test_exactly_once_into_the_table_across_a_sigterm_hand_off(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, tmp_path: Path, pg: PostgresServer,
    table: str,
) -> None:
    src, out = buckets
    rows = 4_000
    s3.put_object(Bucket=src, Key="in/big.csv", Body=make_csv(rows))
    # 40 chunks of 0.2 s: a file of 8 s, so the moment to stop it is not missed on a loaded machine.
    env = {"S3BATCH_POSTGRES_TEST_DSN": pg.dsn, "S3BATCH_TEST_HANDLER_DELAY": "0.2"}
    spec = _job(src, out, table, handler="slow_passthrough", heartbeat_timeout_seconds=30)
    # Both workers poll before the job starts (a worker started later may find the file done).
    procs = [worker_process(task_queue, tmp_path, name, **env) for name in ("a", "b")]
    try:
        for proc in procs:
            proc.wait_ready()
        handle = await start(client, task_queue, spec, "pgterm")

        def mid_file() -> bool:
            cp = _checkpoint(pg, src, "in/big.csv")
            return cp is not None and 500 <= cp["next_record"] < rows - 1_000

        await wait_for(mid_file, 60, "rows committed mid-file", alive=procs)
        [pending] = (await handle.describe()).raw_description.pending_activities
        [running] = [p for p in procs if pending.last_worker_identity.startswith(f"{p.proc.pid}@")]
        running.proc.send_signal(15)
        assert running.proc.wait(30) == 0, running.log()
        started = time.monotonic()
        assert (await handle.result()).status == "succeeded"
        # Handed over at a chunk boundary, not after the 30 s heartbeat timeout.
        assert time.monotonic() - started < 25
    finally:
        for proc in procs:
            proc.stop()
    assert _ids(pg, table) == list(range(rows))
    entry = report(s3, out, "o/")["files"][0]
    assert entry["attempts"] >= 2 and entry["resumed_from_record"] > 0


def test_fast_csv_copy_leaves_the_rows_and_rejects_of_the_exact_path(
    s3: Any, buckets: tuple[str, str], pg: PostgresServer, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``passthrough`` into a table in insert mode: the fast path gives the database the file's own CSV
    rows (one CSV ``COPY`` a chunk). Against the exact path on the same file: the same rows in the table
    (an unquoted empty field is NULL either way), the same rejects (the parser's, and the rows
    the database refuses, found by reading the CSV back) and the same counts; also with each chunk's
    transaction written behind (while the next chunk is read), where every 1,000th row is refused."""
    src, out = buckets
    s3.put_object(Bucket=src, Key="in/messy.csv", Body=messy_csv(12_000, bad_amounts=True))
    head = s3.head_object(Bucket=src, Key="in/messy.csv")
    obj = ObjectRef(key="in/messy.csv", etag=head["ETag"].strip('"'), size=head["ContentLength"])
    tables = {}
    for fast, behind in ((False, False), (True, False), (True, True)):
        monkeypatch.setattr(file_setup, "BEHIND_MIN_BYTES", 0 if behind else 1 << 40)
        name = f"messy_{'fast' if fast else 'exact'}_{uuid.uuid4().hex[:6]}"
        pg.execute(f"CREATE TABLE public.{name} (id integer, email text, name text NOT NULL, amount numeric)")
        req = ProcessFileInput(
            job_id=f"job-{name}", bucket=src, obj=obj, output_bucket=out, output_prefix=f"{name}/",
            handler="passthrough", format="auto", max_record_bytes=1 << 20, chunk_records=1_000,
            sink=PostgresSink(type="postgres", connection="test", table=name),
        )
        settings = Settings.explicit(postgres_dsns={"test": pg.dsn}, csv_fast_path=fast)
        caplog.clear()
        with caplog.at_level(logging.INFO):
            result = ActivityEnvironment().run(S3Activities(s3, settings).process_file, req)
        read_fast = [int(n) for n in re.findall(r"\((\d+) records read by the fast path\)", caplog.text)]
        assert read_fast and (read_fast[0] > 10_000 if fast else read_fast[0] == 0), read_fast
        listed = s3.list_objects_v2(Bucket=out, Prefix=f"{name}/").get("Contents", [])
        bodies = {o["Key"].rsplit("/", 1)[1]: s3.get_object(Bucket=out, Key=o["Key"])["Body"].read() for o in listed}
        rejects = {k: v.replace(name.encode(), b"T") for k, v in bodies.items()}  # the reasons name the table
        rows = pg.execute(f"SELECT id, email, name, amount::text FROM public.{name} ORDER BY id, email")
        tables[fast, behind] = (
            result.model_dump(include={"records", "records_written", "rejected", "chunks"}), rejects, rows
        )
    assert tables[True, False] == tables[False, False]
    assert tables[True, True] == tables[False, False]
    counts, rejects, rows = tables[True, True]
    assert counts["rejected"] >= 12 + 3  # 12 amounts the database refuses, the damaged rows the parser rejects
    assert len(rows) == counts["records_written"] and counts["records_written"] > 11_000
    assert all(name for _, _, name, _ in rows)


def test_a_chunks_json_rows_join_its_csv_copy_with_the_values_of_the_json_path(
    s3: Any, buckets: tuple[str, str], pg: PostgresServer
) -> None:
    """A chunk of the CSV route also holds outputs of the JSON path (its first record, read alone): written in
    the same CSV ``COPY`` (each field quoted, with the rows' own line end) when they are strings of exactly the
    CSV's columns, they land as the JSON path writes them (quotes, delimiters, line breaks, '' not NULL);
    others (a None, another column) keep their own ``COPY``. The checkpoint advances in the same transaction
    (one statement, where it is exactly where the chunk started)."""
    src, out = buckets
    name = f"mixed_{uuid.uuid4().hex[:8]}"
    pg.execute(f"CREATE TABLE public.{name} (id integer PRIMARY KEY, name text, note text)")
    pools = PostgresPools(Settings.explicit(postgres_dsns={"test": pg.dsn}))
    spec = PostgresSink(type="postgres", connection="test", table=name)
    folder = FileOutput(
        s3, bucket=out, output_prefix="o/", key="in/m.csv", etag="e1", fingerprint="f", secret=None,
        put_params={}, log_extra={},
    )
    sink = PostgresOutput(spec, folder, pools, job_id="j", bucket=src, where=f"s3://{src}/in/m.csv")
    tricky = ['q"uo,te', "two\r\nlines", "", "back\\slash", "\\.", "é漢"]
    try:
        cp = Checkpoint(etag="e1", fingerprint="f")
        for chunk, first in enumerate([
            {"id": "0", "name": tricky[0], "note": tricky[1]},  # joins the CSV COPY
            {"id": "10", "name": None, "note": tricky[2]},  # a None (NULL): its own COPY
            {"id": "20", "name": tricky[3], "note": tricky[4]},
            {"id": "30", "name": tricky[5], "note": tricky[2]},
        ]):
            rows = CsvRows(["id", "name", "note"], ",", '"')
            base = 10 * chunk
            rows.add([f'{base + 1},"a, {chunk}",\r\n{base + 2},b,x\r\n'.encode()])
            rows.lines += [3, 4]
            new = cp.model_copy(update={"chunk": chunk + 1, "next_record": cp.next_record + 3,
                                        "records_written": cp.records_written + 3})
            assert (rows.encode([first]) is None) == (first["name"] is None)
            cp = sink.commit(cp, new, [encode_json(first)], [], [2], csv=rows)
            assert cp == new and _checkpoint(pg, src, "in/m.csv") == json.loads(new.model_dump_json())
        got = pg.execute(f"SELECT id, name, note FROM public.{name} WHERE id %% 10 = 0 ORDER BY id", ())
        assert got == [(0, tricky[0], tricky[1]), (10, None, ""), (20, tricky[3], tricky[4]), (30, tricky[5], "")]
        assert pg.execute(f"SELECT count(*), count(name) FROM public.{name}") == [(12, 11)]
        assert pg.execute(f"SELECT note FROM public.{name} WHERE id = 1") == [("",)]  # unquoted empty: '', never NULL
    finally:
        pools.close()


def test_csv_rows_encode_only_strings_of_exactly_their_columns() -> None:
    rows = CsvRows(["a", "b"], ";", "'")
    rows.add([b"1;x\r\n"])
    assert rows.line_end == b"\r\n"
    assert rows.encode([{"b": "it's", "a": "p;q\n"}]) == b"'p;q\n';'it''s'\r\n"
    assert rows.encode([{"a": "1"}]) is None  # a column missing: NULL in the JSON path
    assert rows.encode([{"a": "1", "b": "2", "c": "3"}]) is None  # another column
    assert rows.encode([{"a": 1, "b": "2"}]) is None  # not a string
    assert rows.encode([]) is None
    rows.add([b"2;last"])  # the object's last row, without a line end: it gets the rows' own
    assert rows.pieces[-1] == b"2;last\r\n"


def test_fill_cancelled_reads_a_tables_committed_checkpoint_from_the_database(
    s3: Any, buckets: tuple[str, str], pg: PostgresServer, table: str
) -> None:
    """The report writer's fill of a file cancelled between attempts (it reported zeros): for a table, the
    file's checkpoint row (there are no parts to read), of this version only, and no other file's."""
    src, out = buckets
    pools = PostgresPools(Settings.explicit(postgres_dsns={"test": pg.dsn}))
    spec = PostgresSink(type="postgres", connection="test", table=table)
    folder = FileOutput(
        s3, bucket=out, output_prefix="o/", key="in/a.csv", etag="e1", fingerprint="f", secret=None,
        put_params={}, log_extra={},
    )
    sink = PostgresOutput(spec, folder, pools, job_id="j", bucket=src, where=f"s3://{src}/in/a.csv")
    try:
        cp = Checkpoint(etag="e1", fingerprint="f")
        for chunk in range(2):
            new = cp.model_copy(update={"chunk": chunk + 1, "next_record": cp.next_record + 3, "records_written":
                                        cp.records_written + 2, "rejected": cp.rejected + 1})
            rows = [encode_json({"id": 10 * chunk + i, "name": "n"}) for i in range(2)]
            cp = sink.commit(cp, new, rows, [(5, b'{"line": 5}')], [2, 3])
        files = [
            FileResult(key="in/a.csv", etag="e1", status="cancelled"),
            FileResult(key="in/a.csv", etag="e2", status="cancelled"),  # another version: its counts are not these
            FileResult(key="in/b.csv", etag="e1", status="cancelled"),  # nothing committed
            FileResult(key="in/c.csv", etag="e3", status="succeeded", records=7, records_written=7, chunks=1),
        ]
        totals = Totals(records=7, records_written=7)
        filled, after = fill_cancelled(s3, out, "o/", files, totals, None, sink=spec, pools=pools, source_bucket=src)
        counts = [(f.records, f.records_written, f.rejected, f.chunks) for f in filled]
        assert counts == [(6, 4, 2, 2), (0, 0, 0, 0), (0, 0, 0, 0), (7, 7, 0, 1)]
        assert (after.records, after.records_written, after.rejected) == (13, 11, 2)
        # A manifest job (no bucket of its own) finds the file's row in whichever bucket holds it.
        filled, _ = fill_cancelled(s3, out, "o/", files[:1], Totals(), None, sink=spec, pools=pools)
        assert filled[0].records_written == 4
        # Another source bucket's file of the same key is not this one.
        filled, _ = fill_cancelled(s3, out, "o/", files[:1], Totals(), None, sink=spec, pools=pools,
                                   source_bucket=out)
        assert filled[0].records_written == 0
    finally:
        pools.close()


async def test_a_file_cancelled_in_retry_backoff_reports_the_rows_its_table_holds(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, pg: PostgresServer, table: str,
    pg_worker: Worker,
) -> None:
    """A file that committed 5 chunks into the table, then fails (retryable) on every attempt, cancelled while
    it waits for its next attempt (the workflow learns nothing from it): the report says what the table holds,
    read from the database's checkpoint, and the table holds exactly those rows."""
    src, out = buckets
    key = "in/boom.csv"
    body = make_csv(1_000).replace(b'550,"name, 550"', b'550,"BOOM"')  # chunk 5 fails until the handler is fixed
    s3.put_object(Bucket=src, Key=key, Body=body)
    spec = _job(src, out, table, handler="explode_until_fixed", max_attempts=10, group_max_files=1)
    handle = await start(client, task_queue, spec, "pg-cancel-backoff")

    async def in_backoff() -> bool:
        pending = (await handle.describe()).raw_description.pending_activities
        return (
            bool(pending)
            and pending[0].attempt >= 3
            and pending[0].state == PendingActivityState.PENDING_ACTIVITY_STATE_SCHEDULED
        )

    await wait_for(in_backoff, 60, "the file's third attempt waiting in retry backoff")
    await handle.cancel()
    with pytest.raises(WorkflowFailureError):
        await handle.result()
    assert _ids(pg, table) == list(range(500))
    rep = report(s3, out, "o/")
    (f,) = rep["files"]
    assert (f["status"], f["chunks"], f["records"], f["records_written"]) == ("cancelled", 5, 500, 500), f
    assert (rep["totals"]["records"], rep["totals"]["records_written"]) == (500, 500), rep["totals"]


async def test_a_file_over_its_reject_limit_reports_every_chunk_its_table_holds(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, pg: PostgresServer, table: str,
    pg_worker: Worker, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Written behind with two transactions in flight, a file found over max_rejected_records after its first
    chunk has its second chunk committed too: the failure (and the report) counts both, as the table holds."""
    monkeypatch.setattr(file_setup, "BEHIND_MIN_BYTES", 0)
    src, out = buckets
    lines = ["id,name,note"] + [f"{i},n{i},x" for i in range(600)]
    for i in (3, 5, 7):
        lines[1 + i] = f"{i},too,many,columns"  # parser rejects in chunk 0: over the limit of 2
    s3.put_object(Bucket=src, Key="in/r.csv", Body=("\n".join(lines) + "\n").encode())
    with pytest.raises(WorkflowFailureError):
        await execute(client, task_queue, _job(src, out, table, max_rejected_records=2), "pg-limit")
    entry = report(s3, out, "o/")["files"][0]
    assert entry["status"] == "failed" and "TooManyRejects" in entry["error"]
    held = len(_ids(pg, table))
    cp = _checkpoint(pg, src, "in/r.csv")
    assert cp is not None and held == cp["records_written"] and cp["chunk"] >= 2
    assert (entry["records_written"], entry["chunks"]) == (held, cp["chunk"])


def _file_sink(s3: Any, buckets: tuple[str, str], pools: PostgresPools, table: str, key: str) -> PostgresOutput:
    src, out = buckets
    folder = FileOutput(
        s3, bucket=out, output_prefix="o/", key=key, etag="e1", fingerprint="f", secret=None, put_params={},
        log_extra={},
    )
    spec = PostgresSink(type="postgres", connection="test", table=table)
    return PostgresOutput(spec, folder, pools, job_id="j", bucket=src, where=f"s3://{src}/{key}")


def _poll(predicate: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _advisory_waiters(pg: PostgresServer) -> int:
    [(n,)] = pg.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
    return int(n)  # type: ignore[call-overload]


def _copied(pg: PostgresServer) -> int:
    """The rows a running ``COPY`` has taken so far (0 when none runs). ``COPY`` buffers small rows and writes them to
    the table (and its unique index) 1,000 at a time: past 2,000, the first 1,000 are surely in the index, where
    another transaction's insert of the same key waits for this one (before, it may find no such key at all)."""
    found = pg.execute("SELECT coalesce(max(tuples_processed), 0) FROM pg_stat_progress_copy")
    return int(found[0][0])  # type: ignore[call-overload]


def _deadlocks(pg: PostgresServer) -> int:
    [(n,)] = pg.execute("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
    return int(n)  # type: ignore[call-overload]


@pytest.mark.parametrize("victim", ["later", "earlier"])
def test_two_chunks_written_at_once_with_a_key_in_both_commit_in_order_and_once(
    s3: Any, buckets: tuple[str, str], pg: PostgresServer, table: str, victim: str
) -> None:
    """Chunks 1 and 2 of a file written at once on two connections (``_commit_alongside``), both holding id 7,
    the later chunk's row of it in the table first: the two transactions deadlock (chunk 1 holds the
    checkpoint row and waits for chunk 2's uncommitted id 7; chunk 2 waits, in the database, for chunk 1 to
    end). The database rolls one back (the one that waited first: chunk 2, or, when chunk 2 has many more rows
    to write after id 7, chunk 1) and the chunks still commit in order, each once: id 7 from chunk 1, chunk
    2's row of it a reject (duplicate key), the checkpoint where chunk 2 left it.

    The sessions wait for locks and statements 120 s, not 10 and 20: on a loaded machine chunk 2's 40,000 rows
    took longer than that, and a lock timeout, not the database's deadlock detector, ended a wait (the same
    outcome, but not the interleaving this test pins; found in a quiet CI run)."""
    patient = PostgresConnection(lock_timeout_seconds=120, statement_timeout_seconds=120)
    pools = PostgresPools(Settings.explicit(postgres_dsns={"test": pg.dsn}, postgres_connections={"test": patient}))
    blocker = psycopg.connect(pg.dsn)
    try:
        sink = _file_sink(s3, buckets, pools, table, "in/d.csv")
        start = Checkpoint(etag="e1", fingerprint="f")
        c1 = start.model_copy(update={"chunk": 1, "next_record": 2, "records_written": 2, "line": 4})
        assert sink.commit(start, c1, [encode_json({"id": i, "name": "a"}) for i in (0, 1)], [], [2, 3]) == c1
        first = [encode_json({"id": i, "name": "a"}) for i in range(2, 8)]  # lines 4-9
        more = list(range(1_000, 41_000)) if victim == "earlier" else [8, 9]
        second = [encode_json({"id": i, "name": "b"}) for i in (7, *more)]  # lines 10-
        c2 = c1.model_copy(update={"chunk": 2, "next_record": 8, "records_written": 8, "line": 10})
        n = 8 + len(second)
        c3 = c2.model_copy(update={"chunk": 3, "next_record": n, "records_written": n, "line": 10 + len(second)})
        deadlocks = _deadlocks(pg)
        # Chunk 1's transaction waits for its turn, held here, until chunk 2 is writing its rows.
        blocker.execute("SELECT pg_advisory_xact_lock(%s, 1)", (sink.row._turns,))
        with ThreadPoolExecutor(2) as threads:
            earlier = threads.submit(sink.commit, c1, c2, list(first), [], list(range(4, 10)))
            _poll(lambda: _advisory_waiters(pg) == 1, 10)
            later = threads.submit(
                sink.commit, c2, c3, list(second), [], list(range(10, 10 + len(second))),
                after=lambda: concurrent.futures.wait([earlier]) and earlier.exception() is None,
            )
            if victim == "later":
                _poll(lambda: _advisory_waiters(pg) == 2, 10)  # chunk 2 copied, waits for chunk 1
            else:
                # chunk 2 has written id 7 (its first row) to the index and copies on, or has copied all
                _poll(lambda: _copied(pg) > 2_000 or _advisory_waiters(pg) == 2, 10)
            blocker.commit()
            assert earlier.result(timeout=60) == c2
            done = later.result(timeout=60)
        # The interleaving above did deadlock. A backend's counters reach pg_stat_database when it flushes
        # them (at most once a second, or 10 s after going idle: over the 10 s this waited on a loaded
        # machine), and at once when it exits: the pool's connections are closed first.
        pools.close()
        _poll(lambda: _deadlocks(pg) > deadlocks, 30)
        assert (done.records_written, done.rejected, done.chunk) == (n - 1, 1, 3)
        assert [r for r, _ in done.reject_reasons] == ["refused by PostgreSQL: UniqueViolation (SQLSTATE 23505)"]
        rows = pg.execute(f"SELECT id, name FROM public.{table} WHERE id < 1000 ORDER BY id")
        assert rows == [(i, "a") for i in range(8)] + ([] if more[0] >= 1000 else [(8, "b"), (9, "b")])
        assert pg.execute(f"SELECT count(*) FROM public.{table}") == [(n - 1,)]
        assert _checkpoint(pg, buckets[0], "in/d.csv") == json.loads(done.model_dump_json())
        body = s3.get_object(Bucket=buckets[1], Key="o/in/d.csv/rejects-00002.jsonl")["Body"].read()
        [reject] = [json.loads(line) for line in body.splitlines()]
        assert reject["line"] == 10 and reject["record"] == {"id": 7, "name": "b"}
    finally:
        blocker.close()
        pools.close()

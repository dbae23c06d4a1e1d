"""Re-importing a file into a PostgreSQL table (issue 29), against a real PostgreSQL server started for this
module (``s3batch.dev.postgres``) and jobs on a worker: never a row twice.

- the same version with the same options, or options that do not change the rows (``chunk_records``): the file
  is done (nothing written), or a half-done one resumes where it stopped;
- the same version with other options (another handler, another column mapping) or a new version, in
  ``insert`` mode: refused (``InvalidInput`` naming the table, the earlier job and version, what to do), nothing
  written; with ``"on_reimport": "replace"`` and ``"source_column"`` the file's earlier rows are deleted in
  the transaction of the new import's first chunk (a failure in that chunk leaves the old rows, a failure
  after it the new ones only);
- ``upsert``: a new version upserts over the old one.

The tables here have no unique key, as a plain fact table: a row written twice would be there twice.
Faults are a real trigger of the table (``RAISE`` for the ids listed in a table of faults): the chunk's
transaction fails as when the database goes away, and is retried.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from s3batch.activities.s3_activities import S3Activities
from s3batch.workflows.splits import split_count
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment
from temporalio.worker import Worker

from s3batch.checkpoint import Checkpoint
from s3batch.config import Settings
from s3batch.dev.postgres import PostgresServer, server_bindir
from s3batch.dev.stack import Stack
from s3batch.errors import SinkInvalid, describe_failure
from s3batch.file_output import FileOutput
from s3batch.handlers import record_handler
from s3batch.jsonvalues import encode_json
from s3batch.messages import JobState, ObjectRef, ProcessFileInput, SplitRange
from s3batch.models import S3BatchInput
from s3batch.plugin import S3BatchPlugin
from s3batch.s3io import make_client
from s3batch.sinks.postgres import PostgresOutput
from s3batch.sinks.postgres_pools import PostgresPools
from s3batch.sinks.spec import PostgresSink
from tests.helpers import wait_for
from tests.helpers.assertions import assert_invalid_input
from tests.helpers.jobs import new_id, start
from tests.helpers.output import report


@record_handler("reimport_upper")
def _upper(value: dict[str, Any]) -> dict[str, Any]:
    """The same columns as ``passthrough``, the name in capitals: another handler, other rows."""
    return {**value, "name": value["name"].upper()}


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
async def pg_worker(stack: Stack, pg: PostgresServer, task_queue: str) -> AsyncIterator[Worker]:
    """An in-process worker whose settings know connection ``test``."""
    plain = await Client.connect(stack.config.temporal_address)
    settings = Settings.explicit(postgres_dsns={"test": pg.dsn})
    plugin = S3BatchPlugin(make_client(), settings=settings, register_search_attributes=False)
    async with Worker(plain, task_queue=task_queue, plugins=[plugin], max_concurrent_activities=4) as w:
        yield w


@pytest.fixture
def table(pg: PostgresServer) -> str:
    """A fresh ``public.facts_<hex>`` (id, name, note, src) without a unique key, and a trigger that fails the
    insert of the ids listed in ``public.<table>_faults`` (a real error of the database, SQLSTATE P0001)."""
    name = f"facts_{uuid.uuid4().hex[:8]}"
    pg.execute(f"CREATE TABLE public.{name} (id integer NOT NULL, name text NOT NULL, note text, src text)")
    pg.execute(f"CREATE TABLE public.{name}_faults (id integer PRIMARY KEY)")
    pg.execute(
        f"CREATE FUNCTION public.{name}_fault() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        f"IF EXISTS (SELECT 1 FROM public.{name}_faults f WHERE f.id = NEW.id) THEN "
        "RAISE EXCEPTION 'injected fault'; END IF; RETURN NEW; END $$"
    )
    pg.execute(
        f"CREATE TRIGGER {name}_fault BEFORE INSERT ON public.{name} FOR EACH ROW "
        f"EXECUTE FUNCTION public.{name}_fault()"
    )
    return name


def _sink(table: str, **kw: Any) -> dict[str, Any]:
    return {"type": "postgres", "connection": "test", "table": f"public.{table}", **kw}


def _job(src: str, out: str, table: str, prefix: str = "o/", **kw: Any) -> S3BatchInput:
    sink = kw.pop("sink", _sink(table))
    options: dict[str, Any] = {"prefix": "in/", "output_bucket": out, "output_prefix": prefix, "chunk_records": 100}
    return S3BatchInput.model_validate({"bucket": src, "sink": sink, **options, **kw})


def _csv(version: str, ids: range, header: bool = True) -> bytes:
    lines = (["id,name,note"] if header else []) + [f"{i},{version}-{i},n{i}" for i in ids]
    return ("\n".join(lines) + "\n").encode()


def _rows(version: str, ids: range, src: str | None = None) -> list[tuple[Any, ...]]:
    return [(i, f"{version}-{i}", f"n{i}", src) for i in ids]


def _table(pg: PostgresServer, table: str) -> list[tuple[Any, ...]]:
    """Every row of the table, in order (a row written twice is there twice)."""
    return pg.execute(f"SELECT id, name, note, src FROM public.{table} ORDER BY id, name, src")  # type: ignore[return-value]


def _etag(s3: Any, bucket: str, key: str) -> str:
    return str(s3.head_object(Bucket=bucket, Key=key)["ETag"]).strip('"')


def _checkpoint(pg: PostgresServer, bucket: str, key: str) -> dict[str, Any] | None:
    rows = pg.execute(
        "SELECT checkpoint FROM public.s3batch_checkpoints WHERE source_bucket = %s AND source_key = %s", (bucket, key)
    )
    return rows[0][0] if rows else None  # type: ignore[return-value]


async def _run(client: Client, task_queue: str, spec: S3BatchInput, tag: str) -> WorkflowHandle[Any, Any]:
    """Start the job and wait for its end (failed or not); its handle."""
    handle = await start(client, task_queue, spec, tag)
    with contextlib.suppress(WorkflowFailureError):
        await handle.result()
    return handle


def _file_error(s3: Any, out: str, prefix: str, key: str) -> str:
    (entry,) = [f for f in report(s3, out, prefix)["files"] if f["key"] == key]
    assert entry["status"] == "failed", entry
    return str(entry["error"])


# ---------------------------------------------------------------- options that do not change the rows


async def test_a_done_file_imported_again_with_another_chunk_size_writes_nothing(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, pg: PostgresServer, table: str,
    pg_worker: Worker,
) -> None:
    """``chunk_records`` decides where a chunk ends, not which rows the table gets: a file done with chunks of
    100 is done for chunks of 30 (it was imported again, from chunk 0, and every row doubled)."""
    src, out = buckets
    s3.put_object(Bucket=src, Key="in/a.csv", Body=_csv("v1", range(250)))
    first = await _run(client, task_queue, _job(src, out, table), "pg-chunks")
    assert (await first.result()).status == "succeeded"
    again = await _run(client, task_queue, _job(src, out, table, "o2/", chunk_records=30), "pg-chunks")
    assert (await again.result()).status == "succeeded"
    assert _table(pg, table) == _rows("v1", range(250))


async def test_a_half_done_file_resumes_where_it_stopped_with_another_chunk_size(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, pg: PostgresServer, table: str,
    pg_worker: Worker,
) -> None:
    """A job fails the file after its first chunk (the database refuses chunk 2's transaction, one attempt only);
    a second job with chunks of 30 resumes at record 100, where the table's checkpoint is: a checkpoint of a
    table is a record and byte position, valid whatever the chunk size (it started again at record 0, and
    the first 100 rows doubled)."""
    src, out = buckets
    s3.put_object(Bucket=src, Key="in/a.csv", Body=_csv("v1", range(250)))
    pg.execute(f"INSERT INTO public.{table}_faults VALUES (150)")
    failed = await _run(client, task_queue, _job(src, out, table, max_attempts=1), "pg-half")
    assert "P0001" in _file_error(s3, out, "o/", "in/a.csv")
    assert _table(pg, table) == _rows("v1", range(100))
    cp = _checkpoint(pg, src, "in/a.csv")
    assert cp is not None and (cp["next_record"], cp["done"]) == (100, False)
    pg.execute(f"DELETE FROM public.{table}_faults")
    resumed = await _run(client, task_queue, _job(src, out, table, "o2/", chunk_records=30), "pg-half")
    assert (await resumed.result()).status == "succeeded", failed.id
    assert _table(pg, table) == _rows("v1", range(250))
    entry = report(s3, out, "o2/")["files"][0]
    assert entry["resumed_from_record"] == 100 and entry["records_written"] == 250


# ---------------------------------------------------------------- other options, another version: refused


@pytest.mark.parametrize(
    "other",
    [{"handler": "reimport_upper"}, {"header": ["id", "note", "name"]}],
    ids=["another-handler", "another-column-mapping"],
)
async def test_the_same_version_with_other_options_is_refused_and_writes_nothing(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, pg: PostgresServer, table: str,
    pg_worker: Worker, other: dict[str, Any],
) -> None:
    """Other rows from the same version (another handler; the columns mapped otherwise): in insert mode the file
    is refused, naming the table, the job and version of the earlier import and the ways out; the table is
    as the first job left it (they were added to it, every row a second time)."""
    src, out = buckets
    header = other.get("header") is None
    s3.put_object(Bucket=src, Key="in/a.csv", Body=_csv("v1", range(120), header=header))
    first_options = {"header": ["id", "name", "note"]} if not header else {}
    first = await _run(client, task_queue, _job(src, out, table, **first_options), "pg-other")
    assert (await first.result()).status == "succeeded"
    before = _table(pg, table)
    assert before == _rows("v1", range(120))
    second = await _run(client, task_queue, _job(src, out, table, "o2/", **other), "pg-other")
    with pytest.raises(WorkflowFailureError):
        await second.result()
    error = _file_error(s3, out, "o2/", "in/a.csv")
    etag = _etag(s3, src, "in/a.csv")
    assert error.startswith("InvalidInput"), error
    for part in (f"public.{table}", first.id, etag, "other options", '"on_reimport": "replace"', "upsert"):
        assert part in error, (part, error)
    assert _table(pg, table) == before


async def test_a_new_version_in_insert_mode_is_refused_naming_the_earlier_job_and_version(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, pg: PostgresServer, table: str,
    pg_worker: Worker,
) -> None:
    """The file rewritten (a new ETag), the same job options: refused, nothing written (its rows were added to
    the old version's). The other file of the job, already imported, is done as before."""
    src, out = buckets
    s3.put_object(Bucket=src, Key="in/a.csv", Body=_csv("v1", range(120)))
    s3.put_object(Bucket=src, Key="in/b.csv", Body=_csv("b", range(1_000, 1_010)))
    first = await _run(client, task_queue, _job(src, out, table), "pg-newver")
    assert (await first.result()).status == "succeeded"
    old = _etag(s3, src, "in/a.csv")
    s3.put_object(Bucket=src, Key="in/a.csv", Body=_csv("v2", range(100, 220)))
    second = await _run(client, task_queue, _job(src, out, table, "o2/"), "pg-newver")
    with pytest.raises(WorkflowFailureError):
        await second.result()
    error = _file_error(s3, out, "o2/", "in/a.csv")
    assert error.startswith("InvalidInput"), error
    for part in (f"public.{table}", first.id, old, _etag(s3, src, "in/a.csv"), "Nothing was written"):
        assert part in error, (part, error)
    assert _table(pg, table) == _rows("v1", range(120)) + _rows("b", range(1_000, 1_010))
    assert [f["status"] for f in report(s3, out, "o2/")["files"] if f["key"] == "in/b.csv"] == ["succeeded"]


def test_a_second_import_with_other_options_cannot_commit_over_the_first_one(
    s3: Any, buckets: tuple[str, str], pg: PostgresServer, table: str
) -> None:
    """Two imports of one file with other options at once: both found nothing committed when they started; the
    first commits its first chunk, the other's first chunk is then refused in its transaction (where the
    checkpoint row is locked), and writes nothing."""
    src, out = buckets
    pools = PostgresPools(Settings.explicit(postgres_dsns={"test": pg.dsn}))
    spec = PostgresSink(type="postgres", connection="test", table=table)

    def attempt(fingerprint: str, job: str) -> PostgresOutput:
        folder = FileOutput(
            s3, bucket=out, output_prefix=f"{job}/", key="in/a.csv", etag="e1", fingerprint=fingerprint,
            secret=None, put_params={}, log_extra={},
        )
        return PostgresOutput(spec, folder, pools, job_id=job, bucket=src, where=f"s3://{src}/in/a.csv")

    try:
        one, other = attempt("f1", "job-one"), attempt("f2", "job-two")
        starts = [
            sink.resume_point(None, Checkpoint(etag="e1", fingerprint=f), fresh=False)
            for sink, f in ((one, "f1"), (other, "f2"))
        ]
        rows = [encode_json({"id": i, "name": "n"}) for i in range(3)]
        new = starts[0].model_copy(update={"chunk": 1, "next_record": 3, "records_written": 3, "done": True})
        assert one.commit(starts[0], new, list(rows), [], [2, 3, 4]) == new
        late = starts[1].model_copy(update={"chunk": 1, "next_record": 3, "records_written": 3, "done": True})
        with pytest.raises(SinkInvalid, match="job-one"):
            other.commit(starts[1], late, list(rows), [], [2, 3, 4])
        assert _table(pg, table) == [(i, "n", None, None) for i in range(3)]
        assert _checkpoint(pg, src, "in/a.csv") == json.loads(new.model_dump_json())
    finally:
        pools.close()


# ---------------------------------------------------------------- on_reimport: replace


async def test_a_new_version_replaces_exactly_the_files_earlier_rows(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, pg: PostgresServer, table: str,
    pg_worker: Worker,
) -> None:
    """``"on_reimport": "replace"``: each row carries its file's identity (``s3://bucket/key#etag``) in
    ``source_column``; a new version deletes the file's earlier rows and imports its own. Exactly that
    file's: not those of keys a LIKE pattern of its key would match (``_`` and ``%`` in it), nor of a key that
    begins with its key and ``#``."""
    src, out = buckets
    key = "in/a_b%.csv"
    neighbours = {"in/aXbYZ.csv": ("n1", range(1_000, 1_005)), "in/a_b%.csv#2.csv": ("n2", range(2_000, 2_005))}
    s3.put_object(Bucket=src, Key=key, Body=_csv("v1", range(250)))
    for name, (version, ids) in neighbours.items():
        s3.put_object(Bucket=src, Key=name, Body=_csv(version, ids))
    sink = _sink(table, on_reimport="replace", source_column="src")
    first = await _run(client, task_queue, _job(src, out, table, sink=sink), "pg-replace")
    assert (await first.result()).status == "succeeded"
    old = _etag(s3, src, key)
    others = [
        row
        for name, (version, ids) in neighbours.items()
        for row in _rows(version, ids, f"s3://{src}/{name}#{_etag(s3, src, name)}")
    ]
    assert _table(pg, table) == sorted(_rows("v1", range(250), f"s3://{src}/{key}#{old}") + others)
    s3.put_object(Bucket=src, Key=key, Body=_csv("v2", range(100, 260)))  # fewer rows, some ids the same
    new = _etag(s3, src, key)
    second = await _run(client, task_queue, _job(src, out, table, "o2/", sink=sink), "pg-replace")
    assert (await second.result()).status == "succeeded"
    assert _table(pg, table) == sorted(_rows("v2", range(100, 260), f"s3://{src}/{key}#{new}") + others)
    # The same version again: done, nothing deleted or written.
    third = await _run(client, task_queue, _job(src, out, table, "o3/", sink=sink), "pg-replace")
    assert (await third.result()).status == "succeeded"
    assert _table(pg, table) == sorted(_rows("v2", range(100, 260), f"s3://{src}/{key}#{new}") + others)


async def test_the_replacing_import_deletes_the_old_rows_with_its_first_chunk(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, pg: PostgresServer, table: str,
    pg_worker: Worker,
) -> None:
    """The new version's first chunk fails (its transaction rolled back): the table still holds exactly the old
    version. Then its third chunk fails, after two committed: the table holds exactly the new version's first
    200 rows, none of the old. Then it completes: exactly the new version, once."""
    src, out = buckets
    key = "in/a.csv"
    sink = _sink(table, on_reimport="replace", source_column="src")
    s3.put_object(Bucket=src, Key=key, Body=_csv("v1", range(250)))
    first = await _run(client, task_queue, _job(src, out, table, sink=sink), "pg-replace-crash")
    assert (await first.result()).status == "succeeded"
    old = _rows("v1", range(250), f"s3://{src}/{key}#{_etag(s3, src, key)}")
    assert _table(pg, table) == old
    s3.put_object(Bucket=src, Key=key, Body=_csv("v2", range(300)))
    etag = _etag(s3, src, key)
    new = _rows("v2", range(300), f"s3://{src}/{key}#{etag}")
    pg.execute(f"INSERT INTO public.{table}_faults VALUES (50)")  # in the first chunk
    handle = await start(client, task_queue, _job(src, out, table, "o2/", sink=sink, group_max_files=1), "pg-rc")

    async def failed_once() -> bool:
        pending = (await handle.describe()).raw_description.pending_activities
        return bool(pending) and pending[0].attempt >= 2 and "P0001" in pending[0].last_failure.message

    await wait_for(failed_once, 60, "the first chunk of the new version failed")
    assert _table(pg, table) == old
    pg.execute(f"DELETE FROM public.{table}_faults")
    pg.execute(f"INSERT INTO public.{table}_faults VALUES (250)")  # in the third chunk

    def two_chunks() -> bool:
        cp = _checkpoint(pg, src, key)
        return cp is not None and cp["etag"] == etag and cp["next_record"] == 200

    await wait_for(two_chunks, 60, "two chunks of the new version committed")
    assert _table(pg, table) == new[:200]
    pg.execute(f"DELETE FROM public.{table}_faults")
    assert (await handle.result()).status == "succeeded"
    assert _table(pg, table) == new


async def test_replace_is_refused_where_it_cannot_work(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, pg: PostgresServer, table: str,
    pg_worker: Worker,
) -> None:
    """Refused when the job starts: ``replace`` without ``source_column`` (naming the field, before any
    activity), a ``source_column`` the table lacks or that is not text. Refused for the file: rows of an
    earlier import that did not mark them (no ``source_column``), which ``replace`` could not find."""
    src, out = buckets
    workflow_id = new_id("pg-replace-bad")
    raw = {"bucket": src, "output_bucket": out, "sink": _sink(table, on_reimport="replace")}
    await client.start_workflow("S3BatchWorkflow", raw, id=workflow_id, task_queue=task_queue)
    await assert_invalid_input(client, workflow_id, ["sink.postgres", "source_column"])
    s3.put_object(Bucket=src, Key="in/a.csv", Body=_csv("v1", range(20)))
    for column, words in (("origin", "has no column 'origin'"), ("id", "not a text column")):
        sink = _sink(table, on_reimport="replace", source_column=column)
        handle = await _run(client, task_queue, _job(src, out, table, f"bad-{column}/", sink=sink), "pg-replace-bad")
        with pytest.raises(WorkflowFailureError) as failure:
            await handle.result()
        message = describe_failure(failure.value)
        assert message.startswith("InvalidInput") and words in message, message
        assert "source_column" in message and f"public.{table}" in message, message
    assert _table(pg, table) == []
    # Imported without marking the rows; then a new version with replace: refused, the old rows stay.
    first = await _run(client, task_queue, _job(src, out, table), "pg-unmarked")
    assert (await first.result()).status == "succeeded"
    s3.put_object(Bucket=src, Key="in/a.csv", Body=_csv("v2", range(20)))
    sink = _sink(table, on_reimport="replace", source_column="src")
    second = await _run(client, task_queue, _job(src, out, table, "o2/", sink=sink), "pg-unmarked")
    with pytest.raises(WorkflowFailureError):
        await second.result()
    error = _file_error(s3, out, "o2/", "in/a.csv")
    assert error.startswith("InvalidInput") and "not marked" in error and first.id in error, error
    assert _table(pg, table) == _rows("v1", range(20))


def test_the_sink_spec_reads_and_writes_on_reimport_as_json() -> None:
    """The new fields are JSON (strict), and a sink without them is written as before (an older worker, whose
    sink refuses unknown fields, reads it), with the same fingerprint shape."""
    plain = PostgresSink.model_validate_json('{"type": "postgres", "connection": "w", "table": "t"}')
    assert plain.model_dump() == {"type": "postgres", "connection": "w", "table": "t", "mode": "insert", "key": None}
    assert plain.shape() == {"type": "postgres", "table": "public.t", "mode": "insert", "key": None}
    text = '{"type": "postgres", "connection": "w", "table": "t", "on_reimport": "replace", "source_column": "src"}'
    replacing = PostgresSink.model_validate_json(text)
    assert PostgresSink.model_validate_json(replacing.model_dump_json()) == replacing
    assert replacing.shape()["source_column"] == "src"  # the rows carry it: other rows than without
    assert "on_reimport" not in replacing.shape()  # what happens to earlier rows is not the rows written
    with pytest.raises(ValueError, match="source_column"):
        PostgresSink.model_validate({"type": "postgres", "connection": "w", "table": "t", "on_reimport": "replace"})
    with pytest.raises(ValueError, match="on_reimport"):
        PostgresSink.model_validate({"type": "postgres", "connection": "w", "table": "t", "on_reimport": "later"})


# ---------------------------------------------------------------- upsert


async def test_a_new_version_upserts_over_the_old_one(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, pg: PostgresServer, pg_worker: Worker,
) -> None:
    """``upsert``: a new version is written over the old one by key (no refusal); rows of the old version whose
    key the new one lacks stay."""
    src, out = buckets
    name = f"keyed_{uuid.uuid4().hex[:8]}"
    pg.execute(f"CREATE TABLE public.{name} (id integer PRIMARY KEY, name text NOT NULL, note text, src text)")
    sink = _sink(name, mode="upsert", key=["id"])
    s3.put_object(Bucket=src, Key="in/a.csv", Body=_csv("v1", range(150)))
    assert (await (await _run(client, task_queue, _job(src, out, name, sink=sink), "pg-up")).result()).status == (
        "succeeded"
    )
    s3.put_object(Bucket=src, Key="in/a.csv", Body=_csv("v2", range(100, 230)))
    second = await _run(client, task_queue, _job(src, out, name, "o2/", sink=sink, chunk_records=40), "pg-up")
    assert (await second.result()).status == "succeeded"
    assert _table(pg, name) == _rows("v1", range(100)) + _rows("v2", range(100, 230))


# ---------------------------------------------------------------- byte-range splits


def test_a_file_is_never_split_into_a_table_and_a_split_is_refused_before_writing(
    s3: Any, buckets: tuple[str, str], pg: PostgresServer, table: str
) -> None:
    """A table keeps one checkpoint row per file (target, bucket, key): two splits of a file would share it, each
    finding the other's checkpoint as another import's. The workflow never splits a file into a table, and a
    split asked of the activity anyway (an input written by hand) fails before anything is written."""
    src, out = buckets
    spec = _job(src, out, table, split_bytes=64 * 1024)
    obj = ObjectRef(key="in/big.csv", etag="e", size=10 * 1024 * 1024)
    assert split_count(spec, JobState(), obj, free=8) == 1
    s3.put_object(Bucket=src, Key="in/big.csv", Body=_csv("v1", range(20_000)))
    head = s3.head_object(Bucket=src, Key="in/big.csv")
    obj = ObjectRef(key="in/big.csv", etag=head["ETag"].strip('"'), size=head["ContentLength"])
    req = ProcessFileInput(
        job_id="job-split", bucket=src, obj=obj, output_bucket=out, output_prefix="o/", handler="passthrough",
        format="auto", max_record_bytes=1 << 20, chunk_records=1_000,
        sink=PostgresSink(type="postgres", connection="test", table=table),
        split=SplitRange(index=1, count=2, start=obj.size // 2, end=obj.size),
    )
    settings = Settings.explicit(postgres_dsns={"test": pg.dsn})
    with pytest.raises(ApplicationError, match="can be split") as failure:
        ActivityEnvironment().run(S3Activities(s3, settings).process_file, req)
    assert failure.value.type == "BadFile" and failure.value.non_retryable
    assert _table(pg, table) == []

"""The report of a file already imported (issue 29): a job over a file whose output an earlier job committed
whole, with the same options (the same table, or the same output folder), writes nothing, and its report says
so: 0 records written, and ``already_written`` (per file and in the totals) the rows the earlier job wrote.
A later attempt of the same job that finds the file done (its result was lost) still reports what the job
wrote. Through ``ActivityEnvironment`` and whole jobs on the real S3 server, Temporal dev server and
PostgreSQL, for the JSONL and Parquet parts and a table."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from s3batch.activities.s3_activities import S3Activities
from temporalio.client import Client
from temporalio.testing import ActivityEnvironment
from temporalio.worker import Worker

from s3batch import client as api
from s3batch.cli.render import print_report, totals_lines
from s3batch.config import Settings
from s3batch.dev.postgres import PostgresServer, server_bindir
from s3batch.dev.stack import Stack
from s3batch.messages import FileResult, ObjectRef, ProcessFileInput, Totals
from s3batch.models import S3BatchInput
from s3batch.plugin import S3BatchPlugin
from s3batch.s3io import make_client
from tests.helpers.data import make_csv
from tests.helpers.jobs import execute, new_id
from tests.helpers.output import report

ROWS = 250


def upload(s3: Any, bucket: str, key: str, body: bytes) -> ObjectRef:
    s3.put_object(Bucket=bucket, Key=key, Body=body)
    head = s3.head_object(Bucket=bucket, Key=key)
    return ObjectRef(key=key, etag=head["ETag"].strip('"'), size=len(body))


def file_input(buckets: tuple[str, str], obj: ObjectRef, job_id: str, **options: Any) -> ProcessFileInput:
    src, out = buckets
    return ProcessFileInput(
        job_id=job_id, bucket=src, obj=obj, output_bucket=out, output_prefix="o/", format="auto",
        handler="passthrough", chunk_records=100, max_record_bytes=1024 * 1024, **options,
    )  # fmt: skip


def attempt(s3: Any, req: ProcessFileInput, number: int = 1, settings: Settings | None = None) -> FileResult:
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, attempt=number, heartbeat_details=[])
    return env.run(S3Activities(s3, settings).process_file, req)


def counts(result: FileResult) -> tuple[int, int, int | None]:
    return result.records, result.records_written, result.already_written


SINKS = [None, {"type": "s3", "format": "parquet"}]


@pytest.mark.parametrize("sink", SINKS, ids=["jsonl", "parquet"])
def test_a_file_found_done_says_who_wrote_it(s3: Any, buckets: tuple[str, str], sink: dict[str, Any] | None) -> None:
    """Found done by a later attempt of the same job (its result lost): what the job wrote. Found done by
    another job (the same input again, a redrive): nothing written by that job, all of it already written."""
    obj = upload(s3, buckets[0], "in/a.csv", make_csv(ROWS))
    options = {} if sink is None else {"sink": sink}
    first = attempt(s3, file_input(buckets, obj, "job-1", **options))
    assert counts(first) == (ROWS, ROWS, None) and "already_written" not in first.model_dump()
    again = attempt(s3, file_input(buckets, obj, "job-1", **options), number=2)
    assert counts(again) == (ROWS, ROWS, None)
    other = attempt(s3, file_input(buckets, obj, "job-2", **options))
    assert other.status == "succeeded" and counts(other) == (ROWS, 0, ROWS)
    assert other.model_dump()["already_written"] == ROWS


async def test_the_same_job_again_reports_the_rows_already_written(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, worker: Worker,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The same input under a new ID reuses the committed output folder (docs/how-to/operate.md): its
    report says the records were already written, none by it."""
    src, out = buckets
    s3.put_object(Bucket=src, Key="in/a.csv", Body=make_csv(ROWS))
    s3.put_object(Bucket=src, Key="in/b.csv", Body=make_csv(10))
    spec = S3BatchInput(bucket=src, prefix="in/", output_bucket=out, output_prefix="o/", chunk_records=100)
    first = await execute(client, task_queue, spec, "reimport")
    assert (first.totals.records_written, first.totals.already_written) == (ROWS + 10, None)
    s3.put_object(Bucket=src, Key="in/b.csv", Body=make_csv(20))  # a new version: written again
    workflow_id = new_id("reimport")
    handle = await client.start_workflow("S3BatchWorkflow", spec, id=workflow_id, task_queue=task_queue)
    await handle.result()
    rep = report(s3, out, "o/")
    assert rep["job_id"] == workflow_id
    files = {f["key"]: f for f in rep["files"]}
    assert (files["in/a.csv"]["records_written"], files["in/a.csv"]["already_written"]) == (0, ROWS)
    assert (files["in/b.csv"]["records_written"], "already_written" in files["in/b.csv"]) == (20, False)
    assert (rep["totals"]["records_written"], rep["totals"]["already_written"]) == (20, ROWS)
    print_report(await api.report(client, workflow_id))
    shown = " ".join(capsys.readouterr().out.split())
    assert f"{ROWS + 20} read: 20 written, 0 rejected, {ROWS} already written by an earlier job" in shown, shown


def test_the_summary_says_written_rejected_and_already_written_side_by_side() -> None:
    plain = Totals(files_listed=1, files_succeeded=1, records=10, records_written=7, rejected=3)
    assert totals_lines(plain)[1].startswith("records  10 read: 7 written, 3 rejected; ")
    again = Totals(files_listed=1, files_succeeded=1, records=10, rejected=3, already_written=7)
    assert totals_lines(again)[1].startswith("records  10 read: 0 written, 3 rejected, 7 already written by an "
                                             "earlier job; ")  # fmt: skip


# ---------------------------------------------------------------------------------- PostgreSQL


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
    name = f"items_{uuid.uuid4().hex[:8]}"
    pg.execute(f"CREATE TABLE public.{name} (id integer PRIMARY KEY, name text NOT NULL, note text)")
    return name


@pytest.fixture
async def pg_worker(stack: Stack, pg: PostgresServer, task_queue: str) -> AsyncIterator[Worker]:
    plain = await Client.connect(stack.config.temporal_address)
    settings = Settings.explicit(postgres_dsns={"test": pg.dsn})
    plugin = S3BatchPlugin(make_client(), settings=settings, register_search_attributes=False)
    async with Worker(plain, task_queue=task_queue, plugins=[plugin], max_concurrent_activities=4) as w:
        yield w


def test_a_file_found_done_in_its_table_says_who_imported_it(
    s3: Any, buckets: tuple[str, str], pg: PostgresServer, table: str
) -> None:
    obj = upload(s3, buckets[0], "in/a.csv", make_csv(ROWS))
    settings = Settings.explicit(postgres_dsns={"test": pg.dsn})
    sink = {"type": "postgres", "connection": "test", "table": f"public.{table}"}
    first = attempt(s3, file_input(buckets, obj, "job-1", sink=sink), settings=settings)
    assert counts(first) == (ROWS, ROWS, None)
    again = attempt(s3, file_input(buckets, obj, "job-1", sink=sink), number=2, settings=settings)
    assert counts(again) == (ROWS, ROWS, None)
    other = attempt(s3, file_input(buckets, obj, "job-2", sink=sink), settings=settings)
    assert counts(other) == (ROWS, 0, ROWS)
    assert pg.execute(f"SELECT count(*) FROM public.{table}") == [(ROWS,)]


async def test_a_second_import_of_the_same_file_reports_0_written_already_imported(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, pg: PostgresServer, table: str,
    pg_worker: Worker, capsys: pytest.CaptureFixture[str],
) -> None:
    src, out = buckets
    s3.put_object(Bucket=src, Key="in/a.csv", Body=make_csv(ROWS))
    sink = {"type": "postgres", "connection": "test", "table": f"public.{table}"}
    options: dict[str, Any] = {"prefix": "in/", "output_bucket": out, "chunk_records": 100, "sink": sink}
    first = await execute(client, task_queue, S3BatchInput.model_validate({"bucket": src, **options}), "pg-once")
    assert (first.totals.records_written, first.totals.already_written) == (ROWS, None)
    spec = S3BatchInput.model_validate({"bucket": src, **options, "output_prefix": "o2/"})
    workflow_id = new_id("pg-again")
    handle = await client.start_workflow("S3BatchWorkflow", spec, id=workflow_id, task_queue=task_queue)
    result = await handle.result()
    assert result["status"] == "succeeded"
    assert (result["totals"]["records_written"], result["totals"]["already_written"]) == (0, ROWS)
    (entry,) = report(s3, out, "o2/")["files"]
    assert (entry["status"], entry["records"], entry["records_written"], entry["already_written"]) == (
        "succeeded", ROWS, 0, ROWS
    )
    assert pg.execute(f"SELECT count(*) FROM public.{table}") == [(ROWS,)]
    print_report(await api.report(client, workflow_id))
    shown = " ".join(capsys.readouterr().out.split())
    assert f"{ROWS} read: 0 written, 0 rejected, {ROWS} already written by an earlier job" in shown, shown
    assert "already imported" in shown, shown

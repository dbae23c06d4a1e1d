"""No silent all-rejected success (issue 29): by default a file of one or more records whose every record
was rejected (by the schema, by a handler's reject, or by the database) is a failed file
(``TooManyRejects``), saying which file, that all N records were rejected, the most common reasons and
what to do; a job whose reject limits allow it (``max_rejected_ratio: 1.0``, or a
``max_rejected_records`` the count is within) succeeds. A file of no records, and records a handler
drops, are not rejections. End to end through in-process workers on the real Temporal dev server, S3
server and PostgreSQL: JSONL parts, Parquet parts, a table, small files in a group, and a big file in
byte-range splits (judged in the workflow, on the sum of its splits)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import pytest
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker

from s3batch.config import Settings
from s3batch.dev.postgres import PostgresServer, server_bindir
from s3batch.dev.stack import Stack
from s3batch.formats.common import Record
from s3batch.handlers import HandlerResult, Reject, chunk_handler
from s3batch.models import S3BatchInput
from s3batch.plugin import S3BatchPlugin
from s3batch.rejects import FileLimits, crossed, too_many
from s3batch.s3io import make_client
from tests.helpers import run
from tests.helpers.data import make_csv
from tests.helpers.jobs import SLOW_HEARTBEAT_TIMEOUT, execute
from tests.helpers.output import list_keys, report

OUT = "o/"
HEADER = "customer_id,email,name,country,amount,created_at"
EMAIL_REASON = "email: String should match pattern '^[^@\\s]+@[^@\\s]+\\.[^@\\s]+$'"
ACCEPT_HINT = '"max_rejected_ratio": 1.0'


def customers_csv(rows: int, bad: Any = lambda i: True) -> bytes:
    """A customers CSV; rows where ``bad(i)`` have an email the ``customers`` schema rejects."""
    lines = [HEADER]
    for i in range(rows):
        email = f"not-an-email-{i}" if bad(i) else f"c{i}@example.com"
        lines.append(f"{i + 1},{email},Name {i},FR,1.00,2024-01-02T03:04:05Z")
    return ("\n".join(lines) + "\n").encode()


DROP_ALL = f"drop-all-{uuid.uuid4().hex[:6]}"
DROP_FIRST_REJECT_REST = f"drop-first-{uuid.uuid4().hex[:6]}"


@chunk_handler(DROP_ALL)
def _drop_all(records: Sequence[Record]) -> HandlerResult:
    return HandlerResult([], [], dropped=len(records))


@chunk_handler(DROP_FIRST_REJECT_REST)
def _drop_first(records: Sequence[Record]) -> HandlerResult:
    """The record of id 0 dropped, every other record rejected by the handler."""
    rejects = [Reject(r.line, "refused by the test handler", summary="refused by the test handler")
               for r in records if r.value["id"] != "0"]  # fmt: skip
    return HandlerResult([], rejects, dropped=len(records) - len(rejects))


def job(src: str, out: str, **options: Any) -> S3BatchInput:
    fields: dict[str, Any] = {"prefix": "in/", "output_bucket": out, "output_prefix": OUT, "handler": "customers"}
    return S3BatchInput.model_validate({"bucket": src, **fields, **options})


async def failed_job(client: Client, task_queue: str, spec: S3BatchInput, tag: str) -> ApplicationError:
    """Run ``spec``, which must fail; the workflow's failure cause."""
    with pytest.raises(WorkflowFailureError) as failure:
        await execute(client, task_queue, spec, tag)
    cause = failure.value.cause
    assert isinstance(cause, ApplicationError), cause
    return cause


def assert_all_rejected(entry: dict[str, Any], where: str, records: int, reason: str) -> None:
    """A report entry of a file failed because every one of its records was rejected."""
    assert entry["status"] == "failed", entry
    assert (entry["records"], entry["rejected"], entry["records_written"]) == (records, records, 0), entry
    error = entry["error"]
    assert error.startswith(f"TooManyRejects: {where}: all {records} records"), error
    assert "were rejected" in error and reason in error, error
    assert ACCEPT_HINT in error and "Fix" in error, error


# ------------------------------------------------------------------------------------------- pure


def test_crossed_fails_an_all_rejected_whole_file_without_limits_only() -> None:
    none = FileLimits()
    assert crossed(none, 5, 5, done=True, whole_file=True) is not None
    assert crossed(none, 5, 5, done=False, whole_file=True) is None  # known only at the end of the file
    assert crossed(none, 5, 5, done=True) is None  # a split's own counts (the workflow judges the file)
    assert crossed(none, 4, 5, done=True, whole_file=True) is None  # one record written or dropped
    assert crossed(none, 0, 0, done=True, whole_file=True) is None  # no records
    # Any explicit limit the counts are within allows it; one they are over fails as before.
    assert crossed(FileLimits(max_rejected_ratio=1.0), 5, 5, done=True, whole_file=True) is None
    assert crossed(FileLimits(max_rejected_records=5), 5, 5, done=True, whole_file=True) is None
    assert crossed(FileLimits(max_rejected_records=4), 5, 5, done=True, whole_file=True) == "max_rejected_records=4"
    assert crossed(FileLimits(max_rejected_ratio=0.5), 5, 5, done=True, whole_file=True) == "max_rejected_ratio=0.5"


def test_the_all_rejected_failure_says_which_file_how_many_why_and_what_to_do() -> None:
    limit = crossed(FileLimits(), 3, 3, done=True, whole_file=True)
    assert limit is not None
    counts = {"records": 3, "records_written": 0, "rejected": 3, "dropped": 0, "chunks": 1}
    err = too_many("s3://in/a.csv", limit, counts, [("bad email", 2), ("bad country", 1)], "s3://out/o/in/a.csv/")
    text = str(err)
    assert text.startswith("s3://in/a.csv: all 3 records read were rejected"), text
    assert "bad email (2); bad country (1)" in text and "s3://out/o/in/a.csv/" in text, text
    assert ACCEPT_HINT in text and "Fix" in text, text
    assert err.counts == counts


# ------------------------------------------------------------------------------------ S3 sinks


@pytest.mark.parametrize("sink", [None, {"type": "s3", "format": "parquet"}], ids=["jsonl", "parquet"])
@pytest.mark.parametrize("group_max_files", [1, 100], ids=["file-activity", "group-activity"])
async def test_a_file_the_schema_rejects_whole_fails_and_its_neighbours_succeed(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets: tuple[str, str],
    sink: dict[str, Any] | None, group_max_files: int,
) -> None:
    src, out = buckets
    s3.put_object(Bucket=src, Key="in/bad.csv", Body=customers_csv(30))
    s3.put_object(Bucket=src, Key="in/good.csv", Body=customers_csv(20, lambda i: False))
    s3.put_object(Bucket=src, Key="in/mostly.csv", Body=customers_csv(20, lambda i: i != 7))  # one row good
    s3.put_object(Bucket=src, Key="in/empty.csv", Body=(HEADER + "\n").encode())  # no records
    options: dict[str, Any] = {"chunk_records": 10, "group_max_files": group_max_files}
    if sink is not None:
        options["sink"] = sink
    cause = await failed_job(client, task_queue, job(src, out, **options), "all-rejected")
    assert cause.type == "JobFailed", cause
    rep = report(s3, out, OUT)
    entries = {f["key"]: f for f in rep["files"]}
    assert_all_rejected(entries["in/bad.csv"], f"s3://{src}/in/bad.csv", 30, EMAIL_REASON)
    assert entries["in/bad.csv"]["chunks"] == 3
    for key in ("in/good.csv", "in/mostly.csv", "in/empty.csv"):
        assert entries[key]["status"] == "succeeded", entries[key]
    assert (entries["in/mostly.csv"]["records_written"], entries["in/mostly.csv"]["rejected"]) == (1, 19)
    assert (rep["totals"]["files_failed"], rep["totals"]["files_succeeded"]) == (1, 3)
    # What it committed is kept: its rejects files give each line and its reason.
    names = [k.rsplit("/", 1)[-1] for k in list_keys(s3, out, f"{OUT}in/bad.csv/")]
    assert [n for n in names if n.startswith("rejects-")] == [f"rejects-{i:05d}.jsonl" for i in range(3)]


@pytest.mark.parametrize(
    "limits",
    [{"max_rejected_ratio": 1.0}, {"max_rejected_records": 30}],
    ids=["max_rejected_ratio-1.0", "max_rejected_records-within"],
)
async def test_a_job_whose_reject_limit_allows_it_succeeds(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets: tuple[str, str], limits: dict[str, Any]
) -> None:
    src, out = buckets
    s3.put_object(Bucket=src, Key="in/bad.csv", Body=customers_csv(30))
    result = await execute(client, task_queue, job(src, out, chunk_records=10, **limits), "all-rejected-ok")
    assert result.status == "succeeded"
    assert (result.totals.files_succeeded, result.totals.records_written, result.totals.rejected) == (1, 0, 30)
    (entry,) = report(s3, out, OUT)["files"]
    assert entry["status"] == "succeeded" and entry["warnings"][0].startswith("100.0% of its records were rejected")


async def test_a_limit_the_counts_are_over_fails_as_before(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets: tuple[str, str]
) -> None:
    src, out = buckets
    s3.put_object(Bucket=src, Key="in/bad.csv", Body=customers_csv(30))
    await failed_job(client, task_queue, job(src, out, chunk_records=10, max_rejected_records=29), "over")
    (entry,) = report(s3, out, OUT)["files"]
    assert entry["status"] == "failed" and "over max_rejected_records=29" in entry["error"], entry


async def test_records_a_handler_drops_are_not_rejections(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets: tuple[str, str]
) -> None:
    src, out = buckets
    s3.put_object(Bucket=src, Key="in/a.csv", Body=make_csv(25))
    result = await execute(client, task_queue, job(src, out, handler=DROP_ALL, chunk_records=10), "dropped")
    assert result.status == "succeeded" and (result.totals.dropped, result.totals.rejected) == (25, 0)
    # One record dropped, every other one rejected: not every record was rejected.
    result = await execute(
        client, task_queue, job(src, out, handler=DROP_FIRST_REJECT_REST, output_prefix="o2/"), "dropped-one"
    )
    assert result.status == "succeeded" and (result.totals.dropped, result.totals.rejected) == (1, 24)
    # Without the record of id 0, every record is rejected by the handler: failed, with the handler's reason.
    s3.put_object(Bucket=src, Key="in/a.csv", Body=b"id,name,note\n" + make_csv(25).split(b"\n", 2)[2])
    cause = await failed_job(client, task_queue, job(src, out, handler=DROP_FIRST_REJECT_REST, output_prefix="o3/"),
                             "handler-rejects")  # fmt: skip
    assert cause.type == "JobFailed"
    (entry,) = report(s3, out, "o3/")["files"]
    assert_all_rejected(entry, f"s3://{src}/in/a.csv", 24, "refused by the test handler")


# ------------------------------------------------------------------------------------ splits


def split_job(src: str, out: str, **kw: Any) -> S3BatchInput:
    options: dict[str, Any] = {
        "output_bucket": out,
        "output_prefix": OUT,
        "handler": "customers",
        "chunk_records": 500,
        "split_bytes": 64 * 1024,
        "max_concurrent_files": 4,
        "heartbeat_timeout_seconds": SLOW_HEARTBEAT_TIMEOUT,
    }
    return S3BatchInput(bucket=src, **{**options, **kw})


async def test_a_file_in_splits_every_record_rejected_fails_on_the_sum_of_its_splits(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets: tuple[str, str]
) -> None:
    """Each split's own records are all rejected too, but a split is not the file: the splits succeed, and the
    workflow fails the file on their sum (one entry, its ``splits``), as it judges any file limit on them."""
    src, out = buckets
    rows = 4_000  # about 270 KB: 4 splits of 64 KB (4 slots)
    s3.put_object(Bucket=src, Key="big.csv", Body=customers_csv(rows))
    cause = await failed_job(client, task_queue, split_job(src, out), "split-all-rejected")
    assert cause.type == "JobFailed", cause
    (entry,) = report(s3, out, OUT)["files"]
    assert entry["splits"] == 4, entry
    assert_all_rejected(entry, f"s3://{src}/big.csv", rows, EMAIL_REASON)
    assert "by its 4 splits" in entry["error"], entry
    # With a limit that allows it, the same file succeeds, in splits.
    result = await execute(client, task_queue, split_job(src, out, output_prefix="o2/", max_rejected_ratio=1.0))
    assert result.status == "succeeded" and result.totals.rejected == rows
    (entry,) = report(s3, out, "o2/")["files"]
    assert (entry["status"], entry["splits"]) == ("succeeded", 4), entry


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
async def pg_worker(stack: Stack, pg: PostgresServer, task_queue: str) -> AsyncIterator[Worker]:
    """An in-process worker whose settings know connection ``test``."""
    plain = await Client.connect(stack.config.temporal_address)
    settings = Settings.explicit(postgres_dsns={"test": pg.dsn})
    plugin = S3BatchPlugin(make_client(), settings=settings, register_search_attributes=False)
    async with Worker(plain, task_queue=task_queue, plugins=[plugin], max_concurrent_activities=4) as w:
        yield w


async def test_a_file_whose_every_row_the_database_refuses_fails(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, pg: PostgresServer, pg_worker: Worker
) -> None:
    """Into a table: every row of one file misses a NOT NULL column (the handler leaves it out), every row of
    another has a value the integer column refuses; a good file beside them is imported."""
    src, out = buckets
    table = f"items_{uuid.uuid4().hex[:8]}"
    pg.execute(f"CREATE TABLE public.{table} (id integer PRIMARY KEY, name text NOT NULL, note text)")
    s3.put_object(Bucket=src, Key="in/no_name.csv", Body=b"id,note\n" + b"".join(b"%d,x\n" % i for i in range(40)))
    s3.put_object(Bucket=src, Key="in/bad_id.csv", Body=b"id,name\n" + b"".join(b"n%d,a\n" % i for i in range(25)))
    s3.put_object(Bucket=src, Key="in/good.csv", Body=b"id,name\n" + b"".join(b"%d,a\n" % (100 + i) for i in range(5)))
    sink = {"type": "postgres", "connection": "test", "table": f"public.{table}"}
    spec = job(src, out, handler="passthrough", chunk_records=10, sink=sink, group_max_files=1)
    cause = await failed_job(client, task_queue, spec, "pg-all-refused")
    assert cause.type == "JobFailed", cause
    entries = {f["key"]: f for f in report(s3, out, OUT)["files"]}
    assert_all_rejected(entries["in/no_name.csv"], f"s3://{src}/in/no_name.csv", 40,
                        "refused by PostgreSQL: NotNullViolation (SQLSTATE 23502)")  # fmt: skip
    assert_all_rejected(entries["in/bad_id.csv"], f"s3://{src}/in/bad_id.csv", 25,
                        "refused by PostgreSQL: InvalidTextRepresentation (SQLSTATE 22P02)")  # fmt: skip
    assert entries["in/good.csv"]["status"] == "succeeded"
    assert pg.execute(f"SELECT id FROM public.{table} ORDER BY id") == [(100 + i,) for i in range(5)]
    # With a limit that allows it, the same files succeed (nothing more is written).
    spec = job(src, out, handler="passthrough", chunk_records=10, sink=sink, output_prefix="o2/",
               max_rejected_ratio=1.0)  # fmt: skip
    result = await execute(client, task_queue, spec, "pg-all-refused-ok")
    assert result.status == "succeeded" and result.totals.files_succeeded == 3
    assert pg.execute(f"SELECT count(*) FROM public.{table}") == [(5,)]


async def test_the_cli_shows_a_sink_jobs_rows_written_and_rejected_side_by_side(
    s3: Any, buckets: tuple[str, str], task_queue: str, pg: PostgresServer, pg_worker: Worker
) -> None:
    """``s3batch start --wait``, ``status`` and ``report`` of a job into a table that failed (one file's rows all
    refused): each says where the rows went and how many were written and rejected, side by side (a failed
    job's result has no counts: they are its report's)."""
    src, out = buckets
    table = f"items_{uuid.uuid4().hex[:8]}"
    pg.execute(f"CREATE TABLE public.{table} (id integer PRIMARY KEY, name text NOT NULL, note text)")
    s3.put_object(Bucket=src, Key="in/no_name.csv", Body=b"id,note\n" + b"".join(b"%d,x\n" % i for i in range(40)))
    s3.put_object(Bucket=src, Key="in/good.csv", Body=b"id,name\n" + b"".join(b"%d,a\n" % (100 + i) for i in range(5)))
    sink = f'{{"type": "postgres", "connection": "test", "table": "public.{table}"}}'
    wid = f"cli-sink-{uuid.uuid4().hex[:8]}"
    started = await run(
        "s3batch", "start", "--bucket", src, "--prefix", "in/", "--output-bucket", out, "--output-prefix", OUT,
        "--sink", sink, "--group-max-files", "1", "--task-queue", task_queue, "--id", wid, "--wait",
    )  # fmt: skip
    assert started.code == 1, started
    into = f"into PostgreSQL table public.{table} (connection 'test', insert)"
    counts = "records 45 read: 5 written, 40 rejected"
    status = await run("s3batch", "status", wid)
    shown = await run("s3batch", "report", wid)
    for output in (started.stdout, status.stdout):
        flat = " ".join(output.split())
        assert into in flat and counts in flat, output
        assert "files 2 done of 2 listed (1 succeeded, 1 failed)" in flat, output
    assert "2/2 files 5 written, 40 rejected" in " ".join(started.stdout.split()), started.stdout  # the bar
    flat = " ".join(shown.stdout.split())
    assert f"PostgreSQL table public.{table}" in flat and counts in flat, shown.stdout

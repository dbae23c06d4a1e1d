"""Rejected records brought in once their cause is fixed (issue 29): ``s3batch redrive --rejected JOB`` (the job
option ``rejected_of``) processes again exactly the records JOB's files had rejected (their lines, read by the
activity from JOB's rejects files), from the same source version, and writes the ones now accepted exactly once:
into the table beside the rows accepted before, or into the redrive's own output prefix (JSONL, Parquet parts);
what is still rejected is in its own rejects files. End to end through real workers on the real Temporal dev
server, S3 server and PostgreSQL; the redrives through the real ``s3batch`` command."""

from __future__ import annotations

import gzip
import io
import json
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq  # type: ignore[import-untyped]
import pytest
from pydantic import ValidationError
from s3batch.activities.rejected import RejectedLines
from temporalio.client import Client, WorkflowFailureError
from temporalio.testing import ActivityEnvironment
from temporalio.worker import Worker

from s3batch.checkpoint import CHECKPOINT_MAC_METADATA, CHECKPOINT_METADATA, Checkpoint, checkpoint_mac
from s3batch.config import Settings
from s3batch.dev.postgres import PostgresServer, server_bindir
from s3batch.dev.stack import Stack
from s3batch.dev.workers import WorkerProcess
from s3batch.errors import NotFound, SourceChanged
from s3batch.handlers import record_handler
from s3batch.messages import FileResult, FinalReportInput, ObjectRef, ProcessFileInput, S3BatchResult, Totals
from s3batch.models import JobSpec, S3BatchInput
from s3batch.plugin import S3BatchPlugin
from s3batch.report import JobReport, ReportFile
from s3batch.report_store import assemble_report
from s3batch.s3io import make_client
from tests.helpers import run, wait_for
from tests.helpers.jobs import new_id
from tests.helpers.output import list_keys, read_jsonl, report

OUT = "o/"
AGAIN = "o/_rejected/"
"""Where ``s3batch redrive --rejected`` writes by default: ``_rejected/`` under the redriven job's output."""

# ------------------------------------------------------------------------------------------- servers


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
    """An in-process worker whose settings know connection ``test`` (it runs S3 sinks too)."""
    plain = await Client.connect(stack.config.temporal_address)
    settings = Settings.explicit(postgres_dsns={"test": pg.dsn})
    plugin = S3BatchPlugin(make_client(), settings=settings, register_search_attributes=False)
    async with Worker(plain, task_queue=task_queue, plugins=[plugin], max_concurrent_activities=4) as w:
        yield w


# ------------------------------------------------------------------------------------------- data


def row(i: int, *, name: bool = True, qty: Any = None) -> dict[str, Any]:
    return {"id": i, "name": f"n{i}" if name else None, "qty": i if qty is None else qty}


def jsonl(rows: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def new_table(pg: PostgresServer) -> str:
    name = f"items_{uuid.uuid4().hex[:8]}"
    pg.execute(f"CREATE TABLE public.{name} (id integer PRIMARY KEY, name text NOT NULL, qty integer)")
    return name


def table_rows(pg: PostgresServer, table: str) -> list[tuple[Any, ...]]:
    return pg.execute(f"SELECT id, name, qty::text FROM public.{table} ORDER BY id, name")


def expected(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return sorted((r["id"], r["name"], str(r["qty"])) for r in rows)


def sink(table: str, **more: Any) -> dict[str, Any]:
    return {"type": "postgres", "connection": "test", "table": f"public.{table}", **more}


def job(src: str, out: str, **options: Any) -> S3BatchInput:
    fields: dict[str, Any] = {"prefix": "in/", "output_bucket": out, "output_prefix": OUT, "chunk_records": 7}
    return S3BatchInput.model_validate({"bucket": src, **fields, **options})


async def run_job(client: Client, task_queue: str, spec: S3BatchInput | dict[str, Any], wid: str) -> S3BatchResult:
    return await client.execute_workflow(
        "S3BatchWorkflow", spec, id=wid, task_queue=task_queue, result_type=S3BatchResult
    )


async def redrive_rejected(wid: str, new: str, *more: str) -> Any:
    """``s3batch redrive --rejected wid --id new --wait``, as a user types it."""
    return await run("s3batch", "redrive", "--rejected", wid, "--id", new, "--wait", *more, timeout=180)


def entry(rep: dict[str, Any], key: str) -> dict[str, Any]:
    return next(f for f in rep["files"] if f["key"] == key)


# ------------------------------------------------------------------------------------ the option, pure


def test_rejected_of_is_a_job_option_checked_like_any_other() -> None:
    base = {"bucket": "in-b", "output_bucket": "out-b", "output_prefix": "o/_rejected/"}
    spec = S3BatchInput.model_validate({**base, "rejected_of": "s3://out-b/o/_report.json"})
    assert spec.rejected_of == "s3://out-b/o/_report.json"
    assert json.loads(spec.model_dump_json())["rejected_of"] == "s3://out-b/o/_report.json"
    # Left out of the input as written when unset: every other job's input is what it was.
    assert "rejected_of" not in S3BatchInput.model_validate(base).model_dump()
    refused = [
        {**base, "rejected_of": "s3://out-b/o/report.json"},  # not a job report
        {**base, "rejected_of": "s3://out-b/o/_rejected/_report.json"},  # its own report: it would overwrite it
        {**base, "rejected_of": "s3://out-b/o/_report.json", "incremental": {}},
        {"manifest": "s3://lists/a.csv", "output_bucket": "out-b", "rejected_of": "s3://out-b/o/_report.json"},
    ]
    for raw in refused:
        with pytest.raises(ValidationError):
            S3BatchInput.model_validate(raw)


# ------------------------------------------------------------------------------------------- tables


async def test_rows_the_table_refused_come_in_once_after_the_fix_and_a_second_redrive_writes_nothing(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, pg: PostgresServer, pg_worker: Worker
) -> None:
    """NOT NULL on a column the file leaves empty in some rows: those rows are rejected; the table is fixed
    (``DROP NOT NULL``); ``redrive --rejected`` brings exactly them in; the same redrive again writes nothing.
    A file with no rejects is not processed by the redrive."""
    src, out = buckets
    table = new_table(pg)
    rows = [row(i, name=i % 3 != 0) for i in range(30)]
    clean = [row(100 + i) for i in range(5)]
    s3.put_object(Bucket=src, Key="in/a.jsonl", Body=jsonl(rows))
    s3.put_object(Bucket=src, Key="in/clean.jsonl", Body=jsonl(clean))
    wid = new_id("import")
    result = await run_job(client, task_queue, job(src, out, sink=sink(table)), wid)
    assert (result.totals.records_written, result.totals.rejected) == (25, 10)
    good = [r for r in rows if r["name"] is not None]
    assert table_rows(pg, table) == expected(good + clean)

    pg.execute(f"ALTER TABLE public.{table} ALTER COLUMN name DROP NOT NULL")
    first = new_id("again")
    r = await redrive_rejected(wid, first)
    assert r.code == 0, r
    assert table_rows(pg, table) == expected(rows + clean)  # every row, once
    rep = report(s3, out, AGAIN)
    assert rep["job_id"] == first and [f["key"] for f in rep["files"]] == ["in/a.jsonl"], rep["files"]
    done = entry(rep, "in/a.jsonl")
    assert (done["status"], done["records"], done["records_written"], done["rejected"]) == ("succeeded", 10, 10, 0)
    assert report(s3, out, OUT)["job_id"] == wid  # the redriven job's report is its own still

    second = new_id("again-twice")
    r = await redrive_rejected(wid, second)
    assert r.code == 0, r
    assert table_rows(pg, table) == expected(rows + clean)  # nothing written twice
    done = entry(report(s3, out, AGAIN), "in/a.jsonl")
    assert (done["records_written"], done["already_written"]) == (0, 10), done
    # The import's own checkpoint row is untouched: it is still done, with the rows it wrote.
    [(cp,)] = pg.execute(
        "SELECT checkpoint FROM public.s3batch_checkpoints WHERE target = %s AND source_key = 'in/a.jsonl'",
        (f"public.{table}",),
    )
    assert isinstance(cp, dict) and cp["done"] and cp["records_written"] == 20, cp


async def test_a_file_whose_every_row_was_refused_is_brought_in_whole_after_the_fix(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, pg: PostgresServer, pg_worker: Worker
) -> None:
    """An upsert whose every row the table refused: the file fails (TooManyRejects) and its message names the
    command; after the fix, the redrive writes every row."""
    src, out = buckets
    table = new_table(pg)
    rows = [row(i, name=False) for i in range(20)]
    s3.put_object(Bucket=src, Key="in/a.jsonl", Body=jsonl(rows))
    wid = new_id("upsert")
    with pytest.raises(WorkflowFailureError):
        await run_job(client, task_queue, job(src, out, sink=sink(table, mode="upsert", key=["id"])), wid)
    failed = entry(report(s3, out, OUT), "in/a.jsonl")
    assert failed["status"] == "failed" and "all 20 records read were rejected" in failed["error"], failed
    assert f"s3batch redrive --rejected {wid}" in failed["error"], failed["error"]
    assert table_rows(pg, table) == []

    pg.execute(f"ALTER TABLE public.{table} ALTER COLUMN name DROP NOT NULL")
    r = await redrive_rejected(wid, new_id("again"))
    assert r.code == 0, r
    assert table_rows(pg, table) == expected(rows)
    assert "20 written, 0 rejected" in " ".join(r.stdout.split()), r.stdout


async def test_what_is_still_rejected_is_reported_with_its_lines_and_a_redrive_of_the_redrive_brings_it_in(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, pg: PostgresServer, pg_worker: Worker
) -> None:
    """Two causes: a NULL name (fixed first) and a quantity the integer column refuses (fixed later). The first
    redrive writes the first kind and rejects the second again, in its own rejects files with the source lines;
    a redrive of that redrive brings the rest in."""
    src, out = buckets
    table = new_table(pg)
    nameless, wordy = {0, 4, 8, 12, 16}, {2, 7, 13}
    rows = [row(i, name=i not in nameless, qty="many" if i in wordy else None) for i in range(20)]
    s3.put_object(Bucket=src, Key="in/a.jsonl", Body=jsonl(rows))
    wid = new_id("import")
    result = await run_job(client, task_queue, job(src, out, sink=sink(table)), wid)
    assert (result.totals.records_written, result.totals.rejected) == (12, 8)

    pg.execute(f"ALTER TABLE public.{table} ALTER COLUMN name DROP NOT NULL")
    first = new_id("again")
    r = await redrive_rejected(wid, first)
    assert r.code == 0, r
    assert table_rows(pg, table) == expected([r for r in rows if r["id"] not in wordy])
    done = entry(report(s3, out, AGAIN), "in/a.jsonl")
    assert (done["records"], done["records_written"], done["rejected"]) == (8, 5, 3), done
    still = read_jsonl(s3, out, f"{AGAIN}in/a.jsonl/", kind="rejects")
    assert [s["line"] for s in still] == [i + 1 for i in sorted(wordy)]  # the source file's own lines
    assert all("SQLSTATE 22P02" in s["reason"] for s in still), still
    assert [s["record"]["id"] for s in still] == sorted(wordy)

    pg.execute(f"ALTER TABLE public.{table} ALTER COLUMN qty TYPE text")
    r = await redrive_rejected(first, new_id("again-again"))
    assert r.code == 0, r
    assert table_rows(pg, table) == expected(rows)
    done = entry(report(s3, out, f"{AGAIN}_rejected/"), "in/a.jsonl")
    assert (done["records"], done["records_written"], done["rejected"]) == (3, 3, 0), done


@pytest.mark.slow
async def test_a_worker_killed_mid_redrive_leaves_every_row_once(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, pg: PostgresServer,
    workers: Callable[..., WorkerProcess], tmp_path: Path,
) -> None:
    """The redrive is an import like any other: its own checkpoint row, committed with its rows, so a SIGKILL
    mid-redrive (worker subprocesses) leaves every row in the table exactly once."""
    src, out = buckets
    table = new_table(pg)
    rows = [row(i, name=i % 2 == 1) for i in range(2_000)]  # every other row refused: 1,000
    s3.put_object(Bucket=src, Key="in/big.jsonl", Body=jsonl(rows))
    env = {"S3BATCH_POSTGRES_TEST_DSN": pg.dsn, "S3BATCH_TEST_HANDLER_DELAY": "0.2"}
    worker = workers("w0", **env)
    spec = job(src, out, sink=sink(table), chunk_records=50, handler="slow_passthrough",
               heartbeat_timeout_seconds=4, max_attempts=20)  # fmt: skip
    wid = new_id("import")
    result = await run_job(client, task_queue, spec, wid)
    assert (result.totals.records_written, result.totals.rejected) == (1_000, 1_000)
    pg.execute(f"ALTER TABLE public.{table} ALTER COLUMN name DROP NOT NULL")

    redrive = new_id("again")
    started = await run("s3batch", "redrive", "--rejected", wid, "--id", redrive)
    assert started.code == 0, started

    def redrive_checkpoint() -> dict[str, Any] | None:
        found = pg.execute(
            "SELECT checkpoint FROM public.s3batch_checkpoints WHERE target <> %s AND source_key = 'in/big.jsonl'",
            (f"public.{table}",),
        )
        return found[0][0] if found and isinstance(found[0][0], dict) else None  # type: ignore[return-value]

    def past_a_few_chunks() -> dict[str, Any] | None:
        cp = redrive_checkpoint()
        return cp if cp is not None and cp["next_record"] >= 200 else None

    cp = await wait_for(past_a_few_chunks, 90, "the redrive's rows committed past record 200")
    worker.kill()
    committed = redrive_checkpoint()
    assert committed is not None and not committed["done"], "the kill must land mid-redrive"
    # Exactly the rows accepted before and those of the redrive's committed chunks, each once.
    assert committed["next_record"] >= cp["next_record"]
    n = 1_000 + committed["records_written"]
    assert pg.execute(f"SELECT count(*), count(DISTINCT id) FROM public.{table}") == [(n, n)]
    workers("w1", **env)
    outcome = await client.get_workflow_handle(redrive, result_type=S3BatchResult).result()
    assert (outcome.totals.records, outcome.totals.rejected) == (1_000, 0), outcome.totals
    assert table_rows(pg, table) == expected(rows)
    assert entry(report(s3, out, AGAIN), "in/big.jsonl")["attempts"] >= 2


# ----------------------------------------------------------------------------------------- S3 sinks

FIXED = {"codes": False}
"""The deploy of the fix of ``CODES``: flipped by the test (the in-process worker runs it)."""
CODES = f"redrive-codes-{uuid.uuid4().hex[:6]}"


@record_handler(CODES)
def _codes(value: dict[str, Any]) -> dict[str, Any]:
    """Rejects a code with a dash until the fix; writes codes upper-case."""
    if "-" in value["code"] and not FIXED["codes"]:
        raise ValueError("a code with a dash")
    return {**value, "code": value["code"].upper()}


def parquet_rows(s3: Any, bucket: str, prefix: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for key in sorted(k for k in list_keys(s3, bucket, prefix) if k.endswith(".parquet")):
        found += pq.read_table(io.BytesIO(s3.get_object(Bucket=bucket, Key=key)["Body"].read())).to_pylist()
    return found


@pytest.mark.parametrize("parts", ["jsonl", "parquet"])
async def test_records_a_handler_rejected_go_into_the_redrives_own_prefix_once(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, pg_worker: Worker, parts: str
) -> None:
    """S3 parts: the handler rejected codes with a dash; once it is fixed, a redrive (started here with the
    job option as plain JSON, as ``temporal workflow start --input`` would) writes exactly those records into
    its own output prefix; the earlier parts are untouched; the same redrive again writes nothing."""
    src, out = buckets
    codes = [f"c{i}" if i % 4 else f"c-{i}" for i in range(24)]
    s3.put_object(Bucket=src, Key="in/a.jsonl", Body=jsonl([{"id": i, "code": c} for i, c in enumerate(codes)]))
    options: dict[str, Any] = {"handler": CODES, "sink": {"type": "s3", "format": parts}}
    FIXED["codes"] = False
    wid = new_id("codes")
    result = await run_job(client, task_queue, job(src, out, **options), wid)
    assert (result.totals.records_written, result.totals.rejected) == (18, 6)
    before = {k: s3.head_object(Bucket=out, Key=k)["ETag"] for k in list_keys(s3, out, f"{OUT}in/")}

    FIXED["codes"] = True
    raw = {**job(src, out, **options).model_dump(mode="json"), "output_prefix": AGAIN}
    raw["rejected_of"] = f"s3://{out}/{OUT}_report.json"
    again = await run_job(client, task_queue, raw, new_id("codes-again"))
    assert (again.totals.records, again.totals.records_written, again.totals.rejected) == (6, 6, 0)
    want = [{"id": i, "code": c.upper()} for i, c in enumerate(codes) if "-" in c]
    written = AGAIN + "in/a.jsonl/"
    got = read_jsonl(s3, out, written) if parts == "jsonl" else parquet_rows(s3, out, written)
    assert got == want
    assert {k: s3.head_object(Bucket=out, Key=k)["ETag"] for k in list_keys(s3, out, f"{OUT}in/")} == before

    etags = {k: s3.head_object(Bucket=out, Key=k)["ETag"] for k in list_keys(s3, out, written)}
    twice = await run_job(client, task_queue, raw, new_id("codes-twice"))
    assert (twice.totals.records_written, twice.totals.already_written) == (0, 6)
    assert {k: s3.head_object(Bucket=out, Key=k)["ETag"] for k in list_keys(s3, out, written)} == etags


async def test_a_source_changed_since_the_redriven_job_is_refused_clearly(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, pg_worker: Worker
) -> None:
    src, out = buckets
    s3.put_object(Bucket=src, Key="in/a.jsonl", Body=jsonl([{"id": i, "code": f"c-{i}" if i < 3 else "c"}
                                                             for i in range(10)]))  # fmt: skip
    FIXED["codes"] = False
    wid = new_id("codes")
    await run_job(client, task_queue, job(src, out, handler=CODES), wid)
    s3.put_object(Bucket=src, Key="in/a.jsonl", Body=jsonl([{"id": 1, "code": "other"}]))  # a new version
    FIXED["codes"] = True
    r = await redrive_rejected(wid, new_id("again"))
    assert r.code == 1, r
    failed = entry(report(s3, out, AGAIN), "in/a.jsonl")
    assert failed["status"] == "failed" and failed["error"].startswith("SourceChanged: "), failed
    assert "changed since" in failed["error"] and "rejected" in failed["error"], failed["error"]
    assert not [k for k in list_keys(s3, out, f"{AGAIN}in/") if "/part-" in k]


async def test_a_job_without_rejects_has_nothing_to_redrive(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, pg_worker: Worker
) -> None:
    src, out = buckets
    s3.put_object(Bucket=src, Key="in/a.jsonl", Body=jsonl([{"id": 1, "code": "c"}]))
    wid = new_id("clean")
    await run_job(client, task_queue, job(src, out, handler=CODES), wid)
    r = await run("s3batch", "redrive", "--rejected", wid)
    assert r.code == 3 and "rejected no record" in r.stderr and "nothing to redrive" in r.stderr, r


async def test_csv_and_gzip_records_are_redriven_by_their_lines(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, pg_worker: Worker
) -> None:
    """A CSV big enough for the fast path (the import) with quoted line breaks, and the same file gzip-compressed
    (read again from its start): the redrive, by the exact parser, takes exactly the records on the rejected lines."""
    src, out = buckets
    lines, rows = ["id,code,note"], []
    for i in range(3_000):
        code = f"c-{i}" if i % 97 == 0 else f"c{i}"
        note = f"two\nlines {i}" if i % 5 == 0 else f"note {i} " + "x" * 20
        rows.append({"id": str(i), "code": code, "note": note})
        lines.append(f'{i},{code},"{note}"' if "\n" in note else f"{i},{code},{note}")
    body = ("\n".join(lines) + "\n").encode()
    assert len(body) > 64 * 1024  # read by the fast CSV path in the import
    s3.put_object(Bucket=src, Key="in/a.csv", Body=body)
    s3.put_object(Bucket=src, Key="in/b.csv.gz", Body=gzip.compress(body))
    FIXED["codes"] = False
    wid = new_id("codes-csv")
    result = await run_job(client, task_queue, job(src, out, handler=CODES, chunk_records=500), wid)
    rejected = [r for r in rows if "-" in r["code"]]
    assert result.totals.rejected == 2 * len(rejected)
    FIXED["codes"] = True
    r = await redrive_rejected(wid, new_id("again"), "--json")
    assert r.code == 0, r
    want = [{**r, "code": r["code"].upper()} for r in rejected]
    for key in ("in/a.csv", "in/b.csv.gz"):
        assert read_jsonl(s3, out, f"{AGAIN}{key}/") == want, key
        done = entry(report(s3, out, AGAIN), key)
        assert (done["records"], done["records_written"], done["rejected"]) == (len(rejected), len(rejected), 0)


def test_a_cancelled_redrive_of_rejected_records_reports_the_files_it_never_listed() -> None:
    """Cancelled before its listing ended: the files with rejects it had not listed are its ``not_started`` files,
    and its listing is done (a redrive of it picks them up from its report)."""
    redriven = JobReport(
        job_id="import-1",
        files=[
            ReportFile(key="in/a.csv", status="succeeded", rejected=2, records=5),
            ReportFile(key="in/b.csv", status="succeeded", records=5),
            ReportFile(key="in/c.csv", status="failed", rejected=5, records=5),
        ],
    )
    job = JobSpec.model_validate({"bucket": "in-b", "output_bucket": "out-b", "output_prefix": "o/_rejected/",
                                  "rejected_of": "s3://out-b/o/_report.json"})  # fmt: skip
    done = FileResult(key="in/a.csv", etag="e", status="succeeded", records=2, records_written=2)
    totals = Totals(files_listed=1, files_succeeded=1, records=2, records_written=2)
    req = FinalReportInput(job_id="r-1", job=job, status="cancelled", totals=totals, segments=0, files=[done],
                           listing_done=False, continuation_token="1")  # fmt: skip
    rep = assemble_report(req, [], redriven)
    assert [(f.key, f.status) for f in rep.files] == [("in/a.csv", "succeeded"), ("in/c.csv", "not_started")]
    assert rep.listing.done and (rep.totals.files_listed, rep.totals.files_not_started) == (2, 1)
    assert not rep.accounting_errors


def test_the_lines_are_those_of_the_rejects_of_the_listed_version_and_trusted(
    s3: Any, buckets: tuple[str, str]
) -> None:
    """What the activity reads: the rejects files of the file's folder written for the listed ETag (a stale one of
    another version is left out; with a checkpoint secret, one without a valid HMAC too), a line once; the identity
    changes with the lines. Rejects all of another version: SourceChanged; none: NotFound."""
    src, out = buckets
    folder = f"{OUT}in/a.jsonl/"

    def rejects(name: str, etag: str, lines: list[int], secret: bytes | None = None) -> None:
        raw = Checkpoint(etag=etag, fingerprint="f", chunk=1).model_dump_json()
        metadata = {CHECKPOINT_METADATA: raw}
        if secret is not None:
            metadata[CHECKPOINT_MAC_METADATA] = checkpoint_mac(secret, out, folder + name, raw)
        body = b"".join(json.dumps({"line": n, "reason": "r", "record": {}}).encode() + b"\n" for n in lines)
        s3.put_object(Bucket=out, Key=folder + name, Body=body, Metadata=metadata)

    def read(etag: str, settings: Settings | None = None) -> RejectedLines | None:
        obj = ObjectRef(key="in/a.jsonl", etag=etag, size=1)
        req = ProcessFileInput(job_id="r", bucket=src, obj=obj, output_bucket=out, output_prefix=AGAIN, format="auto",
                               handler="passthrough", chunk_records=10, max_record_bytes=1024,
                               rejected_of=f"s3://{out}/{OUT}_report.json")  # fmt: skip
        return ActivityEnvironment().run(RejectedLines.of, s3, req, "s3://in/a.jsonl", settings or Settings.explicit())

    rejects("rejects-00000.jsonl", "v2", [3, 5])
    rejects("rejects-00002.jsonl", "v2", [40, 41, 41])
    rejects("rejects-00001.jsonl", "v1", [7])  # stale: of the version before
    rejects("part-00000.jsonl", "v2", [99])  # not a rejects file
    found = read("v2")
    assert found is not None and list(found.lines) == [3, 5, 40, 41]
    secret = b"s" * 32
    rejects("rejects-00003.jsonl", "v2", [50], secret)
    trusted = read("v2", Settings.explicit(checkpoint_secret=secret.decode()))
    assert trusted is not None and list(trusted.lines) == [50]
    assert trusted.identity != found.identity
    with pytest.raises(SourceChanged, match="changed since its records were rejected"):
        read("v3")
    s3.delete_objects(Bucket=out, Delete={"Objects": [{"Key": k} for k in list_keys(s3, out, folder)]})
    with pytest.raises(NotFound, match="no rejects files"):
        read("v2")

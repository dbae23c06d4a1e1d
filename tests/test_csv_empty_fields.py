"""Empty CSV fields into a PostgreSQL table as PostgreSQL's own ``COPY ... (FORMAT csv)`` loads them (issue 29): an
unquoted empty field is NULL, a quoted one (``""``) the empty string; ``"empty_as": "string"`` keeps both ''.

- The readers: the exact parser (Python's csv module cannot tell ``,,`` from ``,"",``) and the fast path (pyarrow
  blocks proved canonical) read generated files, in several dialects, as the fields were written (an oracle by
  construction), from the start and resumed at any record's byte offset.
- The differential: the same bytes loaded by PostgreSQL's ``COPY t FROM STDIN (FORMAT csv, HEADER)`` into one table
  and by a job (the S3 server, a worker, the PostgreSQL sink, chunks of 37 records) into another, compared row by
  row: a fixed file as a spreadsheet exports it (BOM, CRLF, empty fields in typed columns, large enough for the
  fast path's CSV ``COPY``) and hostile files from hypothesis (quoted line breaks, CR, CRLF, tabs, doubled quotes,
  quoted and unquoted empty fields, an empty last field, no line end at the end).
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from s3batch.activities import file_job
from s3batch.activities.s3_activities import S3Activities
from temporalio.client import Client
from temporalio.testing import ActivityEnvironment
from temporalio.worker import Worker

from s3batch.checkpoint import Checkpoint
from s3batch.config import Settings
from s3batch.dev.postgres import PostgresServer, server_bindir
from s3batch.dev.stack import Stack
from s3batch.file_output import FileOutput
from s3batch.formats.common import Record
from s3batch.formats.csv import CsvParser
from s3batch.formats.fastcsv import FastCsvParser
from s3batch.handlers import HandlerResult, chunk_handler, passthrough
from s3batch.jsonvalues import encode_json
from s3batch.messages import ObjectRef, ProcessFileInput
from s3batch.models import S3BatchInput
from s3batch.plugin import S3BatchPlugin
from s3batch.reading import Reading
from s3batch.s3io import make_client
from s3batch.sinks.postgres import PostgresOutput
from s3batch.sinks.postgres_pools import PostgresPools
from s3batch.sinks.rows import CsvRows
from s3batch.sinks.spec import PostgresSink
from tests.helpers.jobs import execute
from tests.helpers.records import chunked, walk

Field = tuple[str | None, bool]
"""A field as written: its value (None: written empty and unquoted) and whether it is quoted."""

_TEXT = st.text(alphabet=st.sampled_from(list('ab ,;"\'\t\n\r\\é漢😀|')), max_size=6)


def _write(fields: list[Field], delimiter: str, quote: str) -> str:
    """One row: quoted fields in quotes (a quote inside doubled), the others as they are."""
    return delimiter.join(
        "" if value is None else quote + value.replace(quote, quote * 2) + quote if quoted else value
        for value, quoted in fields
    )


def _needs_quotes(value: str, delimiter: str, quote: str) -> bool:
    return value == "" or any(c in value for c in (delimiter, quote, "\n", "\r"))


@st.composite
def _fields(draw: st.DrawFn, delimiter: str, quote: str) -> Field:
    value = draw(st.one_of(st.none(), _TEXT))
    if value is None:
        return None, False
    quoted = _needs_quotes(value, delimiter, quote) or draw(st.booleans())
    if value[:1] == quote:
        quoted = True
    return value, quoted


@st.composite
def _files(draw: st.DrawFn) -> tuple[bytes, Reading, list[list[str | None]]]:
    """A CSV file in a dialect, and its rows as they must be read with ``empty_null``."""
    delimiter, quote = draw(st.sampled_from([(",", '"'), (";", "'"), ("\t", '"'), ("|", '"')]))
    width = draw(st.integers(2, 4))
    eol = draw(st.sampled_from(["\n", "\r\n", "\r"]))
    rows = draw(st.lists(st.lists(_fields(delimiter, quote), min_size=width, max_size=width), max_size=25))
    header = delimiter.join(f"c{i}" for i in range(width))
    text = header + eol + "".join(_write(r, delimiter, quote) + eol for r in rows)
    if rows and draw(st.booleans()):
        text = text[: -len(eol)]  # no line end after the last row
    bom = "\ufeff" if draw(st.booleans()) else ""
    reading = Reading(delimiter=delimiter, quotechar=quote, empty_null=True)
    return (bom + text).encode(), reading, [[v for v, _ in r] for r in rows]


bounded = settings(
    max_examples=150, deadline=None, derandomize=True, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)


@bounded
@given(file=_files(), block=st.sampled_from([16, 100, 1 << 20]), sizes=st.sampled_from([None, [1, 7], [50]]))
def test_both_readers_tell_unquoted_from_quoted_empty_fields_from_the_start_and_resumed(
    file: tuple[bytes, Reading, list[list[str | None]]], block: int, sizes: list[int] | None
) -> None:
    data, reading, rows = file
    exact = CsvParser(chunked(data, sizes), reading=reading)
    records, bounds = walk(exact)
    names = exact.header
    assert names is not None
    assert [r.error for r in records] == [None] * len(records)
    assert [list(r.value.values()) for r in records] == rows
    fast = FastCsvParser(chunked(data, sizes), reading=reading, block_bytes=block)
    assert walk(fast) == (records, bounds)
    # Resumed at a record's byte offset (a checkpoint; three of them), with the header read before: the same records.
    for i, (offset, line) in list(enumerate(bounds[:-1]))[:: max(1, len(bounds) // 3)]:
        for kind in (CsvParser, FastCsvParser):
            again = kind(io.BytesIO(data[offset:]), offset=offset, line=line, header=names, reading=reading)
            assert [r.value for r in again] == [r.value for r in records[i + 1 :]]


@bounded
@given(file=_files(), block=st.sampled_from([64, 1 << 20]), as_csv=st.booleans(), nulls=st.booleans())
def test_the_fast_paths_passthrough_documents_and_sizes_write_null(
    file: tuple[bytes, Reading, list[list[str | None]]], block: int, as_csv: bool, nulls: bool
) -> None:
    """``take_json`` (the documents of a block's rows at once, or their sizes for rows kept as CSV) against the
    ``passthrough`` handler on the exact parser's records: a null value is ``null``, counted so; and, in any
    dialect, a double quote in a value is escaped (with another quote character it was not, before)."""
    data, reading, _ = file
    reading = dataclasses.replace(reading, empty_null=nulls)
    records = list(CsvParser(io.BytesIO(data), reading=reading))
    fast = FastCsvParser(io.BytesIO(data), reading=reading, block_bytes=block)
    it = iter(fast)
    at = 0
    while at < len(records):
        lines: list[int] | None = [] if as_csv else None
        n, pieces, _, size = fast.take_json(30, 1 << 62, lines)
        if n == 0:
            assert next(it) == records[at]
            at += 1
            continue
        documents = passthrough(records[at : at + n]).output
        if lines is None:
            assert b"\n".join(pieces) == b"\n".join(documents)
        assert size == sum(map(len, documents))
        at += n


def test_the_fast_path_reads_canonical_rows_with_empty_fields_in_its_blocks() -> None:
    """Bare empty fields and ``""`` are canonical where an unquoted empty field is null: no row leaves the blocks."""
    data = b"a,b,c\r\n" + b"".join(b'%d,,""\r\n%d,"",\r\n' % (i, i) for i in range(500))
    fast = FastCsvParser(io.BytesIO(data), reading=Reading(empty_null=True), block_bytes=4096)
    values = [r.value for r in fast]
    assert values[:2] == [{"a": "0", "b": None, "c": ""}, {"a": "0", "b": "", "c": None}] and len(values) == 1_000
    assert fast.fast_records == 999  # all but the first record (read by the exact parser with the header)


def test_the_exact_parser_with_an_escape_character_and_the_header_none_first_row() -> None:
    data = b'a,b,c\n\\,,,""\n"\\"",,\n,x\\\ny,\n'
    escaped = Reading(escapechar="\\", empty_null=True)
    assert [r.value for r in CsvParser(io.BytesIO(data), reading=escaped)] == [
        {"a": ",", "b": None, "c": ""}, {"a": '"', "b": None, "c": None}, {"a": None, "b": "x\ny", "c": None},
    ]
    headless = Reading(header_row=False, empty_null=True)
    assert [r.value for r in CsvParser(io.BytesIO(b',"",x\n'), reading=headless)] == [
        {"col_1": None, "col_2": "", "col_3": "x"}
    ]
    # Without empty_null (the S3 sinks, "empty_as": "string"): both are '', as the csv module reads them.
    assert [r.value for r in CsvParser(io.BytesIO(b'a,b\n,""\n'))] == [{"a": "", "b": ""}]


def test_csv_rows_write_none_unquoted_and_read_it_back() -> None:
    rows = CsvRows(["a", "b", "c"], ",", '"', nulls=True)
    rows.add([b'1,,""\r\n"x\r\ny",,\r\n'])
    assert rows.values() == [{"a": "1", "b": None, "c": ""}, {"a": "x\r\ny", "b": None, "c": None}]
    assert rows.encode([{"a": None, "b": "", "c": 'q"'}]) == b',"","q"""\r\n'
    assert CsvRows(["a", "b"], ",", '"').encode([{"a": None, "b": ""}]) is None  # FORCE_NOT_NULL would make it ''


def test_empty_as_is_null_or_string_and_only_string_enters_the_fingerprint() -> None:
    base = {"type": "postgres", "connection": "w", "table": "t"}
    default = PostgresSink.model_validate(base)
    assert default.empty_null and PostgresSink.model_validate({**base, "empty_as": "null"}).shape() == default.shape()
    assert "empty_as" not in default.model_dump()  # a worker of an earlier release refuses unknown fields
    kept = PostgresSink.model_validate({**base, "empty_as": "string"})
    assert not kept.empty_null and kept.shape() == {**default.shape(), "empty_as": "string"}
    for bad in ("NULL", "", 0, True):
        with pytest.raises(ValidationError, match="empty_as"):
            PostgresSink.model_validate({**base, "empty_as": bad})


# ------------------------------------------------------------------------------ against PostgreSQL's COPY


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


COLUMNS = "n integer, i integer, d date, x numeric, t text, u text"
"""The tables compared: typed columns (integer, date, numeric) and text, ``n`` the row's number."""


def _spreadsheet_export(rows: int) -> bytes:
    """A CSV as spreadsheet tools save it (a UTF-8 BOM, CRLF, quotes only where needed): empty cells unquoted
    in every column, an empty string quoted, quoted line breaks, tabs and doubled quotes; canonical for the fast
    path (over 64 KiB: its CSV ``COPY``)."""
    lines = ["n,i,d,x,t,u"]
    for n in range(rows):
        i = "" if n % 7 == 3 else str(n * 13 - 500)
        d = "" if n % 5 == 1 else (datetime.date(2020, 1, 1) + datetime.timedelta(days=n)).isoformat()
        x = "" if n % 11 == 4 else f"{n % 1000}.{n % 100:02d}"
        t = ['plain', '"a ""quoted"" word"', '"two\r\nlines"', "tab\there", "", '""', "é漢 😀"][n % 7]
        u = "" if n % 3 == 0 else f"note {n}"
        lines.append(",".join([str(n), i, d, x, t, u]))
    return ("\ufeff" + "\r\n".join(lines) + "\r\n").encode()


@st.composite
def _hostile(draw: st.DrawFn, first: int = 0) -> bytes:
    """A CSV of the compared columns (``n`` from ``first`` on): typed fields valid, quoted or not, or unquoted
    empty (NULL: a quoted empty one is no integer for COPY either); text anything, quoted or not, empty either way;
    LF, CRLF or CR line ends (one kind a file, as COPY wants); a BOM or not; a line end after the last row or not."""
    eol = draw(st.sampled_from(["\n", "\r\n", "\r"]))
    rows = []
    for n in range(first, first + draw(st.integers(0, 90))):
        typed = [
            draw(st.one_of(st.none(), st.integers(-(2**31), 2**31 - 1).map(str), st.just(" 42"))),
            draw(st.one_of(st.none(), st.dates(datetime.date(1, 1, 1), datetime.date(9999, 12, 31)).map(str))),
            draw(st.one_of(st.none(), st.decimals(allow_nan=False, allow_infinity=False, places=3).map(str))),
        ]
        fields: list[Field] = [(str(n), draw(st.booleans()))]
        fields += [(v, v is not None and draw(st.booleans())) for v in typed]
        fields += [draw(_fields(",", '"')), draw(_fields(",", '"'))]
        rows.append(_write(fields, ",", '"'))
    header = draw(st.sampled_from(["n,i,d,x,t,u", 'n,"i",d,x,"t",u']))
    text = header + eol + "".join(r + eol for r in rows)
    if rows and draw(st.booleans()):
        text = text[: -len(eol)]
    return (("\ufeff" if draw(st.booleans()) else "") + text).encode()


def _copied(pg: PostgresServer, files: list[bytes]) -> list[tuple[Any, ...]]:
    """The files loaded by PostgreSQL itself (``COPY ... (FORMAT csv, HEADER)`` each), row by row."""
    table = f"ref_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE public.{table} ({COLUMNS})")
        for data in files:
            with conn.cursor() as cur, cur.copy(f"COPY public.{table} FROM STDIN (FORMAT csv, HEADER)") as copy:
                copy.write(data)
    return pg.execute(f"SELECT * FROM public.{table} ORDER BY n")


async def _imported(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, pg: PostgresServer, files: list[bytes],
    chunk_records: int = 37, **sink: Any,
) -> tuple[list[tuple[Any, ...]], Any]:
    """The files imported by one job (chunks of ``chunk_records`` records) into a new table: its rows, and the
    job's totals."""
    src, out = buckets
    table = f"got_{uuid.uuid4().hex[:8]}"
    pg.execute(f"CREATE TABLE public.{table} ({COLUMNS})")
    for i, data in enumerate(files):
        s3.put_object(Bucket=src, Key=f"{table}/{i}.csv", Body=data)
    job = S3BatchInput.model_validate({
        "bucket": src, "prefix": f"{table}/", "output_bucket": out, "output_prefix": f"{table}/",
        "chunk_records": chunk_records, "sink": {"type": "postgres", "connection": "test", "table": table, **sink},
    })
    result = await execute(client, task_queue, job, "empty")
    assert result.status == "succeeded", result
    return pg.execute(f"SELECT * FROM public.{table} ORDER BY n"), result.totals


async def test_a_spreadsheet_export_lands_as_copy_loads_it(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, pg: PostgresServer, pg_worker: Worker,
) -> None:
    data = _spreadsheet_export(1_800)
    assert len(data) > 64 * 1024
    expected = _copied(pg, [data])
    assert len(expected) == 1_800 and expected[3][1] is None and expected[0][5] is None
    assert expected[4][4] is None and expected[5][4] == ""  # t: an unquoted empty cell, and ""
    rows, totals = await _imported(client, s3, buckets, task_queue, pg, [data])
    assert totals.rejected == 0 and rows == expected
    # "empty_as": "string": the empty cells are '' as before: the typed columns refuse those rows, the text keeps ''.
    kept, totals = await _imported(client, s3, buckets, task_queue, pg, [data], chunk_records=600, empty_as="string")
    refused = [n for n, i, d, x, *_ in expected if i is None or d is None or x is None]
    assert totals.rejected == len(refused) and [r[0] for r in kept] == sorted(set(range(1_800)) - set(refused))
    assert all(u == ("" if n % 3 == 0 else f"note {n}") for n, *_, u in kept)


@st.composite
def _hostile_files(draw: st.DrawFn) -> list[bytes]:
    """One to three hostile files, their rows numbered apart."""
    return [draw(_hostile(1_000 * i)) for i in range(draw(st.integers(1, 3)))]


@settings(max_examples=4, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture])
@given(files=_hostile_files())
async def test_hostile_files_land_as_copy_loads_them(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, pg: PostgresServer, pg_worker: Worker,
    files: list[bytes],
) -> None:
    expected = _copied(pg, files)
    rows, totals = await _imported(client, s3, buckets, task_queue, pg, files)
    assert totals.rejected == 0 and rows == expected


def test_the_csv_copy_of_a_chunk_writes_null_for_unquoted_empty_fields(
    s3: Any, buckets: tuple[str, str], pg: PostgresServer
) -> None:
    """The sink's CSV ``COPY`` of rows kept as the file's CSV (the fast path's), and the JSON rows joined to it
    (``CsvRows.encode``): NULL for an unquoted empty field and for None, '' for a quoted empty field and ''."""
    src, out = buckets
    name = f"csvnull_{uuid.uuid4().hex[:8]}"
    pg.execute(f"CREATE TABLE public.{name} (id integer, name text, born date)")
    pools = PostgresPools(Settings.explicit(postgres_dsns={"test": pg.dsn}))
    folder = FileOutput(
        s3, bucket=out, output_prefix="o/", key="in/n.csv", etag="e1", fingerprint="f", secret=None,
        put_params={}, log_extra={},
    )
    sink = PostgresOutput(PostgresSink(type="postgres", connection="test", table=name), folder, pools, job_id="j",
                          bucket=src, where=f"s3://{src}/in/n.csv")
    try:
        rows = CsvRows(["id", "name", "born"], ",", '"', nulls=True)
        rows.add([b'2,"",\n3,,2001-02-03\n'])
        rows.lines += [3, 4]
        cp = Checkpoint(etag="e1", fingerprint="f")
        new = cp.model_copy(update={"chunk": 1, "next_record": 3, "records_written": 3})
        first = {"id": "1", "name": None, "born": None}
        assert sink.commit(cp, new, [encode_json(first)], [], [2], csv=rows) == new
        got = pg.execute(f"SELECT id, name, born FROM public.{name} ORDER BY id")
        assert got == [(1, None, None), (2, "", None), (3, None, datetime.date(2001, 2, 3))]
    finally:
        pools.close()


FIXED: list[bool] = []
"""Set (non-empty) by a test: ``empty_until_fixed`` then passes every record."""


@chunk_handler("empty_until_fixed")
def _until_fixed(records: list[Record]) -> HandlerResult:
    """``passthrough``, but a chunk holding a record whose ``u`` is BOOM fails until ``FIXED``."""
    if not FIXED and any(r.value["u"] == "BOOM" for r in records):
        raise RuntimeError("cannot write BOOM yet")
    return HandlerResult([r.value for r in records], [])


def test_a_file_begun_writing_empty_strings_goes_on_so_after_the_upgrade(
    s3: Any, buckets: tuple[str, str], pg: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file whose import an earlier release began (its checkpoints without ``empty_null``: unquoted empty fields
    written '') and that this one resumes mid-file goes on writing '': the file is never half one way. A file
    begun now says so in its checkpoints, and has NULLs."""
    src, out = buckets
    name = f"upgrade_{uuid.uuid4().hex[:8]}"
    pg.execute(f"CREATE TABLE public.{name} (n integer, t text, u text)")
    body = "n,t,u\n" + "".join(f"{n},,{'BOOM' if n == 60 else 'x'}\n" for n in range(100))
    settings = Settings.explicit(postgres_dsns={"test": pg.dsn})

    def attempt(key: str) -> Any:
        head = s3.head_object(Bucket=src, Key=key)
        req = ProcessFileInput(
            job_id=f"job-{name}", bucket=src, obj=ObjectRef(key=key, etag=head["ETag"].strip('"'), size=len(body)),
            output_bucket=out, output_prefix=f"{name}/", handler="empty_until_fixed", format="auto",
            max_record_bytes=1 << 20, chunk_records=25,
            sink=PostgresSink(type="postgres", connection="test", table=name),
        )
        return ActivityEnvironment().run(S3Activities(s3, settings).process_file, req)

    def checkpoint(key: str) -> dict[str, Any]:
        rows = pg.execute("SELECT checkpoint FROM public.s3batch_checkpoints WHERE source_bucket = %s AND "
                          "source_key = %s", (src, key))
        return rows[0][0]  # type: ignore[return-value]

    for key in ("in/old.csv", "in/new.csv"):
        s3.put_object(Bucket=src, Key=key, Body=body.encode())
    with monkeypatch.context() as earlier:  # the earlier release: '' and no mark, until the chunk of line 62 fails
        earlier.setattr(file_job, "read_as_begun", lambda job, cp: cp)
        reading_of = file_job.reading_of
        earlier.setattr(file_job, "reading_of", lambda *a: dataclasses.replace(reading_of(*a), empty_null=False))
        with pytest.raises(Exception, match="empty_until_fixed"):
            attempt("in/old.csv")
    assert checkpoint("in/old.csv")["next_record"] == 50 and "empty_null" not in checkpoint("in/old.csv")
    FIXED.append(True)
    try:
        assert attempt("in/old.csv").records_written == 100
        assert attempt("in/new.csv").records_written == 100
    finally:
        FIXED.clear()
    counts = pg.execute(f"SELECT u = 'x', count(t), count(*) FROM public.{name} GROUP BY 1 ORDER BY 1")
    assert counts == [(False, 1, 2), (True, 99, 198)]  # old.csv: t '' in all 100 rows; new.csv: NULL in all
    assert checkpoint("in/new.csv")["empty_null"] is True

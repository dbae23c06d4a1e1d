"""What comes in (issue 14): zstd and bzip2 beside gzip, CSV dialects and encodings, JSON documents,
each through a real job (the in-process worker on the test stack) and compared with a reference
reader: the csv module with the same dialect, ``json`` for JSON documents."""

from __future__ import annotations

import bz2
import csv
import gzip
import hashlib
import io
import json
from typing import Any

import pytest
import zstandard
from temporalio.client import Client
from temporalio.worker import Worker

from s3batch.checkpoint import fingerprint
from s3batch.models import S3BatchInput
from s3batch.reading import Reading
from tests.helpers.assertions import assert_invalid_input
from tests.helpers.data import csv_rows, make_csv, put_files
from tests.helpers.jobs import execute, new_id
from tests.helpers.output import committed_parts, read_jsonl, report


def zst(data: bytes) -> bytes:
    return zstandard.ZstdCompressor().compress(data)


def zst_frames(data: bytes, frame: int) -> bytes:
    """Several zstd frames one after the other (as ``zstd`` writes a stream, or ``cat a.zst b.zst``)."""
    return b"".join(zst(data[i : i + frame]) for i in range(0, len(data), frame))


def jsonl_events(n: int) -> bytes:
    line = b'{"n": %d, "big": 123456789012345678901234567890, "x": 0.1000000000000000055511}\n'
    return b"".join(line % i for i in range(n))


def job(src: str, out: str, **options: Any) -> S3BatchInput:
    return S3BatchInput(bucket=src, output_bucket=out, output_prefix="o/", chunk_records=300, **options)


def file_entry(s3: Any, out: str, key: str) -> dict[str, Any]:
    return next(f for f in report(s3, out, "o/")["files"] if f["key"] == key)


# ------------------------------------------------------------------------------------- compression


async def test_zstd_and_bzip2_files_are_read_exactly_with_their_inner_format(
    client: Client, worker: Worker, s3: Any, buckets: tuple[str, str]
) -> None:
    src, out = buckets
    rows = 2_000
    data = make_csv(rows)
    events = jsonl_events(1_500)
    files = {
        "in/a.csv.zst": zst_frames(data, 10_000),  # many frames
        "in/b.csv.bz2": bz2.compress(data[:30_000]) + bz2.compress(data[30_000:]),  # two streams
        "in/c.jsonl.bz2": bz2.compress(events),
        "in/d.JSONL.ZST": zst(events),
        "in/e.csv.gz": gzip.compress(data),
    }
    put_files(s3, src, files)
    result = await execute(client, worker.task_queue, job(src, out), "compressed")
    assert result.status == "succeeded"
    expected_events = [json.loads(line) for line in events.splitlines()]
    for key in ("in/a.csv.zst", "in/b.csv.bz2", "in/e.csv.gz"):
        assert read_jsonl(s3, out, f"o/{key}/") == csv_rows(rows), key
        entry = file_entry(s3, out, key)
        assert (entry["records"], entry["chunks"], entry["rejected"]) == (rows, 7, 0), key
    for key in ("in/c.jsonl.bz2", "in/d.JSONL.ZST"):
        assert read_jsonl(s3, out, f"o/{key}/") == expected_events, key  # big numbers kept exact


BAD_COMPRESSED = {
    "in/not-zstd.csv.zst": (b"id,name\n1,secret-value\n", "is not zstd data (it does not start with the zstd"),
    "in/truncated.csv.zst": (zst(make_csv(5_000))[:-200], "is truncated: its zstd stream ends"),
    "in/not-bzip2.jsonl.bz2": (b'{"secret": "value"}\n', "is not bzip2 data"),
    "in/truncated.jsonl.bz2": (bz2.compress(jsonl_events(5_000))[:-100], "is truncated: its bzip2 stream ends"),
    "in/corrupt.csv.bz2": (bz2.compress(make_csv(5_000))[:40] + b"\x00" * 300, "holds corrupt compressed data"),
}


async def test_corrupt_zstd_and_bzip2_files_fail_at_once_naming_the_file(
    client: Client, worker: Worker, s3: Any, buckets: tuple[str, str]
) -> None:
    src, out = buckets
    put_files(s3, src, {key: body for key, (body, _) in BAD_COMPRESSED.items()} | {"in/ok.csv.zst": zst(make_csv(10))})
    result = await execute(client, worker.task_queue, job(src, out, max_failed_files=10), "bad-compressed")
    assert result.status == "succeeded"  # within max_failed_files
    for key, (_, what) in BAD_COMPRESSED.items():
        entry = file_entry(s3, out, key)
        assert entry["status"] == "failed", key
        assert entry["attempts"] == 1, f"{key}: retried ({entry})"  # non-retryable
        assert entry["error"].startswith(f"BadFile: s3://{src}/{key} {what}"), entry["error"]
        assert "Upload it again" in entry["error"] and "retrying cannot fix it" in entry["error"]
        assert "secret" not in entry["error"]
    assert file_entry(s3, out, "in/ok.csv.zst")["status"] == "succeeded"


# --------------------------------------------------------------------------- CSV dialects, encodings


def dialect_file(options: dict[str, Any], rows: int, header: bool, end: str = "\n") -> tuple[str, list[list[str]]]:
    """Text written by the csv module in the dialect of ``options`` (quotes, delimiters, line breaks
    and non-ASCII letters inside fields), and its rows."""
    delimiter = options.get("delimiter", ",")
    quote = options.get("quotechar", '"')
    sign = "£" if options.get("encoding") == "latin-1" else "€"
    data = [[str(i), f"é{delimiter}x{quote}ü\n{i}", sign] for i in range(rows)]
    out = io.StringIO()
    escape = options.get("escapechar")
    writer = csv.writer(out, delimiter=delimiter, quotechar=quote, escapechar=escape, lineterminator=end)
    if header:
        writer.writerow(["id", "text", "sign"])
    writer.writerows(data)
    return out.getvalue(), data


def reference_records(body: bytes, options: dict[str, Any], names: list[str] | None) -> list[dict[str, str]]:
    """The csv module's reading of ``body`` with the same dialect (the reference)."""
    text = body.decode(options.get("encoding", "utf-8-sig"))
    reader = csv.reader(
        io.StringIO(text, newline=""),
        delimiter=options.get("delimiter", "\t"),
        quotechar=options.get("quotechar", '"'),
        escapechar=options.get("escapechar"),
        strict=True,
    )
    rows = [row for row in reader if row]
    if names is None:
        names, rows = rows[0], rows[1:]
    return [dict(zip(names, row, strict=True)) for row in rows]


DIALECTS: dict[str, tuple[dict[str, Any], str]] = {
    "semicolon-cp1252": ({"delimiter": ";", "encoding": "cp1252"}, "a.csv"),
    "pipe-quote-escape": ({"delimiter": "|", "quotechar": "'", "escapechar": "\\"}, "b.csv"),
    "no-header-latin-1": ({"header": "none", "encoding": "latin-1", "delimiter": ","}, "c.csv"),
    "given-names-utf-16": ({"header": ["n", "t", "s"], "encoding": "utf-16", "delimiter": ","}, "d.csv"),
    "utf-16-be-crlf": ({"encoding": "utf-16-be", "delimiter": ","}, "e.csv"),
    "tsv-auto": ({}, "f.tsv.zst"),
    "utf-16-bzip2": ({"encoding": "utf-16", "delimiter": ","}, "g.csv.bz2"),
}
COMPRESS = {".zst": zst, ".bz2": bz2.compress}


@pytest.mark.parametrize("name", sorted(DIALECTS))
async def test_each_csv_option_through_a_job_equals_the_csv_module(
    client: Client, worker: Worker, s3: Any, buckets: tuple[str, str], name: str
) -> None:
    src, out = buckets
    options, key = DIALECTS[name]
    header = not isinstance(options.get("header"), (list, str))
    end = "\r\n" if "crlf" in name else "\n"
    text, _ = dialect_file(options if ".csv" in key else {"delimiter": "\t"}, 900, header, end)
    body = text.encode(options.get("encoding", "utf-8"))
    names = options["header"] if isinstance(options.get("header"), list) else None
    if options.get("header") == "none":
        names = ["col_1", "col_2", "col_3"]
    expected = reference_records(body, {"delimiter": "\t", **options}, names)
    compress = COMPRESS.get(key[-4:], lambda data: data)
    s3.put_object(Bucket=src, Key=f"in/{key}", Body=compress(body))
    result = await execute(client, worker.task_queue, job(src, out, **options), name)
    assert result.status == "succeeded"
    assert read_jsonl(s3, out, f"o/in/{key}/") == expected
    entry = file_entry(s3, out, f"in/{key}")
    assert (entry["records"], entry["rejected"], entry["chunks"]) == (900, 0, 3)


async def test_a_wrong_encoding_is_a_reject_or_a_bad_file_never_replaced_silently(
    client: Client, worker: Worker, s3: Any, buckets: tuple[str, str]
) -> None:
    src, out = buckets
    cp1252 = "id,price\n1,5 €\n2,7\n3,\u201cq\u201d\n".encode("cp1252")  # € and curly quotes: not UTF-8
    put_files(s3, src, {"in/cp1252.csv": cp1252, "in/utf16.csv": "id,price\n1,2\n".encode("utf-16")})
    result = await execute(client, worker.task_queue, job(src, out, max_failed_files=1), "wrong-encoding")
    assert result.status == "succeeded"
    entry = file_entry(s3, out, "in/cp1252.csv")
    assert (entry["status"], entry["records"], entry["records_written"], entry["rejected"]) == ("succeeded", 3, 1, 2)
    assert read_jsonl(s3, out, "o/in/cp1252.csv/") == [{"id": "2", "price": "7"}]
    reasons = [r["reason"] for r in entry["reject_reasons"]]
    assert all(reason.startswith("invalid UTF-8 at byte") for reason in reasons), reasons
    bad = file_entry(s3, out, "in/utf16.csv")
    assert bad["status"] == "failed" and bad["attempts"] == 1
    assert bad["error"].startswith(f"BadFile: s3://{src}/in/utf16.csv: the header row (line 1) cannot be read: invalid")


def test_the_reading_options_are_in_the_fingerprint_and_the_defaults_keep_it() -> None:
    base = {"fmt": "csv", "handler": "passthrough", "chunk_records": 300, "max_record_bytes": 1024}
    # What releases before the reading options computed (s3batch.checkpoint.fingerprint, v1).
    v1 = {"v": 1, "format": "csv", "gzip": False, "handler": "passthrough", "chunk_records": 300}
    v1["max_record_bytes"] = 1024
    before = hashlib.sha256(json.dumps(v1, sort_keys=True).encode()).hexdigest()[:16]
    default = Reading.of("a.csv", {}).changed()
    assert default == {}
    assert fingerprint(compression=None, reading=default, **base) == before
    v1["gzip"] = True
    gzipped = hashlib.sha256(json.dumps(v1, sort_keys=True).encode()).hexdigest()[:16]
    assert fingerprint(compression="gzip", **base) == gzipped
    others = [
        {"delimiter": ";"},
        {"quotechar": "'"},
        {"escapechar": "\\"},
        {"header": "none"},
        {"header": ["a", "b"]},
        {"encoding": "cp1252"},
        {"encoding": "utf-16"},
    ]
    shapes = {fingerprint(compression=None, reading=Reading.of("a.csv", o).changed(), **base) for o in others}
    assert len(shapes) == len(others) and before not in shapes
    # Spellings of one codec are one encoding; a .tsv is read with a tab.
    assert Reading.of("a.csv", {"encoding": "Latin-1"}) == Reading.of("a.csv", {"encoding": "iso8859_1"})
    assert Reading.of("a.TSV.gz", {}).delimiter == "\t"
    assert fingerprint(compression="zstd", **base) != fingerprint(compression=None, **base)


# ----------------------------------------------------------------------------------- JSON documents


def json_records(n: int) -> list[Any]:
    return [
        {"n": i, "big": 123456789012345678901234567890 + i, "x": 0.1, "nested": {"l": [i, "a]b", None], "s": '"{'}}
        for i in range(n)
    ]


async def test_json_documents_through_a_job_equal_json(
    client: Client, worker: Worker, s3: Any, buckets: tuple[str, str]
) -> None:
    src, out = buckets
    records = json_records(700)
    pretty = json.dumps(records, indent=2).encode()
    files = {
        "in/pretty.json": pretty,
        "in/minified.json": json.dumps(records, separators=(",", ":")).encode(),
        "in/one.json": json.dumps({"only": records[3]}).encode(),
        "in/packed.json.gz": gzip.compress(pretty),
        "in/lines.json": b"".join(json.dumps(r).encode() + b"\n" for r in records),  # JSON Lines named .json
    }
    put_files(s3, src, files)
    result = await execute(client, worker.task_queue, job(src, out), "json-docs")
    assert result.status == "succeeded"
    for key in ("in/pretty.json", "in/minified.json", "in/packed.json.gz", "in/lines.json"):
        assert read_jsonl(s3, out, f"o/{key}/") == json.loads(files["in/pretty.json"]), key
        entry = file_entry(s3, out, key)
        assert (entry["records"], entry["rejected"], entry["chunks"]) == (700, 0, 3), key
    assert read_jsonl(s3, out, "o/in/one.json/") == [{"only": records[3]}]
    # Exact numbers: the big integers are written with all their digits.
    body = s3.get_object(Bucket=out, Key="o/in/pretty.json/part-00000.jsonl")["Body"].read()
    assert b"123456789012345678901234567890" in body


async def test_json_documents_that_are_not_arrays_of_records_fail_naming_the_file(
    client: Client, worker: Worker, s3: Any, buckets: tuple[str, str]
) -> None:
    src, out = buckets
    good = json.dumps(json_records(400), indent=1)
    files = {
        "in/scalar.json": b'"just a string with secret"',
        "in/number.json": b"42",
        "in/no-comma.json": (good[:-2] + ' {"secret": 1}\n]').encode(),  # broken after 400 records
        "in/truncated.json": good[: len(good) // 2].encode(),
        "in/bad-record.json": b'[{"a": 1}, {"a": tru}, {"a": 3}]',  # one record invalid, its extent clear
    }
    put_files(s3, src, files)
    result = await execute(client, worker.task_queue, job(src, out, max_failed_files=10), "bad-json")
    assert result.status == "succeeded"
    for key, what in {
        "in/scalar.json": "it holds a single JSON string (line 1), not an array of records or an object",
        "in/number.json": "it holds a single JSON number",
        "in/no-comma.json": "expected ',' or ']' after the record that starts on line",
        "in/truncated.json": "it ends inside the record that starts on line",
    }.items():
        entry = file_entry(s3, out, key)
        assert entry["status"] == "failed" and entry["attempts"] == 1, (key, entry)
        assert entry["error"].startswith(f"BadFile: s3://{src}/{key}: {what}"), entry["error"]
        assert "secret" not in entry["error"]
    # Found after 300 records were committed: their parts are kept, the failure says so.
    assert "(300 records committed before)" in file_entry(s3, out, "in/no-comma.json")["error"]
    assert [cp.next_record for cp in committed_parts(s3, out, "o/in/no-comma.json/")] == [300]
    bad = file_entry(s3, out, "in/bad-record.json")
    assert (bad["status"], bad["records_written"], bad["rejected"]) == ("succeeded", 2, 1)


async def test_the_delimiter_hint_is_not_given_for_a_file_read_with_the_delimiter_set(
    client: Client, worker: Worker, s3: Any, buckets: tuple[str, str]
) -> None:
    # The hint ("looks ';'-separated, read as ','-separated") is about files read with ','.
    src, out = buckets
    semicolons = b"id;name\n" + b"".join(b"%d;n%d\n" % (i, i) for i in range(50))
    put_files(s3, src, {"in/a.csv": semicolons, "in/b.tsv": semicolons})
    result = await execute(client, worker.task_queue, job(src, out), "hint")
    assert result.status == "succeeded"
    assert file_entry(s3, out, "in/a.csv").get("warnings"), "read as ',': the hint is given"
    assert not file_entry(s3, out, "in/b.tsv").get("warnings"), "read as tab-separated: no ',' hint"


BAD_READING = [
    ({"delimiter": ";;"}, ["delimiter: must be exactly one character"]),
    ({"delimiter": "\n"}, ["delimiter: must be exactly one character, not a line break"]),
    ({"delimiter": ";", "quotechar": ";"}, ["delimiter and quotechar: must be different characters"]),
    ({"encoding": "klingon"}, ["encoding: unknown encoding 'klingon'"]),
    ({"encoding": "utf-32"}, ["encoding: 'utf-32' (UTF-32) is not read by s3batch"]),
    ({"encoding": "cp500"}, ["encoding: 'cp500' does not write ASCII characters and line ends as ASCII bytes"]),
    ({"encoding": "iso2022_jp"}, ["encoding: 'iso2022_jp' is a stateful encoding"]),
    ({"header": "top"}, ["header"]),
    ({"header": ["a", "a"]}, ["header: names 1 and 2 are the same"]),
    ({"encoding": "latin-1", "delimiter": "€"}, ["delimiter: '€' cannot be written in the encoding"]),
    ({"format": "xml"}, ["format:"]),
]


async def test_bad_reading_options_fail_the_job_at_start_naming_the_field(
    client: Client, worker: Worker, buckets: tuple[str, str]
) -> None:
    src, out = buckets
    ids = []
    for options, _ in BAD_READING:
        raw = {"bucket": src, "output_bucket": out, **options}  # JSON, as `temporal workflow start` sends it
        handle = await client.start_workflow(
            "S3BatchWorkflow", raw, id=new_id("bad-reading"), task_queue=worker.task_queue
        )
        ids.append(handle.id)
    for workflow_id, (_, fields) in zip(ids, BAD_READING, strict=True):
        await assert_invalid_input(client, workflow_id, fields)

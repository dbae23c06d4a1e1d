"""Property-based tests of the record parsers and of exact JSON values: search for counterexamples.

The references are the csv module itself (``csv.reader`` over ``io.StringIO(text, newline='')``,
``strict=True`` as the parser reads) and exact decimal arithmetic. Every property is bounded (a
fixed number of examples, no deadline) and reproducible: derandomized, without an example database,
so CI runs the same examples every time. Pure unit tests: no servers.
"""

from __future__ import annotations

import csv
import functools
import io
import json
from decimal import Decimal
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from s3batch.formats.common import Record
from s3batch.formats.csv import CsvParser
from s3batch.formats.fastcsv import FastCsvParser
from s3batch.formats.jsonl import JsonlParser
from s3batch.formats.parsers import make_parser as _make_parser
from s3batch.jsonvalues import _encode_slow, encode_json, inexact_positions, loads_exact, numbers_as_written
from tests.helpers.records import chunked, line_ends, walk

BOM = b"\xef\xbb\xbf"


def bounded(examples: int) -> settings:
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


def stream(data: bytes, sizes: list[int] | None) -> Any:
    return chunked(data, sizes)


read_sizes = st.one_of(st.none(), st.lists(st.integers(1, 40), min_size=1, max_size=4))

# Every CSV property holds for the exact parser and for the fast path (pyarrow blocks, here of a few
# bytes so that blocks end anywhere: inside a record, a quoted field, a CRLF, a character).
CSV_PARSERS = pytest.mark.parametrize(
    "csv_parser",
    [CsvParser, functools.partial(FastCsvParser, block_bytes=7), functools.partial(FastCsvParser, block_bytes=64)],
    ids=["exact", "fast-7", "fast-64"],
)


# ---------------------------------------------------------------------------------------------- CSV

_PIECES = ["a", "b1", " ", "é", "😀", "漢", ",", '"', '""', "\n", "\r", "\r\n", 'x"y', "\x00", "\t", "\ufeff"]
_NAMES = ["id", "a b", "é", "x,y", 'q"t', "l\nm", "n\rr", "0"]
_ENDS = ["\n", "\r", "\r\n"]


def _row(fields: list[str], end: str) -> str:
    out = io.StringIO()
    csv.writer(out, lineterminator=end).writerow(fields)
    return out.getvalue()


field_text = st.lists(st.sampled_from(_PIECES), max_size=5).map("".join)
csv_row = st.builds(_row, st.lists(field_text, min_size=1, max_size=4), st.sampled_from(_ENDS))
csv_body = st.lists(st.one_of(csv_row, csv_row, st.sampled_from(_PIECES)), max_size=25).map("".join)
csv_header = st.builds(
    _row, st.lists(st.sampled_from(_NAMES), min_size=1, max_size=4, unique=True), st.sampled_from(_ENDS)
)
csv_text = st.builds(lambda blank, header, body: blank + header + body, st.sampled_from(["", "\n", "\r\n\r"]),
                     csv_header, csv_body)


def reference_csv(text: str, max_bytes: int) -> tuple[list[str] | None, list[tuple[int, Any, str]]] | None:
    """What the csv module makes of ``text``: ``(header, [(line, value, kind)])`` with kind ``ok``,
    ``reject`` or ``long`` (more than ``max_bytes`` bytes from the record's start to its last line
    break); None when the file must be refused (its header cannot be read)."""
    pulled: list[str] = []

    def lines() -> Any:
        for line in io.StringIO(text, newline=""):
            pulled.append(line)
            yield line

    reader = csv.reader(lines(), strict=True)
    entries: list[tuple[int, list[str] | None, bool]] = []
    while True:
        start = reader.line_num + 1
        pulled.clear()
        try:
            row: list[str] | None = next(reader)
        except StopIteration:
            break
        except csv.Error:
            row = None
        size = sum(len(line.encode()) for line in pulled)
        last = pulled[-1] if pulled else ""
        size -= 2 if last.endswith("\r\n") else 1 if last.endswith(("\n", "\r")) else 0
        entries.append((start, row, size > max_bytes))
    header = None
    out: list[tuple[int, Any, str]] = []
    for start, row, long in entries:
        if header is None:
            if long or row is None:
                return None
            if not row:
                continue
            if len(set(row)) != len(row) or "" in row:
                return None
            header = row
            continue
        if long:
            out.append((start, None, "long"))
        elif row is None:
            out.append((start, None, "reject"))
        elif not row:
            continue
        elif len(row) != len(header):
            out.append((start, None, "reject"))
        else:
            out.append((start, dict(zip(header, row, strict=True)), "ok"))
    return header, out


def _kinds(records: list[Record]) -> list[tuple[int, Any, str]]:
    out = []
    for r in records:
        if r.error is None:
            out.append((r.line, r.value, "ok"))
        else:
            assert r.value is None
            out.append((r.line, None, "long" if "max_record_bytes" in r.error else "reject"))
    return out


@CSV_PARSERS
@bounded(500)
@given(text=csv_text, bom=st.booleans(), sizes=read_sizes)
def test_csv_reads_what_the_csv_module_reads(csv_parser: Any, text: str, bom: bool, sizes: list[int] | None) -> None:
    data = (BOM if bom else b"") + text.encode()
    expected = reference_csv(text, max_bytes=1 << 30)
    assert expected is not None  # the generated header is always readable
    parser = csv_parser(stream(data, sizes))
    records = list(parser)
    assert parser.header == expected[0]
    assert _kinds(records) == expected[1]
    assert parser.offset == len(data)
    assert parser.line == line_ends("csv", data) + 1 + (not data.endswith((b"\n", b"\r")) and bool(text))


@CSV_PARSERS
@bounded(500)
@given(text=csv_text, bom=st.booleans(), sizes=read_sizes, limit=st.integers(4, 48))
def test_csv_records_over_the_limit_are_rejects_and_the_rest_reads_as_the_csv_module_reads(
    csv_parser: Any, text: str, bom: bool, sizes: list[int] | None, limit: int
) -> None:
    data = (BOM if bom else b"") + text.encode()
    expected = reference_csv(text, max_bytes=limit)
    parser = csv_parser(stream(data, sizes), max_line_bytes=limit)
    if expected is None:
        try:
            iter(parser)
        except ValueError as err:
            assert "the header row" in str(err)
            return
        raise AssertionError("an unreadable header must refuse the file")
    records = list(parser)
    assert _kinds(records) == expected[1]
    assert parser.offset == len(data)


def _assert_exact_resume(fmt: str, data: bytes, limit: int, sizes: list[int] | None, kind: Any = None) -> None:
    def make_parser(fmt: str, stream: Any, **options: Any) -> Any:
        return kind(stream, **options) if kind is not None else _make_parser(fmt, stream, **options)

    full = make_parser(fmt, stream(data, sizes), max_line_bytes=limit)
    try:
        records, bounds = walk(full)
    except ValueError:
        return  # a refused file has no checkpoints
    assert full.offset == len(data)
    for i, (offset, line) in enumerate(bounds):
        assert line_ends(fmt, data[:offset]) + 1 == line or offset == len(data)
        resumed = make_parser(
            fmt,
            stream(data[offset:], sizes),
            offset=offset,
            line=line,
            header=full.header,
            max_line_bytes=limit,
        )
        rest, rest_bounds = walk(resumed)
        assert rest == records[i + 1 :], f"resume after record {i} (offset {offset}, line {line})"
        assert rest_bounds == bounds[i + 1 :]


@CSV_PARSERS
@bounded(200)
@given(text=csv_text, bom=st.booleans(), sizes=read_sizes, limit=st.sampled_from([8, 24, 1 << 20]))
def test_csv_resume_from_any_record_boundary_gives_the_same_records_and_offsets(
    csv_parser: Any, text: str, bom: bool, sizes: list[int] | None, limit: int
) -> None:
    _assert_exact_resume("csv", (BOM if bom else b"") + text.encode(), limit, sizes, csv_parser)


@CSV_PARSERS
@bounded(500)
@given(data=st.binary(max_size=300), sizes=read_sizes, limit=st.sampled_from([4, 30, 1 << 20]))
def test_csv_arbitrary_bytes_never_crash_the_parser(
    csv_parser: Any, data: bytes, sizes: list[int] | None, limit: int
) -> None:
    parser = csv_parser(stream(data, sizes), max_line_bytes=limit)
    try:
        records = iter(parser)
    except ValueError as err:
        assert "header row" in str(err)
        return
    for record in records:
        assert (record.value is None) == (record.error is not None)
        assert isinstance(record.line, int) and record.line >= 2
    assert parser.offset == len(data)


@CSV_PARSERS
@bounded(500)
@given(garbage=st.binary(max_size=200), sizes=read_sizes, limit=st.sampled_from([6, 40, 1 << 20]))
def test_csv_rows_after_garbage_are_all_read(
    csv_parser: Any, garbage: bytes, sizes: list[int] | None, limit: int
) -> None:
    # Without quotes, garbage ends at its last line break for the csv module; every row after it counts.
    head = b"a,b\n" + garbage.replace(b'"', b"'") + b"\n"
    rows = [(str(i), "é" * (i % 3)) for i in range(5)]
    data = head + "".join(f"{a},{b}\r\n" for a, b in rows).encode()
    records = list(csv_parser(stream(data, sizes), max_line_bytes=limit))
    first = line_ends("csv", head) + 1
    assert records[-5:] == [Record(first + i, {"a": a, "b": b}) for i, (a, b) in enumerate(rows)]


# --------------------------------------------------------------------------------------------- JSON


def _number_token(sign: bool, digits: str, fraction: str | None, exponent: tuple[str, str, int] | None) -> str:
    token = ("-" if sign else "") + digits
    if fraction is not None:
        token += "." + fraction
    if exponent is not None:
        marker, exponent_sign, value = exponent
        token += marker + exponent_sign + str(value)
    return token


number_tokens = st.one_of(
    st.integers(-(10**30), 10**30).map(str),
    st.sampled_from([2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1, 10**19, -(10**19)]).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.builds(
        _number_token,
        st.booleans(),
        st.from_regex(r"0|[1-9][0-9]{0,24}", fullmatch=True),
        st.one_of(st.none(), st.from_regex(r"[0-9]{1,24}", fullmatch=True)),
        st.one_of(st.none(), st.tuples(st.sampled_from("eE"), st.sampled_from(["", "+", "-"]), st.integers(0, 450))),
    ),
)
tricky_strings = st.one_of(st.text(max_size=12), st.from_regex(r'[0-9e.\-+"\\/ ]{0,30}', fullmatch=True))


def _as_expected(token: str) -> Any:
    """The exact value a number token denotes: ``int`` or ``Decimal``."""
    if any(c in token for c in ".eE"):
        return Decimal(token)
    return int(token)


json_trees = st.recursive(
    st.one_of(
        st.just(("null", None)),
        st.booleans().map(lambda b: ("bool", b)),
        number_tokens.map(lambda t: ("number", t)),
        tricky_strings.map(lambda s: ("string", s)),
    ),
    lambda children: st.one_of(
        st.lists(children, max_size=4).map(lambda items: ("array", items)),
        st.dictionaries(tricky_strings, children, max_size=4).map(lambda d: ("object", list(d.items()))),
    ),
    max_leaves=16,
)


def _text(tree: tuple[str, Any], spaced: bool, ascii_only: bool) -> str:
    kind, payload = tree
    comma, colon = (", ", ": ") if spaced else (",", ":")
    if kind == "null":
        return "null"
    if kind == "bool":
        return "true" if payload else "false"
    if kind == "number":
        return payload
    if kind == "string":
        return _string(payload, ascii_only)
    if kind == "array":
        return "[" + comma.join(_text(item, spaced, ascii_only) for item in payload) + "]"
    return "{" + comma.join(_string(k, ascii_only) + colon + _text(v, spaced, ascii_only) for k, v in payload) + "}"


def _string(value: str, ascii_only: bool) -> str:
    return json.dumps(value, ensure_ascii=ascii_only)


def _expected(tree: tuple[str, Any]) -> Any:
    kind, payload = tree
    if kind == "number":
        return _as_expected(payload)
    if kind == "array":
        return [_expected(item) for item in payload]
    if kind == "object":
        return {k: _expected(v) for k, v in payload}
    return payload


def _same(parsed: Any, expected: Any) -> bool:
    """``parsed`` holds exactly the values of ``expected`` (numbers compared as exact decimals)."""
    if isinstance(expected, bool) or expected is None or isinstance(expected, str):
        return type(parsed) is type(expected) and parsed == expected
    if isinstance(expected, int):
        return type(parsed) is int and parsed == expected
    if isinstance(expected, Decimal):
        if type(parsed) is float:
            return Decimal(repr(parsed)) == expected
        return type(parsed) is Decimal and parsed == expected
    if isinstance(expected, list):
        return type(parsed) is list and len(parsed) == len(expected) and all(map(_same, parsed, expected))
    return (
        type(parsed) is dict
        and list(parsed) == list(expected)
        and all(_same(parsed[k], expected[k]) for k in expected)
    )


def _exact(number: Any) -> Decimal:
    return Decimal(repr(number)) if type(number) is float else Decimal(number)


def _same_values(a: Any, b: Any) -> bool:
    """The same values all the way down, numbers by their exact decimal value (JSON has one number
    type: ``Decimal('10000000000000001')`` written and read back is the int ``10000000000000001``)."""
    numbers = (int, float, Decimal)
    if type(a) in numbers and type(b) in numbers and bool not in (type(a), type(b)):
        return _exact(a) == _exact(b) and (type(a) is not float or repr(a) == repr(b) or type(b) is not float)
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(map(_same_values, a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same_values(a[k], b[k]) for k in a)
    return bool(a == b)


@bounded(600)
@given(tree=json_trees, spaced=st.booleans(), ascii_only=st.booleans(), eol=st.sampled_from([b"\n", b"\r\n"]))
def test_jsonl_values_round_trip_exactly_through_parse_and_encode_json(
    tree: tuple[str, Any], spaced: bool, ascii_only: bool, eol: bytes
) -> None:
    line = _text(tree, spaced, ascii_only).encode()
    records = list(JsonlParser(io.BytesIO(b"0\n" + line + eol)))
    assert records[0] == Record(1, 0)
    assert records[1].error is None, (line, records[1].error)
    value = records[1].value
    assert _same(value, _expected(tree)), (line, value)
    written = encode_json(value)
    again = list(JsonlParser(io.BytesIO(written)))
    assert len(again) == 1 and _same_values(again[0].value, value), (written, again)
    assert encode_json(again[0].value) == written  # written once, the bytes are stable


@bounded(3000)
@given(token=number_tokens, before=tricky_strings, after=tricky_strings)
def test_every_number_orjson_would_change_is_found(token: str, before: str, after: str) -> None:
    # No false negatives: a line whose numbers orjson does not read exactly is never left to orjson.
    line = ("[" + _string(before, False) + ", " + token + ", " + _string(after, False) + "]").encode()
    exact = _as_expected(token)
    try:
        fast = orjson.loads(line)[1]
    except orjson.JSONDecodeError:
        fast = None  # refused by orjson: the parser retries such lines exactly anyway
    if fast is not None and not _same(fast, exact):
        assert inexact_positions(line), line
    assert _same(loads_exact(line)[1], exact)


@bounded(1000)
@given(tree=json_trees, spaced=st.booleans(), ascii_only=st.booleans())
def test_numbers_as_written_never_clears_a_line_orjson_changes(
    tree: tuple[str, Any], spaced: bool, ascii_only: bool
) -> None:
    line = _text(tree, spaced, ascii_only).encode()
    try:
        value = orjson.loads(line)
    except orjson.JSONDecodeError:
        return
    if numbers_as_written(line, value):
        assert _same(value, _expected(tree)), line


orjson_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**63), 2**64 - 1),
        st.floats(),
        st.text(max_size=8),
    ),
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.lists(children, max_size=3).map(tuple),
        st.dictionaries(st.text(max_size=5), children, max_size=4),
    ),
    max_leaves=20,
)


@bounded(500)
@given(value=orjson_values)
def test_encode_json_writes_the_bytes_of_orjson_wherever_orjson_can(value: Any) -> None:
    expected = orjson.dumps(value)
    assert encode_json(value) == expected
    assert _encode_slow(value) == expected  # the path taken for big integers and deep nesting


@bounded(60)
@given(depth=st.integers(200, 1024), inner=json_trees)
def test_deep_values_round_trip_exactly(depth: int, inner: tuple[str, Any]) -> None:
    line = b"[" * (depth - 1) + _text(inner, False, False).encode() + b"]" * (depth - 1)
    [record] = list(JsonlParser(io.BytesIO(line)))
    if record.error is not None:  # the inner value added levels past the limit
        assert "nested deeper than 1024 levels" in record.error
        return
    written = encode_json(record.value)
    assert list(JsonlParser(io.BytesIO(written))) == [Record(1, record.value)]


jsonl_lines = st.lists(
    st.one_of(
        st.builds(_text, json_trees, st.booleans(), st.booleans()),
        st.sampled_from(["", "  ", "\t", "{bad", '{"a": 1', "[1e400]", "[1e-400]", '"\\ud800"', "1 2"]),
    ),
    max_size=20,
)


@bounded(200)
@given(lines=jsonl_lines, bom=st.booleans(), sizes=read_sizes, limit=st.sampled_from([6, 40, 1 << 20]),
       crlf=st.booleans(), last_eol=st.booleans())
def test_jsonl_resume_from_any_record_boundary_gives_the_same_records_and_offsets(
    lines: list[str], bom: bool, sizes: list[int] | None, limit: int, crlf: bool, last_eol: bool
) -> None:
    eol = "\r\n" if crlf else "\n"
    text = "0" + eol + eol.join(lines) + (eol if last_eol else "")
    _assert_exact_resume("jsonl", (BOM if bom else b"") + text.encode(), limit, sizes)


@bounded(500)
@given(garbage=st.binary(max_size=300), sizes=read_sizes, limit=st.sampled_from([29, 40, 1 << 20]))
def test_jsonl_arbitrary_bytes_never_crash_and_lines_after_them_are_all_read(
    garbage: bytes, sizes: list[int] | None, limit: int
) -> None:
    head = b'{"first": 0}\n' + garbage + b"\n"
    tail = [1, {"k": "é"}, [12345678901234567890123, 0.5], "x", None]
    data = head + b"\n".join(map(encode_json, tail)) + b"\n"
    parser = JsonlParser(stream(data, sizes), max_line_bytes=limit)
    records = list(parser)
    for record in records:
        assert record.error is None or record.value is None
    first = head.count(b"\n") + 1
    assert records[-5:] == [Record(first + i, v) for i, v in enumerate(tail)]
    assert parser.offset == len(data)

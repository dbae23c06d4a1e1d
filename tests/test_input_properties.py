"""Property tests of the reading options (issue 14): for random CSV dialects, header modes and
encodings (UTF-16 included), the parser reads what the csv module reads from the decoded text, and a
parser started at any record boundary (byte offset and line of a checkpoint) reads exactly the rest.
Pure unit tests (no servers), bounded and derandomized like ``test_records_properties``."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from s3batch.formats.common import Record
from s3batch.formats.csv import CsvParser, read_csv_header
from s3batch.formats.csv_header import generated_names
from s3batch.formats.json import JsonDocumentParser, looks_like_json_lines
from s3batch.formats.transcode import utf16_byte_order
from s3batch.reading import Reading
from tests.helpers.records import chunked, walk


def bounded(examples: int) -> settings:
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


def stream(data: bytes, sizes: list[int] | None) -> Any:
    return chunked(data, sizes, 16)


ENCODINGS = ["utf-8", "latin-1", "cp1252", "utf-16", "utf-16-le", "utf-16-be", "shift_jis"]
_PIECES = ["a", "b1", " ", "é", "€", "😀", "漢", "\n", "\r", "\r\n", "x\"y", "'", "\x00"]
_ENDS = ["\n", "\r", "\r\n"]

dialects = st.fixed_dictionaries(
    {
        "delimiter": st.sampled_from([",", ";", "\t", "|", "§"]),
        "quotechar": st.sampled_from(['"', "'"]),
        "escapechar": st.sampled_from([None, "\\", "~"]),
        "header": st.sampled_from(["first_row", "none", ["p", "q", "r"]]),
        "encoding": st.sampled_from(ENCODINGS),
    }
)


def encodable(text: str, encoding: str) -> bool:
    try:
        text.encode(encoding)
    except UnicodeEncodeError:
        return False
    return True


@st.composite
def csv_files(draw: Any) -> tuple[dict[str, Any], str]:
    options = draw(dialects)
    delimiter, quote, escape = options["delimiter"], options["quotechar"], options["escapechar"]
    if not encodable(delimiter, options["encoding"]):
        options["delimiter"] = delimiter = ";"
    candidates = [*_PIECES, delimiter, quote, quote * 2] + ([escape] if escape else [])
    pieces = [p for p in candidates if encodable(p, options["encoding"])]
    field = st.lists(st.sampled_from(pieces), max_size=4).map("".join)

    def row(fields: list[str], end: str) -> str:
        out = io.StringIO()
        csv.writer(out, delimiter=delimiter, quotechar=quote, escapechar=escape, lineterminator=end).writerow(fields)
        return out.getvalue()

    rows = st.builds(row, st.lists(field, min_size=1, max_size=3), st.sampled_from(_ENDS))
    body = draw(st.lists(st.one_of(rows, rows, st.sampled_from(pieces)), max_size=20).map("".join))
    head = row(["p", "q", "r"], draw(st.sampled_from(_ENDS))) if options["header"] == "first_row" else ""
    return options, head + body


def reference(text: str, options: dict[str, Any]) -> tuple[list[str] | None, list[tuple[int, Any, bool]]] | None:
    """The csv module over the decoded text: ``(names, [(line, value or None, ok)])``; None when the
    file is refused (with ``header: none``, a first row that is not valid CSV)."""
    reader = csv.reader(
        io.StringIO(text, newline=""),
        delimiter=options["delimiter"],
        quotechar=options["quotechar"],
        escapechar=options["escapechar"],
        strict=True,
    )
    names = options["header"] if isinstance(options["header"], list) else None
    out: list[tuple[int, Any, bool]] = []
    while True:
        start = reader.line_num + 1
        try:
            row: list[str] | None = next(reader)
        except StopIteration:
            break
        except csv.Error:
            row = None
        if names is None:
            if row is None:
                return None
            if not row:
                continue
            if options["header"] == "first_row":
                names = row
                continue
            names = generated_names(len(row))
        if row is None:
            out.append((start, None, False))
        elif not row:
            continue
        elif len(row) != len(names):
            out.append((start, None, False))
        else:
            out.append((start, dict(zip(names, row, strict=True)), True))
    return names, out


def kinds(records: list[Record]) -> list[tuple[int, Any, bool]]:
    return [(r.line, r.value, r.error is None) for r in records]


@bounded(400)
@given(
    file=csv_files(), bom=st.booleans(), sizes=st.one_of(st.none(), st.lists(st.integers(1, 9), max_size=3, min_size=1))
)
def test_every_dialect_and_encoding_reads_as_the_csv_module_and_resumes_at_every_record(
    file: tuple[dict[str, Any], str], bom: bool, sizes: list[int] | None
) -> None:
    options, text = file
    encoding = options["encoding"]
    data = text.encode(encoding)  # utf-16 writes its BOM (little-endian here)
    if bom and encoding in ("utf-8", "utf-16-le", "utf-16-be"):
        data = "\ufeff".encode(encoding) + data
    if text.startswith("\ufeff") or (encoding not in ("utf-8",) and text.startswith("\x00")):
        return
    reading = Reading.of("f.csv", options)
    found = reference(text, options)
    parser = CsvParser(stream(data, sizes), reading=reading)
    if found is None:
        try:
            iter(parser)
        except ValueError as err:
            assert "the first row" in str(err)
            return
        raise AssertionError("a first row that is not CSV must refuse the file")
    names, expected = found
    records, bounds = walk(parser)
    assert kinds(records) == expected
    assert parser.offset == len(data)
    if names is not None and records:
        assert parser.header == names
    # Resume at every record boundary as a new attempt does: the header (or the first row's width)
    # and, for utf-16, the byte order read again from the start of the object.
    for i, (offset, line) in enumerate(bounds):
        resumed_reading = reading
        if encoding == "utf-16":
            codec, _ = utf16_byte_order(data[:2], "utf-16")
            resumed_reading = Reading.of("f.csv", {**options, "encoding": codec})
        header = None if reading.names else read_csv_header(io.BytesIO(data), reading=reading)
        resumed = CsvParser(
            stream(data[offset:], sizes), offset=offset, line=line, header=header, reading=resumed_reading
        )
        rest, rest_bounds = walk(resumed)
        assert kinds(rest) == kinds(records[i + 1 :]), f"resumed after record {i} at byte {offset}"
        assert rest_bounds == bounds[i + 1 :]


@bounded(300)
@given(file=csv_files(), limit=st.integers(4, 40))
def test_records_over_the_limit_skip_exactly_in_every_dialect(file: tuple[dict[str, Any], str], limit: int) -> None:
    """A record longer than max_record_bytes is skipped by the byte scan of the dialect: the records
    after it are read exactly as without the limit (same lines, values), and resume stays exact."""
    options, text = file
    if options["encoding"] == "shift_jis":  # its second bytes can be ASCII (documented limit of the scan)
        options["encoding"] = "utf-8"
    data = text.encode(options["encoding"])
    reading = Reading.of("f.csv", options)
    try:
        full = kinds(list(CsvParser(io.BytesIO(data), reading=reading)))
        parser = CsvParser(io.BytesIO(data), reading=reading, max_line_bytes=limit)
        records, _ = walk(parser)
    except ValueError as err:  # a header or first row over the limit (or not CSV) refuses the file
        assert "longer than max_record_bytes" in str(err) or "not valid CSV" in str(err)
        return
    assert parser.offset == len(data)
    long = [r for r in records if r.error is not None and "max_record_bytes" in r.error]
    kept = [k for k in kinds(records) if k[0] not in {r.line for r in long}]
    assert kept == [k for k in full if k[0] not in {r.line for r in long}]
    assert [r.line for r in records] == [k[0] for k in full]


def test_an_escaped_line_break_continues_a_long_record_in_the_scan() -> None:
    # The skip scan follows the reader's state across lines: an escaped line break goes on in an
    # unquoted field (the next line starts inside it, not inside quotes), a quoted one in quotes.
    reading = Reading.of("f.csv", {"escapechar": "\\"})
    cases = [
        b"a,b\n1,x\\\n" + b"y" * 30 + b"\n2,3\n",  # the escaped LF is on the long line
        b"a,b\n1,x\\\n" + b"y" * 30 + b'"\n2,3\n',
        b"a,b\n1,x\\\nyy\\\n" + b"y" * 30 + b"\n2,3\n",  # it goes long on its third line
        b'a,b\n1,"x\\\n' + b"y" * 30 + b'"\n2,3\n',
        b"a,b\n1,x\\\r\n2,3\n",  # an escaped CR of a CRLF: the LF ends the record
    ]
    for data in cases:
        full = kinds(list(CsvParser(io.BytesIO(data), reading=reading)))
        limited = kinds(list(CsvParser(io.BytesIO(data), reading=reading, max_line_bytes=12)))
        assert limited[-1] == full[-1] == (full[-1][0], {"a": "2", "b": "3"}, True), data
        assert len(limited) == len(full), data


# ----------------------------------------------------------------------------------- JSON documents

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(alphabet=st.sampled_from(list('ab"\\\n ]}[{,é😀')), max_size=6),
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.sampled_from(["k", "l]", 'q"', "{"]), inner, max_size=3),
    max_leaves=8,
)


@st.composite
def json_documents(draw: Any) -> tuple[bytes, list[Any]]:
    records = draw(st.lists(json_values, max_size=12))
    indent = draw(st.sampled_from([None, 0, 2, "\t"]))
    separators = draw(st.sampled_from([(",", ":"), (", ", ": "), (" ,\n", " : ")]))
    text = json.dumps(records, indent=indent, separators=separators, ensure_ascii=draw(st.booleans()))
    prefix = draw(st.sampled_from(["", "\n", "  \r\n", "\ufeff"]))
    return (prefix + text + draw(st.sampled_from(["", "\n", " \n\n"]))).encode(), records


@bounded(400)
@given(doc=json_documents(), sizes=st.one_of(st.none(), st.lists(st.integers(1, 9), min_size=1, max_size=3)))
def test_a_json_array_reads_as_json_does_and_resumes_at_every_record(
    doc: tuple[bytes, list[Any]], sizes: list[int] | None
) -> None:
    data, expected = doc
    parser = JsonDocumentParser(stream(data, sizes))
    records, bounds = walk(parser)
    if looks_like_json_lines(data):  # a pretty-printed array never is; a one-element array of lines may be
        return
    assert [r.value for r in records] == expected
    assert all(r.error is None for r in records)
    for i, (offset, line) in enumerate(bounds):
        assert data[:offset].count(b"\n") + 1 == line
        resumed = JsonDocumentParser(stream(data[offset:], sizes), offset=offset, line=line, head=data)
        rest, rest_bounds = walk(resumed)
        assert rest == records[i + 1 :], f"resumed after record {i} at byte {offset}"
        assert rest_bounds == bounds[i + 1 :]


@bounded(200)
@given(doc=json_documents(), limit=st.integers(2, 30))
def test_json_records_over_the_limit_are_rejects_and_the_rest_is_exact(
    doc: tuple[bytes, list[Any]], limit: int
) -> None:
    data, expected = doc
    if looks_like_json_lines(data):
        return
    records, _ = walk(JsonDocumentParser(io.BytesIO(data), max_line_bytes=limit))
    assert len(records) == len(expected)
    for record, value in zip(records, expected, strict=True):
        if record.error is not None:
            assert "longer than max_record_bytes" in record.error
        else:
            assert record.value == value


def test_a_json_file_of_json_lines_reads_and_resumes_as_json_lines() -> None:
    # BigQuery and Firehose write JSON Lines named .json: read as the JSONL reader reads them, and a
    # resumed attempt tells it from the same first bytes (here the second line ends past the first
    # block the parser reads, so a decision on fewer bytes than a resumed attempt reads would differ).
    long = json.dumps({"pad": "x" * 300_000}).encode()
    for data in (b'{"a": 1}\n' + long + b'\n{"a": [2]}\n', b'[1, 2]\n[3]\n', b'\xef\xbb\xbf{"a": 1}\n{"a": 2}'):
        records, bounds = walk(JsonDocumentParser(io.BytesIO(data)))
        lines = [json.loads(line) for line in data.removeprefix(b"\xef\xbb\xbf").split(b"\n") if line]
        assert [r.value for r in records] == lines
        for i, (offset, line) in enumerate(bounds):
            resumed = JsonDocumentParser(io.BytesIO(data[offset:]), offset=offset, line=line, head=data)
            rest, rest_bounds = walk(resumed)
            assert rest == records[i + 1 :] and rest_bounds == bounds[i + 1 :]
    # A document spread over lines is not JSON Lines, even when its first line is valid JSON.
    assert [r.value for r in JsonDocumentParser(io.BytesIO(b'[\n{"a": 1},\n{"a": 2}\n]'))] == [{"a": 1}, {"a": 2}]


def test_json_elements_over_the_limit_are_rejects_and_invalid_ones_are_rejects_with_their_line() -> None:
    data = b'[\n {"a": "' + b"x" * 50 + b'"},\n {"a": nope},\n [1, {"b": "]"}],\n 7\n]'
    records, bounds = walk(JsonDocumentParser(io.BytesIO(data), max_line_bytes=20))
    assert [(r.line, r.value, (r.error or "")[:40]) for r in records] == [
        (2, None, "record is longer than max_record_bytes ("),
        (3, None, "invalid JSON: invalid literal, expected "),
        (4, [1, {"b": "]"}], ""),
        (5, 7, ""),
    ]
    assert bounds[-1] == (len(data) - 1, 6)  # at the closing ']'

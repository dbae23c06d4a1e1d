"""Unit tests of the record parsers: RFC 4180 CSV, JSONL, and above all exact resume positions.

Pure unit tests: no servers. Randomised inputs use fixed seeds, so a failure is reproducible.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import random
import tracemalloc
from decimal import Decimal
from typing import Any

import pytest

from s3batch.errors import UnknownFormatError
from s3batch.formats.common import Record
from s3batch.formats.csv import CsvParser, read_csv_header
from s3batch.formats.jsonl import JsonlParser
from s3batch.formats.keys import resolve_format
from s3batch.formats.parsers import make_parser
from s3batch.handlers import get_handler
from s3batch.jsonvalues import encode_json
from s3batch.reading import Reading
from tests.helpers.records import line_ends, walk

BOM = b"\xef\xbb\xbf"


def parse_csv(data: bytes, **kwargs: Any) -> list[Record]:
    return list(CsvParser(io.BytesIO(data), **kwargs))


def parse_jsonl(data: bytes, **kwargs: Any) -> list[Record]:
    return list(JsonlParser(io.BytesIO(data), **kwargs))


def ok(records: list[Record]) -> list[tuple[int, Any]]:
    return [(r.line, r.value) for r in records if r.error is None]


class TrickleRaw(io.RawIOBase):
    """A raw stream that hands out at most ``step`` bytes per read, so multi-byte characters and
    CRLF pairs straddle every possible read boundary; also records the largest read."""

    def __init__(self, data: bytes, step: int) -> None:
        super().__init__()
        self._data = memoryview(data)
        self._pos = 0
        self._step = step

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = min(len(buffer), self._step, len(self._data) - self._pos)
        buffer[:n] = self._data[self._pos : self._pos + n]
        self._pos += n
        return n


class LargestReadline(io.BytesIO):
    """A BytesIO that records the largest piece any ``readline``/``read`` call returned."""

    largest = 0

    def readline(self, size: int | None = -1) -> bytes:  # type: ignore[override]
        out = super().readline(size)
        self.largest = max(self.largest, len(out))
        return out

    def read(self, size: int | None = -1) -> bytes:
        out = super().read(size)
        self.largest = max(self.largest, len(out))
        return out


# ---------------------------------------------------------------------------------------------- CSV


def test_csv_basic_header_and_values() -> None:
    records = parse_csv(b"id,name\n1,alice\n2,bob\n")
    assert records == [Record(2, {"id": "1", "name": "alice"}), Record(3, {"id": "2", "name": "bob"})]


def test_csv_quoted_commas_quotes_and_embedded_newlines() -> None:
    data = b'id,note,n\n1,"a, b",x\n2,"line1\nline2\r\nline3",y\n3,"say ""hi""",z\n4,"",\n'
    assert parse_csv(data) == [
        Record(2, {"id": "1", "note": "a, b", "n": "x"}),
        Record(3, {"id": "2", "note": "line1\nline2\r\nline3", "n": "y"}),
        Record(6, {"id": "3", "note": 'say "hi"', "n": "z"}),
        Record(7, {"id": "4", "note": "", "n": ""}),
    ]


def test_csv_crlf_line_endings_are_not_part_of_values() -> None:
    data = b"a,b\r\n1,2\r\n3,4\r\n"
    parser = CsvParser(io.BytesIO(data))
    assert list(parser) == [Record(2, {"a": "1", "b": "2"}), Record(3, {"a": "3", "b": "4"})]
    assert parser.header == ["a", "b"]
    assert parser.offset == len(data)
    assert parser.line == 4


def test_csv_utf8_bom_is_stripped_from_the_first_column_name() -> None:
    parser = CsvParser(io.BytesIO(BOM + b"id,name\n1,x\n"))
    assert list(parser) == [Record(2, {"id": "1", "name": "x"})]
    assert parser.header == ["id", "name"]


def test_csv_bom_is_only_stripped_at_the_start_of_the_object() -> None:
    # A BOM-like sequence at the start of a resumed range is data, not a BOM.
    data = b"a,b\n" + BOM + b"x,y\n"
    assert parse_csv(data[4:], offset=4, line=2, header=["a", "b"]) == [Record(2, {"a": "\ufeffx", "b": "y"})]


def test_csv_multibyte_utf8() -> None:
    data = "name,city\nJosé,Zürich\n漢字,😀 €\n".encode()
    assert parse_csv(data) == [
        Record(2, {"name": "José", "city": "Zürich"}),
        Record(3, {"name": "漢字", "city": "😀 €"}),
    ]


def test_csv_multibyte_utf8_straddling_every_read_boundary() -> None:
    text = "name,city\n" + "".join(f'{i}😀é,"漢\r\n字€"\r\n' for i in range(50))
    data = text.encode()
    expected = parse_csv(data)
    assert len(expected) == 50 and expected[3] == Record(8, {"name": "3😀é", "city": "漢\r\n字€"})
    for step in (1, 2, 3, 5):
        stream = io.BufferedReader(TrickleRaw(data, step), buffer_size=4)
        parser = CsvParser(stream)
        assert list(parser) == expected
        assert parser.offset == len(data)


def test_csv_blank_lines_are_skipped_and_line_numbers_stay_physical() -> None:
    data = b"a,b\n\n1,2\r\n\r\n\n3,4\n\n"
    assert parse_csv(data) == [Record(3, {"a": "1", "b": "2"}), Record(6, {"a": "3", "b": "4"})]


def test_csv_blank_lines_before_the_header_are_skipped() -> None:
    parser = CsvParser(io.BytesIO(b"\n\r\na,b\n1,2\n"))
    assert list(parser) == [Record(4, {"a": "1", "b": "2"})]
    assert parser.header == ["a", "b"]


def test_csv_wrong_column_count_is_a_reject_with_its_line() -> None:
    records = parse_csv(b"a,b,c\n1,2,3\n1,2\n1,2,3,4\n4,5,6\n")
    assert records == [
        Record(2, {"a": "1", "b": "2", "c": "3"}),
        Record(3, None, "expected 3 fields (as in the header), got 2"),
        Record(4, None, "expected 3 fields (as in the header), got 4"),
        Record(5, {"a": "4", "b": "5", "c": "6"}),
    ]


def test_csv_unterminated_quote_at_end_of_file_is_a_reject() -> None:
    data = b'a,b\n1,2\n3,"never closed\nmore\n'
    parser = CsvParser(io.BytesIO(data))
    records = list(parser)
    assert records[0] == Record(2, {"a": "1", "b": "2"})
    assert len(records) == 2
    assert records[1].line == 3 and records[1].value is None
    assert records[1].error == "malformed CSV (unexpected end of data) in lines 3-4"
    assert parser.offset == len(data)


def test_csv_quote_inside_an_unquoted_field_is_kept_as_data() -> None:
    # RFC 4180 forbids it, but it is unambiguous and common: the quote is part of the value.
    assert parse_csv(b'a,b\n5" screen,x\n') == [Record(2, {"a": '5" screen', "b": "x"})]


def test_csv_text_after_a_closing_quote_is_a_reject_and_parsing_continues() -> None:
    records = parse_csv(b'a,b\n"x"y,1\n2,3\n')
    assert records[0].line == 2 and records[0].value is None
    assert records[0].error is not None and records[0].error.startswith("malformed CSV (")
    assert records[0].error.endswith("in lines 2-2")
    assert records[1:] == [Record(3, {"a": "2", "b": "3"})]


def test_csv_invalid_utf8_is_a_reject_with_its_line() -> None:
    records = parse_csv(b"a,b\n1,2\nbad\xff\xfe,3\n4,5\n")
    assert records == [
        Record(2, {"a": "1", "b": "2"}),
        Record(3, None, "invalid UTF-8 at byte 3 of the line"),
        Record(4, {"a": "4", "b": "5"}),
    ]


def test_csv_invalid_utf8_inside_a_multiline_record_rejects_that_record_at_its_first_line() -> None:
    records = parse_csv(b'a,b\n1,"ok\nbad\xc3(\nstill"\n4,5\n')
    assert records == [Record(2, None, "invalid UTF-8 at byte 3 of the line"), Record(5, {"a": "4", "b": "5"})]


def test_csv_truncated_multibyte_character_at_end_of_file_is_a_reject() -> None:
    records = parse_csv("a,b\n1,2\n3,€".encode()[:-1])
    assert records[0] == Record(2, {"a": "1", "b": "2"})
    assert records[1] == Record(3, None, "invalid UTF-8 at byte 2 of the line")


def test_csv_nul_byte_is_data() -> None:
    # Python 3.11+ csv accepts NUL; it must neither raise nor disturb the following records.
    assert parse_csv(b"a,b\n1,x\x00y\n2,z\n") == [Record(2, {"a": "1", "b": "x\x00y"}), Record(3, {"a": "2", "b": "z"})]


def test_csv_field_larger_than_csv_module_default_limit_is_accepted() -> None:
    # csv's default field_size_limit is 128 KiB; max_line_bytes is what decides.
    big = "é" * 200_000
    records = parse_csv(f"a,b\n{big},1\n2,3\n".encode())
    assert records == [Record(2, {"a": big, "b": "1"}), Record(3, {"a": "2", "b": "3"})]


@pytest.mark.parametrize("ending", [b"\n", b"\r\n", b""])
def test_csv_line_of_exactly_max_line_bytes_is_accepted_and_one_more_byte_is_not(ending: bytes) -> None:
    limit = 100
    fits = b"x" * (limit - 2) + b",1"
    assert parse_csv(b"a,b\n" + fits + ending, max_line_bytes=limit) == [Record(2, {"a": "x" * (limit - 2), "b": "1"})]
    too_long = b"y" + fits
    assert parse_csv(b"a,b\n" + too_long + ending, max_line_bytes=limit) == [
        Record(2, None, f"line is longer than max_record_bytes ({limit} bytes)")
    ]


def test_csv_huge_line_is_a_reject_and_never_held_in_memory() -> None:
    limit = 64 * 1024
    huge = b"z" * (5 * 1024 * 1024)
    data = b"a,b\n1,2\n" + huge + b",3\n4,5\n"
    stream = LargestReadline(data)
    tracemalloc.start()
    try:
        parser = CsvParser(stream, max_line_bytes=limit)
        records = list(parser)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert records == [
        Record(2, {"a": "1", "b": "2"}),
        Record(3, None, f"line is longer than max_record_bytes ({limit} bytes)"),
        Record(4, {"a": "4", "b": "5"}),
    ]
    assert parser.offset == len(data)
    assert stream.largest <= 1024 * 1024 + 1, stream.largest
    assert peak < 3 * 1024 * 1024, peak


def test_csv_huge_line_inside_a_quoted_field_keeps_the_record_boundaries() -> None:
    # The skipped line closes a quoted field opened on the line before: the records after it
    # must still start where they do in the file.
    limit = 1024
    data = b'a,b\n1,"opens\n' + b"q" * 5000 + b'",closes\n2,3\n4,"x\n' + b'y"' * 3000 + b'\nz"\n5,6\n'
    records = parse_csv(data, max_line_bytes=limit)
    # Line 6 ends record 5 for the csv module (text after the closing quote of `"x\ny"`), so `z"` on
    # line 7 is a record of its own, with one field; an even count of quotes in line 6 says nothing.
    assert records == [
        Record(2, None, f"line is longer than max_record_bytes ({limit} bytes)"),
        Record(4, {"a": "2", "b": "3"}),
        Record(5, None, f"line is longer than max_record_bytes ({limit} bytes)"),
        Record(7, None, "expected 2 fields (as in the header), got 1"),
        Record(8, {"a": "5", "b": "6"}),
    ]
    # The same record boundaries as the csv module itself, reading everything.
    reference = csv.reader(io.StringIO(data.decode(), newline=""), strict=True)
    ends = []
    with pytest.raises(csv.Error):
        for _ in range(4):
            next(reference)
            ends.append(reference.line_num)
    assert ends == [1, 3, 4]
    assert reference.line_num == 6
    assert [next(reference), next(reference)] == [['z"'], ["5", "6"]]


def test_csv_over_long_line_with_a_literal_quote_keeps_every_following_row() -> None:
    # `12"inch` in an unquoted field: the quote is data (the csv module reads it so), so the skipped
    # line opens no quoted field. An odd quote count used to swallow the rest of the file.
    limit = 1024
    long_line = b'1,12"inch ' + b"x" * 3000 + b"\n"
    rows = b"".join(b"%d,r%d\n" % (i, i) for i in range(2, 7))
    data = b"a,b\n" + long_line + rows
    assert parse_csv(data, max_line_bytes=limit) == [
        Record(2, None, f"line is longer than max_record_bytes ({limit} bytes)"),
        *[Record(i + 1, {"a": str(i), "b": f"r{i}"}) for i in range(2, 7)],
    ]
    # The same over-long line in a quoted field that it closes, and inside one it keeps open.
    opens = b'1,"' + b"y" * 3000 + b"\n" + b'more"\n2,r2\n'
    assert parse_csv(b"a,b\n" + opens, max_line_bytes=limit) == [
        Record(2, None, f"line is longer than max_record_bytes ({limit} bytes)"),
        Record(4, {"a": "2", "b": "r2"}),
    ]
    reference = list(csv.reader(io.StringIO((b"a,b\n" + opens).decode(), newline="")))
    assert reference[2] == ["2", "r2"]


def test_csv_record_longer_than_the_limit_in_total_is_a_reject_and_never_held_in_memory() -> None:
    # A quoted field of many short lines: no line is too long, the record is.
    limit = 64 * 1024
    field = b"z" * 50 + b"\n"
    data = b"a,b\n1,2\n3,\"" + field * 100_000 + b'end"\n4,5\n'
    tracemalloc.start()
    try:
        parser = CsvParser(io.BytesIO(data), max_line_bytes=limit)
        records = list(parser)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert records == [
        Record(2, {"a": "1", "b": "2"}),
        Record(3, None, f"record is longer than max_record_bytes ({limit} bytes)"),
        Record(100_004, {"a": "4", "b": "5"}),
    ]
    assert parser.offset == len(data)
    assert peak < 3 * 1024 * 1024, peak


def test_csv_output_does_not_depend_on_what_ran_before_in_the_process() -> None:
    # csv.field_size_limit is process-wide: another job (a bigger max_record_bytes) or other code may
    # have raised or lowered it. The parser's output depends on its input and options alone.
    limit = 1024
    quoted = b'"' + b"q" * 600 + b"\n" + b"q" * 600 + b'"'  # 1,203 bytes: too long in total
    data = b"a,b\n" + b"1," + quoted + b"\n2," + b"w" * 900 + b"\n3,4\n"
    expected = [
        Record(2, None, f"record is longer than max_record_bytes ({limit} bytes)"),
        Record(4, {"a": "2", "b": "w" * 900}),
        Record(5, {"a": "3", "b": "4"}),
    ]
    previous = csv.field_size_limit()
    try:
        for field_limit in (previous, 10, 500, 8 * 1024 * 1024):
            csv.field_size_limit(field_limit)
            assert parse_csv(data, max_line_bytes=limit) == expected, field_limit
        parse_csv(b"a\n" + b"v" * 300_000 + b"\n", max_line_bytes=8 * 1024 * 1024)  # a bigger job first
        assert parse_csv(data, max_line_bytes=limit) == expected
    finally:
        csv.field_size_limit(previous)


@pytest.mark.parametrize("step", [1, 2, 3, 7, 4096])
def test_csv_lone_cr_line_ends_are_read_as_the_csv_module_does(step: int) -> None:
    # Old spreadsheet exports end lines with CR alone; quoted fields may hold CR, LF and CRLF.
    data = b'id,note\r1,"a\rb"\r\r2,x\r3,"c\r\nd"\r\n4,"e\nf"\n5,z'
    reference = list(csv.DictReader(io.StringIO(data.decode(), newline="")))
    # Reads of `step` bytes at a time: CR/LF pairs and line ends fall on every read boundary.
    parser = CsvParser(TrickleRaw(data, step))  # type: ignore[arg-type]
    records, bounds = walk(parser)
    assert [r.value for r in records] == reference
    # A line ends at LF, CRLF or a lone CR; a record's line is the one it starts on.
    assert [r.line for r in records] == [2, 5, 6, 8, 10]
    assert bounds == [
        (data.index(b'b"\r') + 3, 4),
        (data.index(b"x\r") + 2, 6),
        (data.index(b'd"\r\n') + 4, 8),
        (data.index(b'f"\n') + 3, 10),
        (len(data), 11),
    ]
    assert _assert_exact_resume("csv", data, 1024) == 5


@pytest.mark.parametrize(
    ("header", "message"),
    [
        (b"a,a\n", r"columns 1 and 2 of the header row \(line 1\) have the same name"),
        (b"\nid,name,id,x\n", r"columns 1 and 3 of the header row \(line 2\) have the same name"),
        (b"a,,c\n", r"column 2 of the header row \(line 1\) has no name"),
        (b'a,b,""\n', r"column 3 of the header row \(line 1\) has no name"),
        (b'""\n', r"column 1 of the header row \(line 1\) has no name"),
    ],
)
def test_csv_duplicate_or_empty_column_names_refuse_the_file(header: bytes, message: str) -> None:
    # `a,a` used to keep one value of two: a column lost without a word.
    data = header + b"1,2,3\n"
    parser = CsvParser(io.BytesIO(data))
    with pytest.raises(ValueError, match=message):
        iter(parser)  # iter() itself raises: the activity turns it into a non-retryable BadFile
    with pytest.raises(ValueError, match=message):
        read_csv_header(io.BytesIO(data))


def test_csv_delimiter_must_be_one_character_other_than_the_quote_or_a_line_break() -> None:
    for delimiter in ('"', "\n", "\r", ",,"):
        with pytest.raises(ValueError, match="delimiter"):
            Reading.of("x.csv", {"delimiter": delimiter})
    assert parse_csv(b'a;b\n1;"x;y"\n', reading=Reading(delimiter=";")) == [Record(2, {"a": "1", "b": "x;y"})]
    assert parse_csv("a§b\n1§2\n".encode(), reading=Reading(delimiter="§")) == [Record(2, {"a": "1", "b": "2"})]
    limit = 100
    assert parse_csv(b'a;b\n1;"' + b"x;" * 100 + b'"\n2;3\n', reading=Reading(delimiter=";"), max_line_bytes=limit) == [
        Record(2, None, f"line is longer than max_record_bytes ({limit} bytes)"),
        Record(3, {"a": "2", "b": "3"}),
    ]


def test_csv_empty_file() -> None:
    parser = CsvParser(io.BytesIO(b""))
    assert list(parser) == []
    assert parser.header is None
    assert (parser.offset, parser.line) == (0, 1)


@pytest.mark.parametrize("data", [b"a,b,c", b"a,b,c\n", b"a,b,c\r\n\r\n", BOM + b"a,b,c\n"])
def test_csv_header_only_file(data: bytes) -> None:
    parser = CsvParser(io.BytesIO(data))
    assert list(parser) == []
    assert parser.header == ["a", "b", "c"]
    assert parser.offset == len(data)


def test_csv_last_record_without_a_newline() -> None:
    parser = CsvParser(io.BytesIO(b'a,b\n1,2\n3,"4\n5"'))
    assert list(parser) == [Record(2, {"a": "1", "b": "2"}), Record(3, {"a": "3", "b": "4\n5"})]
    assert (parser.offset, parser.line) == (15, 5)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b'"a"x,b\n1,2\n', "the header row (line 1) is not valid CSV"),
        (b"a,\xffb\n1,2\n", "the header row (line 1) cannot be read: invalid UTF-8"),
        (b"\n" + b"h" * 200 + b"\n1\n", "the header row (line 2) cannot be read: line is longer than"),
    ],
)
def test_csv_unreadable_header_raises(data: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        list(CsvParser(io.BytesIO(data), max_line_bytes=100))
    with pytest.raises(ValueError, match=r"the header row"):
        read_csv_header(io.BytesIO(data), max_line_bytes=100)
    # iter() itself raises, so a caller can wrap parser construction and iter() to classify it.
    parser = CsvParser(io.BytesIO(data), max_line_bytes=100)
    with pytest.raises(ValueError, match=r"the header row"):
        iter(parser)


def test_csv_resuming_without_a_header_is_refused() -> None:
    with pytest.raises(ValueError, match="needs its header"):
        CsvParser(io.BytesIO(b"1,2\n"), offset=4)


def test_read_csv_header_reads_only_the_header_row() -> None:
    data = BOM + b'\r\nid,"na,me"\r\n1,"unterminated\n'
    stream = io.BytesIO(data)
    assert read_csv_header(stream) == ["id", "na,me"]
    assert stream.tell() == len(BOM + b'\r\nid,"na,me"\r\n')
    assert read_csv_header(io.BytesIO(b"")) is None
    assert read_csv_header(io.BytesIO(b"\n\n")) is None


# --------------------------------------------------------------------------------------------- JSONL


def test_jsonl_values_blank_lines_and_invalid_json() -> None:
    data = b'{"a": 1}\n\n  \r\n[1, 2]\r\n"s"\n{bad\n3\n'
    records = parse_jsonl(data)
    assert [(r.line, r.value) for r in records if r.error is None] == [(1, {"a": 1}), (4, [1, 2]), (5, "s"), (7, 3)]
    bad = [r for r in records if r.error is not None]
    assert len(bad) == 1 and bad[0].line == 6 and bad[0].value is None
    assert bad[0].error is not None and bad[0].error.startswith("invalid JSON: ")


def test_jsonl_bom_is_stripped_at_the_start_only() -> None:
    assert parse_jsonl(BOM + b'{"a": "\xc3\xa9"}\n') == [Record(1, {"a": "é"})]
    # Resumed mid-object, a BOM is garbage and the line a reject.
    records = parse_jsonl(BOM + b"1\n", offset=10, line=3)
    assert len(records) == 1 and records[0].line == 3 and records[0].error is not None


def test_jsonl_invalid_utf8_is_a_reject() -> None:
    records = parse_jsonl(b'{"a": 1}\n{"b": "\xff"}\n{"c": 3}\n')
    assert ok(records) == [(1, {"a": 1}), (3, {"c": 3})]
    assert [(r.line, r.value) for r in records if r.error] == [(2, None)]


def test_jsonl_last_line_without_newline() -> None:
    parser = JsonlParser(io.BytesIO('1\n{"x": "漢"}'.encode()))
    assert list(parser) == [Record(1, 1), Record(2, {"x": "漢"})]
    assert (parser.offset, parser.line) == (len('1\n{"x": "漢"}'.encode()), 3)


def test_jsonl_huge_line_is_a_reject_and_never_held_in_memory() -> None:
    limit = 64 * 1024
    data = b"1\n" + b'"' + b"w" * (5 * 1024 * 1024) + b'"\n2\n'
    stream = LargestReadline(data)
    parser = JsonlParser(stream, max_line_bytes=limit)
    too_long = f"line is longer than max_record_bytes ({limit} bytes)"
    assert list(parser) == [Record(1, 1), Record(2, None, too_long), Record(3, 2)]
    assert parser.offset == len(data)
    assert stream.largest <= 1024 * 1024 + 1


def test_jsonl_empty_file() -> None:
    parser = JsonlParser(io.BytesIO(b""))
    assert list(parser) == []
    assert (parser.offset, parser.line) == (0, 1)


def test_jsonl_numbers_pass_through_exactly() -> None:
    # orjson reads integers beyond 64 bits as doubles: 123456789012345678901234567890 was written
    # as 1.2345678901234568e+29. Every number now comes back with its value, and is written back so.
    line = (
        b'{"id": 123456789012345678901234567890, "neg": -9223372036854775809, "u64": 18446744073709551615, '
        b'"snowflake": 1460323737035677698, "d": 0.1000000000000000055511151231257827, "big": 1e400, '
        b'"tiny": 1e-400, "sub": 2.4703282292062328e-324, "f": 1.5, "g": 1.50, "e": 1E2, '
        b'"in_string": "123456789012345678901234567890", "nested": [[-1e400, {"x": 9999999999999999999999}]]}'
    )
    records = parse_jsonl(b'{"a": 1}\n' + line + b"\n")
    assert records[0] == Record(1, {"a": 1})
    value = records[1].value
    assert records[1].line == 2 and records[1].error is None
    assert value["id"] == 123456789012345678901234567890 and type(value["id"]) is int
    assert value["neg"] == -9223372036854775809 and type(value["neg"]) is int
    assert value["u64"] == 2**64 - 1 and value["snowflake"] == 1460323737035677698
    assert value["d"] == Decimal("0.1000000000000000055511151231257827")
    assert value["big"] == Decimal("1e400") and value["tiny"] == Decimal("1e-400")
    assert value["sub"] == Decimal("2.4703282292062328e-324")  # a subnormal double would round it
    assert (value["f"], value["g"], value["e"]) == (1.5, 1.5, 100.0)  # doubles hold these: floats
    assert all(type(value[k]) is float for k in ("f", "g", "e"))
    assert value["in_string"] == "123456789012345678901234567890"
    assert value["nested"] == [[Decimal("-1e400"), {"x": 9999999999999999999999}]]
    written = encode_json(value)
    assert written == (
        b'{"id":123456789012345678901234567890,"neg":-9223372036854775809,"u64":18446744073709551615,'
        b'"snowflake":1460323737035677698,"d":0.1000000000000000055511151231257827,"big":1E+400,'
        b'"tiny":1E-400,"sub":2.4703282292062328E-324,"f":1.5,"g":1.5,"e":100.0,'
        b'"in_string":"123456789012345678901234567890","nested":[[-1E+400,{"x":9999999999999999999999}]]}'
    )
    assert parse_jsonl(written) == [Record(1, value)]
    # The passthrough handler writes what was read, exactly.
    assert get_handler("passthrough")(records).output == [b'{"a":1}', written]


def test_jsonl_deep_nesting_is_written_exactly_and_too_deep_is_a_reject_naming_the_limit() -> None:
    # orjson reads 1,024 levels but writes about 255: such a record used to fail the whole file.
    deep = b"[" * 1000 + b'{"k": 12345678901234567890123}' + b"]" * 1000
    too_deep = b"[" * 1025 + b"]" * 1025
    records = parse_jsonl(b"1\n" + deep + b"\n" + too_deep + b"\n2\n")
    assert [(r.line, r.error) for r in records] == [
        (1, None),
        (2, None),
        (3, "invalid JSON: nested deeper than 1024 levels, the most s3batch reads"),
        (4, None),
    ]
    assert encode_json(records[1].value) == deep.replace(b": ", b":")
    assert get_handler("passthrough")(records[1:2]).output == [deep.replace(b": ", b":")]
    assert encode_json(parse_jsonl(b"[" * 1024 + b"]" * 1024)[0].value) == b"[" * 1024 + b"]" * 1024


@pytest.mark.parametrize(
    ("data", "line"),
    [
        (b'[\n  {"id": 1},\n  {"id": 2}\n]\n', 1),
        (b'\n\n{\n  "rows": [1, 2],\n  "n": 2\n}\n', 3),
        (BOM + b'[{"id": 1},\n{"id": 2}]\n', 1),
        (b'{"data": [\n  1,\n  2\n]}', 1),
    ],
)
def test_jsonl_a_json_document_over_several_lines_is_refused_with_a_hint(data: bytes, line: int) -> None:
    # A pretty-printed .json file used to give one reject per line and a "successful" file.
    parser = JsonlParser(io.BytesIO(data))
    with pytest.raises(ValueError) as info:
        iter(parser)  # from iter(): the activity turns it into a non-retryable BadFile naming the file
    message = str(info.value)
    assert f"holds one JSON document spread over several lines (opened on line {line})" in message
    assert "not JSON Lines (one complete JSON value per line)" in message
    assert "jq -c '.[]'" in message


def test_jsonl_arrays_and_broken_first_lines_are_still_json_lines() -> None:
    # One document per line, arrays and objects included, is JSON Lines.
    assert parse_jsonl(b"[1, 2]\n[3]\n") == [Record(1, [1, 2]), Record(2, [3])]
    only = parse_jsonl(b'{"a": [1,\n')  # no second line to judge: a reject
    assert len(only) == 1 and only[0].line == 1 and only[0].error is not None
    # A truncated first record followed by good ones: a reject, not a refused file.
    records = parse_jsonl(b'{"a": [1,\n{"a": 2}\n{"a": 3}\n')
    assert [(r.line, r.value) for r in records] == [(1, None), (2, {"a": 2}), (3, {"a": 3})]
    assert records[0].error is not None and records[0].error.startswith("invalid JSON: ")
    # Resumed mid-object, nothing is judged from the first lines seen.
    assert parse_jsonl(b"[\n1\n", offset=10, line=4)[1] == Record(5, 1)


@pytest.mark.parametrize("step", [1, 2, 5, 4096])
def test_jsonl_short_reads_keep_lines_offsets_and_exact_numbers(step: int) -> None:
    data = BOM + b'{"n": 123456789012345678901234567890}\r\n\n[1e400]\n"\xc3\xa9"\n{"bad"\n7'
    parser = JsonlParser(TrickleRaw(data, step))  # type: ignore[arg-type]
    records, bounds = walk(parser)
    assert [(r.line, r.value) for r in records] == [
        (1, {"n": 123456789012345678901234567890}),
        (3, [Decimal("1e400")]),
        (4, "é"),
        (5, None),
        (6, 7),
    ]
    assert [b[0] for b in bounds] == [data.index(b"}\r\n") + 3, data.index(b"]\n") + 2, data.index(b'"\n{') + 2,
                                       data.index(b'"\n7') + 2, len(data)]
    assert _assert_exact_resume("jsonl", data, 1024) == 5


def test_csv_record_too_long_that_never_closes_is_a_reject_at_the_end_of_the_object() -> None:
    limit = 50
    # The limit is passed inside a quoted field that is still open at the end of the object.
    data = b'a,b\n1,2\n3,"' + b"x\n" * 100
    parser = CsvParser(io.BytesIO(data), max_line_bytes=limit)
    assert list(parser) == [
        Record(2, {"a": "1", "b": "2"}),
        Record(3, None, f"record is longer than max_record_bytes ({limit} bytes)"),
    ]
    assert (parser.offset, parser.line) == (len(data), 103)
    # Its first line alone is too long, and never closes either.
    data = b'a,b\n3,"' + b"x" * 100
    parser = CsvParser(io.BytesIO(data), max_line_bytes=limit)
    assert list(parser) == [Record(2, None, f"line is longer than max_record_bytes ({limit} bytes)")]
    assert parser.offset == len(data)
    with pytest.raises(ValueError, match=r"the header row \(line 1\) cannot be read: line is longer than"):
        iter(CsvParser(io.BytesIO(b'"' + b"h" * 200), max_line_bytes=limit))


def test_exact_json_at_the_edges() -> None:
    digits = "7" * 5000  # beyond Python's int <-> str limit (4,300 digits): an exact Decimal
    [record] = parse_jsonl(f'{{"n": {digits}, "m": -{digits}}}'.encode())
    assert record.value == {"n": Decimal(digits), "m": Decimal("-" + digits)}
    assert encode_json(record.value) == f'{{"n":{digits},"m":-{digits}}}'.encode()
    assert encode_json([10**5000]) == b"[1" + b"0" * 5000 + b"]"
    # Long digit runs in strings and exponents: found, and left as they are.
    text = '["' + "9" * 10_000 + '", 1e00000000000000000400, 5E+0000000000000000001]'
    [record] = parse_jsonl(text.encode())
    assert record.value == ["9" * 10_000, Decimal("1e400"), 50.0]
    # What JSON cannot hold is refused, as orjson refuses it.
    for value in (Decimal("NaN"), Decimal("-Infinity"), {1: 2**70}, {"a": {1, 2}}):
        with pytest.raises(TypeError):
            encode_json(value)


def test_make_parser_picks_the_parser() -> None:
    assert isinstance(make_parser("csv", io.BytesIO(b"")), CsvParser)
    assert isinstance(make_parser("jsonl", io.BytesIO(b"")), JsonlParser)
    resumed = make_parser("csv", io.BytesIO(b"1,2\n"), offset=4, line=2, header=["a", "b"], max_line_bytes=10)
    assert list(resumed) == [Record(2, {"a": "1", "b": "2"})]
    assert resumed.offset == 8


def test_parsers_read_a_gzip_stream() -> None:
    data = gzip.compress('a,b\n1,"é\n€"\n2,3\n'.encode())
    with gzip.GzipFile(fileobj=io.BytesIO(data)) as stream:
        assert list(CsvParser(stream)) == [Record(2, {"a": "1", "b": "é\n€"}), Record(4, {"a": "2", "b": "3"})]


# -------------------------------------------------------------------------------- exact resume points

_PIECES = ["plain", "x", " ", ",", '"', "\n", "\r\n", "é", "€", "😀", "漢字", "a,b", '""', ""]


def _csv_field(value: str) -> str:
    if any(c in value for c in ',"\r\n'):
        return '"' + value.replace('"', '""') + '"'
    return value


def _random_text(rng: random.Random) -> str:
    return "".join(rng.choice(_PIECES) for _ in range(rng.randint(0, 6)))


def build_csv(seed: int, *, n: int, max_line: int) -> tuple[bytes, list[tuple[int, Any, str | None]]]:
    """A varied CSV and what the parser must make of it: ``(line, value, error prefix)``."""
    rng = random.Random(seed)
    header = ["id", "text", "more"]
    out = bytearray(BOM if rng.random() < 0.5 else b"")
    out += ("id,text,more" + rng.choice(["\n", "\r\n"])).encode()
    expected: list[tuple[int, Any, str | None]] = []
    line = 2
    for i in range(n):
        kind = rng.choices(["ok", "blank", "wrong", "utf8", "long", "quote"], weights=[70, 8, 6, 5, 6, 5])[0]
        eol = rng.choice(["\n", "\r\n"])
        if kind == "ok":
            fields = [str(i), _random_text(rng), _random_text(rng)]
            chunk = (",".join(_csv_field(f) for f in fields) + eol).encode()
            expected.append((line, dict(zip(header, fields, strict=True)), None))
        elif kind == "blank":
            chunk = eol.encode()
        elif kind == "wrong":
            fields = [str(i), _random_text(rng)]
            chunk = (",".join(_csv_field(f) for f in fields) + eol).encode()
            expected.append((line, None, "expected 3 fields (as in the header), got 2"))
        elif kind == "utf8":
            chunk = f'{i},"{_random_text(rng).replace(chr(34), "")}'.encode() + b'\xff",x' + eol.encode()
            expected.append((line, None, "invalid UTF-8 at byte"))
        elif kind == "long":
            chunk = f"{i},".encode() + "é".encode() * (max_line // 2 + rng.randint(1, 300)) + b",x" + eol.encode()
            expected.append((line, None, "line is longer than max_record_bytes"))
        else:  # text after a closing quote
            chunk = f'{i},"q"x,y{eol}'.encode()
            expected.append((line, None, "malformed CSV ("))
        out += chunk
        line += chunk.count(b"\n")
    if out.endswith(b"\r\n") and rng.random() < 0.5 and expected and expected[-1][2] is None:
        del out[-2:]
    return bytes(out), expected


def build_jsonl(seed: int, *, n: int, max_line: int) -> tuple[bytes, list[tuple[int, Any, str | None]]]:
    rng = random.Random(seed)
    out = bytearray(BOM if rng.random() < 0.5 else b"")
    expected: list[tuple[int, Any, str | None]] = []
    line = 1
    for i in range(n):
        kind = rng.choices(["ok", "blank", "json", "utf8", "long"], weights=[75, 8, 7, 5, 5])[0]
        eol = rng.choice(["\n", "\r\n"])
        if kind == "ok":
            value = {"i": i, "text": _random_text(rng), "list": [rng.random()]}
            chunk = (json.dumps(value, ensure_ascii=False) + eol).encode()
            expected.append((line, value, None))
        elif kind == "blank":
            chunk = rng.choice(["", "  ", "\t"]).encode() + eol.encode()
        elif kind == "json":
            chunk = b'{"i": ' + str(i).encode() + b"," + eol.encode()
            expected.append((line, None, "invalid JSON: "))
        elif kind == "utf8":
            chunk = b'{"s": "\xe2\x82"}' + eol.encode()
            expected.append((line, None, "invalid JSON: "))
        else:
            chunk = b'"' + "😀".encode() * (max_line // 4 + rng.randint(1, 100)) + b'"' + eol.encode()
            expected.append((line, None, "line is longer than max_record_bytes"))
        out += chunk
        line += chunk.count(b"\n")
    return bytes(out), expected


def _check_against_expected(records: list[Record], expected: list[tuple[int, Any, str | None]]) -> None:
    assert len(records) == len(expected)
    for record, (line, value, error) in zip(records, expected, strict=True):
        assert record.line == line, (record, line)
        if error is None:
            assert record.error is None, record
            assert record.value == value
        else:
            assert record.value is None
            assert record.error is not None and record.error.startswith(error), (record, error)


def _assert_exact_resume(fmt: str, data: bytes, max_line: int) -> int:
    full = make_parser(fmt, io.BytesIO(data), max_line_bytes=max_line)  # type: ignore[arg-type]
    records, bounds = walk(full)
    header = full.header
    assert full.offset == len(data)
    for i, (offset, line) in enumerate(bounds):
        # What a checkpoint taken after record i would store: resuming there gives the rest, exactly.
        assert line_ends(fmt, data[:offset]) + 1 == line or offset == len(data)
        resumed = make_parser(
            fmt,  # type: ignore[arg-type]
            io.BytesIO(data[offset:]),
            offset=offset,
            line=line,
            header=header,
            max_line_bytes=max_line,
        )
        rest, rest_bounds = walk(resumed)
        assert rest == records[i + 1 :], f"resume after record {i} (offset {offset}, line {line})"
        assert rest_bounds == bounds[i + 1 :]
    return len(records)


@pytest.mark.parametrize("seed", range(6))
def test_csv_resume_from_every_record_boundary_is_exact(seed: int) -> None:
    max_line = 300
    data, expected = build_csv(seed, n=70, max_line=max_line)
    # The generated file really is varied: quoted newlines, CRLF and multi-byte characters.
    values = [v for _, v, e in expected if e is None]
    assert any("\r\n" in v["text"] + v["more"] for v in values)
    assert any("\n" in (v["text"] + v["more"]).replace("\r\n", "") for v in values)
    assert any(not (v["text"] + v["more"]).isascii() for v in values)
    assert b"\r\n" in data.replace(b"\r\n", b"", 1)
    records = parse_csv(data, max_line_bytes=max_line)
    _check_against_expected(records, expected)
    assert _assert_exact_resume("csv", data, max_line) == len(expected)


@pytest.mark.parametrize("seed", range(6))
def test_csv_valid_files_parse_like_the_csv_module(seed: int) -> None:
    rng = random.Random(1000 + seed)
    rows = [["k", "v", "w"]] + [[str(i), _random_text(rng), _random_text(rng)] for i in range(60)]
    text = "".join(",".join(_csv_field(f) for f in row) + rng.choice(["\n", "\r\n"]) for row in rows)
    reference = list(csv.DictReader(io.StringIO(text, newline="")))
    assert ok(parse_csv(text.encode())) and [v for _, v in ok(parse_csv(text.encode()))] == reference


@pytest.mark.parametrize("seed", range(6))
def test_jsonl_resume_from_every_record_boundary_is_exact(seed: int) -> None:
    max_line = 200
    data, expected = build_jsonl(seed, n=70, max_line=max_line)
    _check_against_expected(parse_jsonl(data, max_line_bytes=max_line), expected)
    assert _assert_exact_resume("jsonl", data, max_line) == len(expected)


def test_csv_resume_points_of_a_hand_written_file() -> None:
    data = (BOM.decode() + 'id,txt\r\n1,"a\r\nb"\r\n\r\n2,€😀\n3,"x,""y"""\n4,"\n\n"\n').encode()
    parser = CsvParser(io.BytesIO(data))
    records, bounds = walk(parser)
    assert [r.line for r in records] == [2, 5, 6, 7]
    ends = [data.index(b'b"\r\n') + 4, data.index("😀\n".encode()) + 5, data.index(b'"""\n') + 4, len(data)]
    assert bounds == [(ends[0], 4), (ends[1], 6), (ends[2], 7), (ends[3], 10)]
    assert _assert_exact_resume("csv", data, 1024) == 4


def test_resume_at_end_with_trailing_blank_lines_yields_nothing() -> None:
    data = b"a,b\n1,2\n\n\r\n"
    parser = CsvParser(io.BytesIO(data))
    _, bounds = walk(parser)
    assert bounds == [(8, 3)]
    assert parse_csv(data[8:], offset=8, line=3, header=["a", "b"]) == []


# --------------------------------------------------------------------------------------- formats


@pytest.mark.parametrize(
    ("key", "fmt", "expected"),
    [
        ("a/b.csv", "auto", ("csv", None)),
        ("a/B.CSV", "auto", ("csv", None)),
        ("a/b.csv.gz", "auto", ("csv", "gzip")),
        ("a/b.csv.zst", "auto", ("csv", "zstd")),
        ("a/b.CSV.BZ2", "auto", ("csv", "bzip2")),
        ("b.jsonl", "auto", ("jsonl", None)),
        ("b.ndjson.GZ", "auto", ("jsonl", "gzip")),
        ("b.jsonl.bz2", "auto", ("jsonl", "bzip2")),
        ("b.json", "auto", ("json", None)),
        ("b.json.gz", "auto", ("json", "gzip")),
        ("b.txt", "json", ("json", None)),
        ("b.txt", "csv", ("csv", None)),
        ("b.txt.gz", "jsonl", ("jsonl", "gzip")),
        ("b.txt.zst", "jsonl", ("jsonl", "zstd")),
        ("b.jsonl", "csv", ("csv", None)),
    ],
)
def test_resolve_format(key: str, fmt: str, expected: tuple[str, str | None]) -> None:
    assert resolve_format(key, fmt) == expected


@pytest.mark.parametrize("key", ["data.txt", "data.gz", "data.csv.zip", "csv", "data.tsv.zip", "dir.csv/file"])
def test_resolve_format_unknown_extension_says_what_to_do(key: str) -> None:
    with pytest.raises(UnknownFormatError) as info:
        resolve_format(key, "auto")
    message = str(info.value)
    assert repr(key) in message
    assert ".csv, .tsv, .jsonl, .ndjson or .json, optionally .gz, .zst or .bz2" in message
    assert "set format to 'csv', 'jsonl' or 'json'" in message
    assert isinstance(info.value, ValueError)


def test_resolve_format_rejects_an_unknown_format_name() -> None:
    with pytest.raises(UnknownFormatError, match="unknown format 'xml'"):
        resolve_format("x.csv", "xml")

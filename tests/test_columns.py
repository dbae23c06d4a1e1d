"""Block encoders (``s3batch.columns``): the ``customers`` handler's documents for a whole block of CSV rows
at once must be exactly what the handler writes for each of those rows alone, and the rows the encoder
leaves out must reach the handler, in file order, with chunk boundaries unchanged.

Hypothesis searches for a row the encoder writes differently from ``Customer`` (or takes where
``Customer`` refuses it); the oracle is the per-row loop ``customers`` replaced. The fast path taken as the
chunk loop takes it is compared with the exact parser's records through the handler. Pure tests: no
server (the file-level comparison, fast path on and off, is ``tests/test_fast_path_more.py``).
"""

from __future__ import annotations

import csv
import io
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from s3batch.columns import block_encoder, customers_block, encoder_of
from s3batch.dev.sample_data import customers_csv
from s3batch.formats.common import Record
from s3batch.formats.csv import CsvParser
from s3batch.formats.csv_arrow import encode_block
from s3batch.formats.fastcsv import FastCsvParser
from s3batch.handlers import HandlerResult, chunk_handler, customers, passthrough
from tests.helpers.customers import ODD, SHAPED, VALID, per_row_customers
from tests.helpers.fastcsv import bounded
from tests.helpers.records import walk

COLUMNS = list(VALID)
text = st.text(st.characters(codec="utf-8"), max_size=12)
edges = st.sampled_from(["", " ", "\t", "\u00a0", "\u2028", "\u3000", "\x85", "\x1f", "\x7f", '"', "\\", "é", "\n"])


@st.composite
def values(draw: st.DrawFn, column: str) -> str:
    """A CSV value of ``column``: mostly valid, else an edge case, a shaped string, any text, or a valid
    value with white space or a character that needs escaping at either end."""
    how = draw(st.integers(0, 9))
    if how < 4:
        return VALID[column]
    if how < 6:
        return draw(st.sampled_from(ODD[column]))
    if how == 6:
        return draw(SHAPED.get(column, text))
    if how == 7:
        return draw(text)
    return draw(edges) + VALID[column] + draw(edges) if draw(st.booleans()) else VALID[column] + draw(edges)


@st.composite
def tables(draw: st.DrawFn) -> tuple[list[str], list[list[str]]]:
    """A header (the six columns in any order, sometimes with an extra one) and rows of strings."""
    header = draw(st.permutations(COLUMNS))
    if draw(st.booleans()):
        header = [*header, "note"]
    n = draw(st.integers(0, 20))
    rows = [[draw(values(c)) if c in VALID else draw(text) for c in header] for _ in range(n)]
    return list(header), rows


def _table(header: list[str], rows: list[list[str]]) -> pa.Table:
    return pa.table({name: pa.array([r[i] for r in rows], pa.string()) for i, name in enumerate(header)})


@bounded
@given(tables())
@example((COLUMNS, [[VALID[c] for c in COLUMNS]]))
@example((COLUMNS, [[VALID[c] if c != "name" else 'O"Brien \\ x' for c in COLUMNS]]))
@example((COLUMNS, [[VALID[c] if c != "name" else "Ada\u00a0" for c in COLUMNS]]))
@example((COLUMNS, [[VALID[c] if c != "name" else "A\tb\nc\r\nd\x7fe\x85f\u2028g" for c in COLUMNS]]))
def test_each_document_is_what_customers_writes_for_that_row_alone(table: tuple[list[str], list[list[str]]]) -> None:
    header, rows = table
    docs = customers_block(_table(header, rows))
    assert docs is not None and len(docs) == len(rows)
    for i, (row, doc) in enumerate(zip(rows, docs.to_pylist(), strict=True)):
        if doc is None:
            continue  # left to the handler: whatever it does is the handler's own answer
        expected = per_row_customers([Record(2 + i, dict(zip(header, row, strict=True)))])
        assert expected.rejects == [], (row, doc)
        assert expected.output == [doc.encode()], row


def test_the_sample_rows_are_written_by_the_encoder() -> None:
    """The rows the benchmark and the sample data hold (quotes, commas and line breaks in names): every one."""
    records = list(CsvParser(io.BytesIO(b"".join(customers_csv(5_000, seed=5)))))
    header = list(records[0].value)
    docs = customers_block(_table(header, [list(r.value.values()) for r in records])).to_pylist()
    taken = [d for d in docs if d is not None]
    assert len(taken) == len(records)
    expected = per_row_customers([r for r, d in zip(records, docs, strict=True) if d is not None])
    assert [d.encode() for d in taken] == expected.output


def test_a_header_without_every_field_or_with_a_name_twice_leaves_every_row_to_the_handler() -> None:
    row = [VALID[c] for c in COLUMNS]
    assert customers_block(_table(COLUMNS[:-1], [row[:-1]])) is None
    twice = pa.table([pa.array([v]) for v in [*row, "x"]], names=[*COLUMNS, "email"])
    assert customers_block(twice) is None


def test_only_customers_has_an_encoder_and_a_broken_encoder_fails_loudly() -> None:
    assert encoder_of(customers) is customers_block
    assert encoder_of(passthrough) is None

    @chunk_handler("test_columns_broken")
    def broken(records: Any) -> HandlerResult:
        return HandlerResult([], [], dropped=len(records))

    @block_encoder(broken)
    def short(table: pa.Table) -> pa.Array:
        return pa.array(["{}"] * (table.num_rows - 1), pa.string())

    with pytest.raises(TypeError, match="must return one string per row"):
        encode_block(short, _table(["a", "b"], [["1", "2"], ["3", "4"]]))
    blob, ends, refused = encode_block(lambda t: pa.array(['{"a":1}', None, "[]"]), _table(["a"], [["x"]] * 3))
    assert (blob, ends, refused) == (b'{"a":1}\n\n[]\n', [0, 8, 9, 12], [1])
    assert encode_block(lambda t: pa.array([None, None], pa.string()), _table(["a"], [["x"]] * 2)) is None


def _customers_file(header: list[str], rows: list[list[str]], damage: bytes, at: int) -> bytes:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(header)
    writer.writerows(rows)
    data = out.getvalue().encode()
    if damage:
        cut = data.find(b"\r\n", len(data) * at // 100) + 2 or len(data)
        data = data[:cut] + damage + data[cut:]
    return data


@bounded
@given(
    table=tables(),
    damage=st.sampled_from([b"", b'"oops', b"1,2\r\n", b"\r\n", b"\xff\r\n"]),
    at=st.integers(0, 100),
    block=st.sampled_from([64, 300, 1 << 20]),
    data_st=st.data(),
)
def test_runs_of_encoded_rows_and_the_rows_left_are_the_exact_path_taken_as_the_chunk_loop_takes_it(
    table: tuple[list[str], list[list[str]]], damage: bytes, at: int, block: int, data_st: Any
) -> None:
    """``take_json`` with the encoder, then ``slow_rows`` records one way, as ``take_packed`` alternates:
    the same records (lines, offsets) as the exact parser, each run's documents the handler's, and the
    ``until`` rule of the chunk loop."""
    header, rows = table
    data = _customers_file(header, rows, damage, at)
    try:
        records, bounds = walk(CsvParser(io.BytesIO(data)))
    except ValueError:
        return
    fast = FastCsvParser(io.BytesIO(data), block_bytes=block)
    it = iter(fast)
    done = 0
    while done < len(records):
        want = data_st.draw(st.integers(1, 30))
        until = fast.offset + data_st.draw(st.integers(1, 600))
        n, pieces, reached, size = fast.take_json(want, until, None, customers_block)
        if n == 0:
            slow = fast.take_records(fast.slow_rows(want), until)
            assert slow == records[done : done + len(slow)]
            done += len(slow)
            continue
        taken = records[done : done + n]
        expected = per_row_customers(taken)
        assert expected.rejects == [] and all(r.error is None for r in taken)
        assert b"\n".join(pieces) == b"\n".join(expected.output)
        assert size == sum(map(len, expected.output))
        ends = [offset for offset, _ in bounds[done : done + n]]
        assert all(end < until for end in ends[:-1]) and reached == (ends[-1] >= until)
        assert (fast.offset, fast.line) == bounds[done + n - 1]
        done += n
    assert next(it, None) is None

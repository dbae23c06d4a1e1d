"""The fast CSV path's records taken in runs (``FastCsvParser.take_records``, what ``activities.taking.take``
uses for handlers other than ``passthrough``), against the exact parser taken one record at a time: the
same records, lines, offsets and stops, for canonical CSV with damage, line breaks inside fields and
blocks of any size. And the file activity with the ``customers`` handler (valid rows, invalid rows and
damage), byte for byte with the fast path on and off.
"""

from __future__ import annotations

import csv
import io
import random
from itertools import islice
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from s3batch.activities.taking import take

from s3batch.dev.sample_data import CUSTOMER_COLUMNS, customer_row
from s3batch.formats.csv import CsvParser
from s3batch.formats.csv_arrow import DISPLAY_MAX, dict_maker
from s3batch.formats.fastcsv import FastCsvParser
from tests.helpers.fastcsv import bounded, csv_files, run_both_ways


@bounded
@given(
    data=csv_files(), block=st.sampled_from([16, 200, 1 << 20]), limit=st.sampled_from([12, 1 << 20]), steps=st.data()
)
def test_records_taken_in_runs_are_the_exact_parsers_taken_one_by_one(
    data: bytes, block: int, limit: int, steps: Any
) -> None:
    """``take`` (at least one record, ``want`` at most, stop after the first whose end reaches ``until``)
    with a chunk's lookahead record between runs, on both parsers: the same records (line, value,
    error) and the same ``(offset, line)`` after every step."""
    exact = CsvParser(io.BytesIO(data), max_line_bytes=limit)
    fast = FastCsvParser(io.BytesIO(data), max_line_bytes=limit, block_bytes=block)
    try:
        exact_it = iter(exact)
    except ValueError as err:
        with pytest.raises(ValueError, match=str(err)[:20]):
            iter(fast)
        return
    fast_it = iter(fast)
    while True:
        if steps.draw(st.booleans()):  # the record the chunk loop reads past a chunk's end
            looked = list(islice(fast_it, 1))
            assert looked == list(islice(exact_it, 1))
            assert (fast.offset, fast.line) == (exact.offset, exact.line)
            if not looked:
                break
        want = steps.draw(st.integers(0, 40))
        until = exact.offset + steps.draw(st.integers(1, 500))
        taken = take(fast_it, fast, want, until)
        assert taken == take(exact_it, exact, want, until)
        assert (fast.offset, fast.line) == (exact.offset, exact.line)
        if not taken:
            break
    assert next(fast_it, None) is None
    assert fast.header == exact.header


def _customers_csv(rows: int, seed: int) -> bytes:
    """Customers rows (quoted names with commas, quotes and line breaks), about one in forty invalid
    (a negative amount, a bad country), damaged at two places (an unterminated quote, a short row)."""
    rng = random.Random(seed)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(CUSTOMER_COLUMNS)
    for i in range(rows):
        row = customer_row(rng, i + 1, i)
        if i % 40 == 7:
            row[4] = "-1.00"
        elif i % 40 == 23:
            row[3] = "usa"
        writer.writerow(row)
    data = bytearray(out.getvalue().encode())
    for at, damage in ((rows // 3, b'"oops'), (2 * rows // 3, b"1,2\r\n")):
        cut = data.index(b"\r\n", len(data) * at // rows) + 2
        data[cut:cut] = damage
    return bytes(data)


@pytest.mark.parametrize(("chunk_records", "budget"), [(1_000, 64 << 20), (7_000, 16_384)], ids=["chunks", "bytes"])
def test_customers_output_is_byte_identical_with_and_without_the_fast_path(
    s3: Any, buckets: tuple[str, str], chunk_records: int, budget: int
) -> None:
    """The ``customers`` handler reads its records in runs on the fast path: the same parts, rejects (with
    their lines, counted through line breaks inside fields) and checkpoints as the exact path's."""
    src, _ = buckets
    s3.put_object(Bucket=src, Key="in/customers.csv", Body=_customers_csv(25_000, seed=3))
    job = {"chunk_records": chunk_records, "budget": budget, "handler": "customers"}
    exact = run_both_ways(s3, buckets, "in/customers.csv", fast=False, prefix="exact/", **dict(job))
    fast = run_both_ways(s3, buckets, "in/customers.csv", fast=True, prefix="fast/", **dict(job))
    assert fast["result"] == exact["result"]
    assert exact["result"]["rejected"] >= 25_000 // 20
    assert sorted(fast["objects"]) == sorted(exact["objects"])
    for name, (body, metadata) in exact["objects"].items():
        assert fast["objects"][name][0] == body, name
        assert fast["objects"][name][1] == metadata, name


@pytest.mark.parametrize("width", [2, 6, DISPLAY_MAX, DISPLAY_MAX + 1])
def test_a_blocks_dicts_are_dict_of_zip_in_column_order(width: int) -> None:
    """The generated dict display takes the names as arguments: names that are the generated code's own
    (``k0``, ``v1``, ``columns``, ``zip``) or not identifiers at all make the same dicts, keys in order."""
    names = ["k0", "v1", "columns", "zip", "a b", 'q"', "é", "k1"][:width] + [f"c{i}" for i in range(width - 8)]
    columns = [[f"{n}-{r}" for r in range(5)] for n in names]
    made = dict_maker(width)(columns, *names)
    expected = [dict(zip(names, values, strict=True)) for values in zip(*columns, strict=True)]
    assert [list(d.items()) for d in made] == [list(d.items()) for d in expected]

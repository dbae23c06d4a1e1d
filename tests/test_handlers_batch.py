"""The ``customers`` handler validates a chunk in one pydantic-core call, and gives exactly what the
per-row loop it replaced gives: the same output bytes, rejects (line, reason, value, summary), order,
``dropped`` and ``lines``, for any records (CSV rows, and any JSON value a JSONL line holds).

The oracle below is a copy of the per-row loop as it was; hypothesis searches for a list of records on
which the two differ. Pure tests: no server."""

from __future__ import annotations

import datetime
import decimal
import io
import json
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field, field_validator, model_validator
from pydantic_core import SchemaSerializer, SchemaValidator

import s3batch.handlers as handlers
from s3batch.dev.sample_data import customers_csv
from s3batch.formats.common import Record
from s3batch.formats.csv import CsvParser
from s3batch.handlers import Customer, HandlerResult, _fast_rows, customers, get_handler
from tests.helpers.customers import NON_DICT, ODD, SHAPED, VALID, per_row_customers

text = st.text(st.characters(codec="utf-8"), max_size=12)
json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | text
json_values = st.decimals(allow_nan=False, places=3).map(decimal.Decimal) | json_scalars


@st.composite
def rows(draw: st.DrawFn) -> Any:
    """A record's value: mostly a customers row with some columns spoiled, sometimes any JSON value."""
    if draw(st.integers(0, 19)) == 0:
        return draw(st.sampled_from(NON_DICT) | json_scalars)
    row: dict[str, Any] = dict(VALID)
    spoiled = draw(st.sampled_from([0, 1, 1, 1, 1, 2, 3]))  # mostly one: the others valid, to see its effect
    for column in draw(st.lists(st.sampled_from(list(VALID)), min_size=spoiled, max_size=spoiled, unique=True)):
        how = draw(st.integers(0, 9))
        if how < 3:
            row[column] = draw(st.sampled_from(ODD[column]))
        elif how < 7:
            row[column] = draw(SHAPED.get(column, text))
        elif how == 7:
            del row[column]  # a missing column
        elif how == 8:
            row[column] = draw(text)  # any string, non-ASCII included
        else:
            row[column] = draw(json_values)  # a JSONL number, boolean or null where a string was
    if draw(st.integers(0, 9)) == 0:
        row[draw(text)] = draw(text)  # an extra column (or a declared one, overwritten)
    return row


@st.composite
def chunks(draw: st.DrawFn) -> list[Record]:
    values = draw(st.lists(rows(), max_size=25))
    first = draw(st.integers(1, 10_000))
    return [Record(first + 2 * i, value) for i, value in enumerate(values)]


def assert_same(records: list[Record]) -> HandlerResult:
    expected = per_row_customers(records)
    got = customers(records)
    assert got == expected
    assert [type(b) for b in got.output] == [bytes] * len(expected.output)
    return got


@settings(max_examples=400, deadline=None)
@given(chunks())
@example([])
@example([Record(2, dict(VALID)), Record(3, None), Record(4, {**VALID, "amount": " 5.00"})])
def test_customers_gives_what_the_per_row_loop_gave(records: list[Record]) -> None:
    assert_same(records)


@pytest.mark.parametrize("column", list(ODD))
def test_every_odd_value_of_a_column_alone(column: str) -> None:
    """Each listed edge case, in a chunk of valid rows: same result as the per-row loop."""
    records = [Record(10 + i, {**VALID, column: value}) for i, value in enumerate(ODD[column])]
    records += [Record(100 + i, value) for i, value in enumerate(NON_DICT)]
    result = assert_same(records)
    assert result.output or result.rejects


def test_valid_rows_the_fast_schema_does_not_vouch_for_are_still_outputs() -> None:
    """An amount that is valid but not written as Customer writes it ("05.00", "1e2", " 5.00") is
    validated by Customer itself: an output in its place, in Customer's JSON."""
    values = [{**VALID, "amount": a} for a in ("05.00", "1e2", " 5.00", "8611.68")]
    assert _customer_rows(values)[:3] == [None, None, None]
    result = assert_same([Record(2 + i, v) for i, v in enumerate(values)])
    assert [json.loads(b)["amount"] for b in result.output] == ["5.00", "1E+2", "5.00", "8611.68"]
    assert result.lines == [2, 3, 4, 5] and result.rejects == []


def test_rejects_keep_their_line_reason_value_and_summary() -> None:
    bad = {**VALID, "email": "not-an-email", "amount": "-1"}
    result = assert_same([Record(2, dict(VALID)), Record(3, bad), Record(4, {"customer_id": "1"}), Record(5, 7)])
    assert [r.line for r in result.rejects] == [3, 4, 5] and result.lines == [2]
    first = result.rejects[0]
    assert first.value is bad and first.reason == first.summary
    assert first.reason == (
        "email: String should match pattern '^[^@\\s]+@[^@\\s]+\\.[^@\\s]+$'; amount: Input should be greater than "
        "or equal to 0"
    )
    assert "not-an-email" not in first.summary
    assert result.rejects[2].reason == "record: Input should be a valid dictionary or instance of Customer"


def test_a_chunk_of_valid_rows_is_one_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every row of the sample data (the benchmark's rows too) is taken by the one call: the per-row
    model is never asked."""
    records = list(CsvParser(io.BytesIO(b"".join(customers_csv(3_000, seed=5)))))

    def per_row(value: Any) -> Customer:
        raise AssertionError("a valid row was validated on its own")

    expected = per_row_customers(records)
    monkeypatch.setattr(handlers, "_validate_customer", per_row)
    assert customers(records) == expected
    assert len(expected.output) == 3_000


def test_the_registered_customers_handler_is_the_one_call_version() -> None:
    assert get_handler("customers") is customers


def test_only_a_plain_model_has_a_fast_row_schema() -> None:
    """A field or model the typed dict would write differently (an alias, a default, a validator) is
    refused when the handler is defined, not discovered in the output."""

    class Aliased(BaseModel):
        a: int = Field(alias="A")

    class Defaulted(BaseModel):
        a: int = 1

    class Validated(BaseModel):
        a: int

        @field_validator("a")
        @classmethod
        def positive(cls, v: int) -> int:
            return v

    class Plain(BaseModel):
        a: int
        b: str

    class Both(BaseModel):
        a: int

        @model_validator(mode="after")
        def same(self) -> Both:
            return self

    for model in (Aliased, Defaulted, Validated):
        with pytest.raises(TypeError, match="only plain fields"):
            _fast_rows(model, {})
    with pytest.raises(TypeError, match="only a plain model"):
        _fast_rows(Both, {})
    rows = _fast_rows(Plain, {})
    assert rows([{"a": "1", "b": "x", "c": 1}, {"a": "x"}, {"a": 1}, "a"]) == [b'{"a":1,"b":"x"}', None, None, None]


_customer_rows = handlers._customer_rows



def test_the_times_the_one_call_takes_are_written_back_as_customer_writes_them() -> None:
    """Every day 28-31 of every month of the years 1-9999, every day of a 400-year leap cycle and every
    time of a day (seconds 60 and hours 24 too): a created_at the narrowed schema takes is one Customer
    takes and writes back unchanged, and every real day of 1000-9999 is taken (none goes the slow way)."""
    schema = Customer.__pydantic_core_schema__
    exact = schema["schema"]["fields"]["created_at"]["schema"]
    validate, write = SchemaValidator(exact, schema["config"]).validate_python, SchemaSerializer(exact).to_json
    narrow = SchemaValidator(handlers._CANONICAL_CREATED_AT).isinstance_python
    days = [(y, m, d) for y in range(1, 10_000) for m in range(1, 13) for d in range(28, 32)]
    days += [(y, m, d) for y in range(1999, 2401) for m in range(1, 13) for d in range(1, 28)]
    times = [f"2024-03-15T{h:02d}:{mi:02d}:{se:02d}Z" for h in range(25) for mi in range(61) for se in range(62)]
    for text in [f"{y:04d}-{m:02d}-{d:02d}T12:34:56Z" for y, m, d in days] + times:
        real = _is_day(text) and text[11:13] < "24" and text[14:16] < "60" and text[17:19] < "60"
        if narrow(text):
            assert write(validate(text)) == f'"{text}"'.encode(), text
        assert narrow(text) == (real and text >= "1000"), text


def _is_day(text: str) -> bool:
    try:
        datetime.date.fromisoformat(text[:10])
    except ValueError:
        return False
    return True

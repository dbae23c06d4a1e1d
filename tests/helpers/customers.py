"""The ``customers`` handler's oracle and the values its tests draw from: the per-row loop it replaced,
and per column the values ``Customer`` takes (canonical or not), refuses, and the edge cases of both."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import strategies as st
from pydantic import ValidationError

from s3batch.formats.common import Record
from s3batch.handlers import Customer, HandlerResult, Reject, describe_error


def per_row_customers(records: Sequence[Record]) -> HandlerResult:
    """The ``customers`` handler before the chunk was validated in one call (the oracle)."""
    output: list[bytes] = []
    rejects: list[Reject] = []
    lines: list[int] = []
    for record in records:
        try:
            customer = Customer.model_validate(record.value)
        except ValidationError as err:
            reason = describe_error(err)
            rejects.append(Reject(record.line, reason, record.value, reason))
            continue
        output.append(Customer.__pydantic_serializer__.to_json(customer))
        lines.append(record.line)
    return HandlerResult(output, rejects, encoded=True, dropped=0, lines=lines)


VALID = {
    "customer_id": "17",
    "email": "ada.lovelace17@example.com",
    "name": "Lovelace, Ada",
    "country": "GB",
    "amount": "8611.68",
    "created_at": "2024-01-19T18:03:43Z",
}

# Per column: values Customer takes (canonical or not), values it refuses, and edge cases of both.
ODD = {
    "customer_id": ["1", "0", "-1", "01", " 7 ", "1_000", "1e3", "\u0661\u0662", "9" * 30, "", " ", "7.0", "+7"],
    "email": [
        "a@b.co", "a@b", "@b.co", "a b@c.de", "a@@b.co", " a@b.co ", "é@ü.de", "a@b.co\n", "", "x" * 250 + "@b.co",
    ],
    "name": [
        "", " ", "  Ada  ", "Zoë", "\tAda\n", "x" * 200, "x" * 201, "O'Brien \"Ob\"", "\u00a0Ada\u00a0", "\x1cAda",
    ],
    "country": ["gb", "GBR", "G", " GB ", "ÉÉ", "", "G B", "GB\n"],
    "amount": [
        "0", "0.00", "0.5", "5", "5.0", "10", "05.00", "+5.00", "-0", "-0.00", "-1.00", "1.234", "1e2", "1E+2",
        " 5.00", "5.00 ", "5.", ".5", "\u0663.\u0665\u0660", "NaN", "inf", "", "999999999999.99", "9999999999999.99",
        "123456789012", "1234567890123", "0.001", "5.00\n", "1_000.00", "0.10", "100.00",
    ],
    "created_at": [
        "2024-02-29T00:00:00Z", "2023-02-29T00:00:00Z", "2024-13-01T00:00:00Z", "2024-01-01", "2024-01-01 10:00:00",
        "2024-01-01T10:00:00+01:00", "2024-01-01T10:00:00.123456789Z", "1700000000", "yesterday", "",
        " 2024-01-01T00:00:00Z ", "2024-01-01T24:00:00Z", "2024-01-01T23:59:60Z", "2024-01-01t00:00:00z",
        "2000-02-29T00:00:00Z", "2100-02-29T00:00:00Z", "1600-02-29T00:00:00Z", "2024-04-31T00:00:00Z",
        "2024-12-31T23:59:59Z", "0999-12-31T23:59:59Z", "1000-01-01T00:00:00Z", "9999-12-31T23:59:59Z",
        "2024-01-01T00:00:00+00:00", "2024-01-01T00:00:00-00:00", "2024-01-01T00:00:00.000Z", "2024-01-01T00:00Z",
    ],
}
NON_DICT = [None, 0, 1.5, "row", [], [VALID], True]
"""A JSONL line may hold any JSON value, not only an object."""

SHAPED = {
    "customer_id": st.from_regex(r"[ +-]?[0-9]{0,20}(\.0)? ?", fullmatch=True),
    "amount": st.from_regex(r"-?0?[1-9]?[0-9]{0,13}(\.[0-9]{0,3})?", fullmatch=True)
    | st.from_regex(r"[ +-]?[0-9]{0,15}(\.[0-9]{0,4})?([eE][+-]?[0-9])? ?", fullmatch=True),
    "created_at": st.datetimes().map(lambda d: d.strftime("%Y-%m-%dT%H:%M:%SZ"))
    | st.datetimes().map(lambda d: d.isoformat())
    | st.from_regex(
        r"[0-9]{4}-[0-9]{2}-[0-9]{2}([T ][0-9]{2}:[0-9]{2}(:[0-9]{2}(\.[0-9]{1,9})?)?)?(Z|[+-][0-9]{2}:?[0-9]{2})?",
        fullmatch=True,
    ),
}
"""Strings shaped like a column's values: numbers with signs, zeros, exponents; dates of every form."""

"""Column handlers: a chunk handler's outputs for a whole block of CSV rows at once, from its Arrow columns.

The fast CSV path (:mod:`s3batch.formats.fastcsv`) parses about 1 MiB of rows at a time into a
``pyarrow.Table`` of string columns. A handler with a *block encoder* gets that table and writes the JSON
documents of the rows it can vouch for in a few native kernels, with no Python call per row; the other
rows (invalid ones, and valid ones it cannot write exactly) reach the handler as records, as before::

    from s3batch.columns import block_encoder

    @block_encoder(my_handler)          # a registered chunk handler
    def my_rows(table: pyarrow.Table) -> pyarrow.Array | None:
        ...  # per row: the document my_handler would write for that row alone, or null

The contract, which a property test should check for every encoder (``tests/test_columns.py`` does for
``customers``): for a row with a document, the handler given that row alone returns exactly that one
output (the same bytes), no reject, nothing dropped; a null row (or a None table: every row) is handed to
the handler. The documents count against the chunk's byte budget as the handler's outputs would, so a
chunk ends at the same record and its part has the same bytes either way. Used for JSONL parts from
UTF-8 CSV read by the fast path; everything else goes through the handler.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]  # pyarrow ships no type information
import pyarrow.compute as pc  # type: ignore[import-untyped]

from s3batch.formats.csv_arrow import BlockEncoder
from s3batch.handlers import _CANONICAL_AMOUNT, _CANONICAL_CREATED_AT, Customer, customers

__all__ = ["BlockEncoder", "block_encoder", "encoder_of"]

_ENCODERS: dict[Any, BlockEncoder] = {}


def block_encoder(handler: object) -> Callable[[BlockEncoder], BlockEncoder]:
    """Give ``handler`` (a registered chunk handler) a block encoder (see the module docstring)."""

    def decorate(encoder: BlockEncoder) -> BlockEncoder:
        _ENCODERS[handler] = encoder
        return encoder

    return decorate


def encoder_of(handler: object) -> BlockEncoder | None:
    """The block encoder of ``handler``, or None."""
    return _ENCODERS.get(handler)


# ----------------------------------------------------------------------------------- customers

_NOT_SPACE = r"[^\pZ\x00-\x1f\x7f-\x9f]"
"""A character that is neither Unicode white space (the Z categories, the C0 and C1 controls: what pydantic's
``str_strip_whitespace`` strips, and more) nor a control character."""
_EMAIL = r"[!#-?A-\[\]-~]+@[!#-?A-\[\]-~]+\.[!#-?A-\[\]-~]+"
"""The emails ``Customer``'s pattern takes that are printable ASCII without a quote or a backslash: written
as they are, nothing to strip or escape (anything else goes to the handler)."""
_ROW = "\x1f".join([
    r"^[1-9][0-9]{0,17}",  # an int > 0 written as Python writes it
    _EMAIL,
    rf"{_NOT_SPACE}(?:[^\x00-\x08\x0b\x0c\x0e-\x1f]*{_NOT_SPACE})?",  # a name: nothing to strip; \t \n \r inside
    "[A-Z]{2}",
    str(_CANONICAL_AMOUNT["pattern"]).strip("^$"),
    str(_CANONICAL_CREATED_AT["pattern"]).strip("^$") + "$",
])
"""A customers row (its fields joined by a unit separator, which no field that matches can hold) whose JSON
is the fields themselves: one regular expression over the joined row costs half of one per column."""
_ESCAPES = (("\\", "\\\\"), ('"', '\\"'), ("\n", "\\n"), ("\r", "\\r"), ("\t", "\\t"))
"""A name's characters JSON writes escaped (the backslash first); the encoder leaves other control characters
to the handler."""
_ORDER = ("customer_id", "email", "name", "country", "amount", "created_at")
"""``Customer``'s fields in the order its JSON has them (checked at import)."""
if tuple(Customer.model_fields) != _ORDER:
    raise TypeError("Customer's fields changed: update customers_block")
_FIELDS = set(_ORDER)


@block_encoder(customers)
def customers_block(table: Any) -> Any:
    """The ``customers`` handler's JSON of the rows it takes that are written as ``Customer`` writes them;
    the rest (invalid rows, valid ones in another form: spaces to strip, ``05.00``, an offset) go to it."""
    names = table.column_names
    if len(set(names)) != len(names) or not set(names) >= _FIELDS:
        return None
    ident, email, name, country, amount, created = (table.column(f).combine_chunks() for f in _ORDER)
    good = pc.match_substring_regex(pc.binary_join_element_wise(ident, email, name, country, amount, created,
                                                                "\x1f"), _ROW)
    good = pc.and_(pc.and_(good, pc.less_equal(pc.binary_length(email), 254)),
                   pc.less_equal(pc.utf8_length(name), 200))
    for char, escaped in _ESCAPES:  # as pydantic (and orjson) write them
        if pc.any(pc.match_substring(name, char)).as_py():
            name = pc.replace_substring(name, char, escaped)
    docs = pc.binary_join_element_wise(
        '{"customer_id":', ident, ',"email":"', email, '","name":"', name, '","country":"', country,
        '","amount":"', amount, '","created_at":"', created, '"}', "",
    )
    return pc.if_else(good, docs, pa.scalar(None, pa.string()))

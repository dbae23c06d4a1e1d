"""Exact JSON numbers on top of orjson: decode lines without rounding, encode values back exactly.

orjson is fast, but it reads every number into a 64-bit integer or a double: an integer beyond
64 bits becomes a float (``123456789012345678901234567890`` reads as ``1.2345678901234568e+29``),
``0.1000000000000000055511151231257827`` reads as ``0.1``, ``1e-400`` as ``0.0``, and ``1e400`` is
refused. Its writer refuses integers beyond 64 bits and nesting past about 255 levels. This module
keeps orjson for the common case and takes a slower exact path only where a value would change.

**The decoding rule.** A JSON number comes back as

- an ``int`` when it is an integer (no fraction, no exponent), whatever its size; beyond 4,300
  digits (Python's own limit for converting text to ``int``) it is a :class:`~decimal.Decimal`
  with the same digits;
- a ``float`` when a double holds it exactly, meaning the shortest text of that double (what
  ``repr`` and orjson write) denotes the same decimal value: ``1.5``, ``1.50``, ``1e2`` and any
  number of up to 15 significant digits in the normal range;
- otherwise a :class:`~decimal.Decimal` with the exact digits (``Decimal('1E+400')``).

Nothing is rounded, clamped or turned into infinity. :func:`encode_json` writes ``Decimal`` and big
integers with their digits, so a value read by :func:`loads_exact` is written back as the same
numbers (the text may differ where the value does not: ``1.50`` is written ``1.5``).

**The fast path.** :func:`inexact_positions` finds, in a block of raw bytes, the places where a
number could lose precision in orjson: 20 or more digits, a 16-digit mantissa with an exponent, a
negative integer of 19 digits, a decimal with 8 or more digits before the point or 9 after it, a
negative exponent of three digits. Lines without such a place are decoded by ``orjson.loads`` alone;
the check costs one ``bytes.translate`` and six ``bytes.rfind`` per block of lines. A line with one
is decoded by orjson and cleared by :func:`numbers_as_written` when orjson writes its numbers back
as they are written (the shortest text of a double, as Python, JavaScript and orjson write doubles,
or digits inside a string); otherwise, and for lines orjson refuses, :func:`loads_exact` decodes it.
"""

from __future__ import annotations

import json
import math
import re
from decimal import Decimal
from typing import Any

import orjson

MAX_DEPTH = 1024
"""Deepest nesting of arrays and objects that :func:`loads_exact` (orjson) reads."""

_INT64_MIN = -(2**63)
_UINT64_MAX = 2**64 - 1
_INT_DIGITS_LIMIT = 4300  # CPython's default int <-> str conversion limit (sys.int_info)

_loads = orjson.loads
_json_loads = json.loads
_dumps = orjson.dumps
_Fragment = orjson.Fragment


def _translation() -> bytes:
    table = bytearray(b" " * 256)
    for c in b"0123456789":
        table[c] = ord("0")
    for c in b".-+":
        table[c] = c
    table[ord("e")] = table[ord("E")] = ord("e")
    return bytes(table)


_NUMBER_CLASSES = _translation()
# Shapes (digits as 0) where a number may not read exactly in orjson: 20+ digits (beyond 64 bits, or
# a long mantissa), a 16+ digit mantissa with an exponent, a negative 19-digit integer (below -2**63,
# and the sentinels of loads_exact), a decimal with 8+ digits before its point or 9+ after it (16+
# significant digits need one of them) and a negative exponent of 3+ digits (underflow).
_SHAPES = (b"0" * 20, b"0" * 16 + b"e", b"-" + b"0" * 19, b"0" * 8 + b".", b"." + b"0" * 9, b"e-000")


def inexact_positions(data: bytes) -> list[int]:
    """Positions in ``data`` (sorted) where a JSON number may not survive ``orjson.loads`` exactly.

    An empty list means every number in ``data`` decodes exactly with orjson: integers of up to 19
    digits (orjson holds -2**63..2**64-1) and decimals of up to 15 significant digits in the normal
    range. Such numbers inside JSON strings are reported too (:func:`numbers_as_written` then
    clears the line cheaply). No false negatives: the property tests check it against orjson.
    """
    # Searched from the end: on this kind of text, bytes.rfind skips ahead much faster than find.
    t = data.translate(_NUMBER_CLASSES)
    found: list[int] = []
    for shape in _SHAPES:
        p = t.rfind(shape)
        while p >= 0:
            if shape[0] != 101 or (p and t[p - 1] == 48):  # an exponent only after a digit
                found.append(p)
            p = t.rfind(shape, 0, p)
    found.sort()
    return found


_JSON_WHITESPACE = b" \t\r\n"


def numbers_as_written(raw: bytes, value: Any) -> bool:
    """Whether ``value``, orjson's reading of the JSON text ``raw``, holds every number of it exactly.

    A cheap proof for the common case: without escapes in ``raw``, orjson writes every string and
    literal back byte for byte and keeps the order, so ``orjson.dumps(value)`` differs from ``raw``
    only in whitespace and in numbers; when both are the same bytes once whitespace is removed
    (numbers stay delimited by ``,:]}``), every number was written back as it was read: it is the
    shortest text of the double it reads as (how Python, JavaScript and orjson write doubles), or
    an integer orjson holds. False means "not proven": decode exactly.
    """
    if b"\\" in raw:
        return False
    try:
        written = _dumps(value)
    except TypeError:  # deeper than orjson writes
        return False
    if written == raw.strip():  # compact text, as orjson, JavaScript and most writers give it
        return True
    return written.translate(None, _JSON_WHITESPACE) == raw.translate(None, _JSON_WHITESPACE)


# A JSON string (skipped as a whole, so digits inside strings are never touched) or a number token
# standing alone (the lookarounds keep `01` or `1.2.3` from being read as numbers).
_TOKENS = re.compile(
    rb'"(?:[^"\\]++|\\.)*+"'
    rb"|(?<![\w.+-])(-?(?:0|[1-9][0-9]*+)(?:\.[0-9]++)?(?:[eE][-+]?[0-9]++)?)(?![\w.+-])"
)


def _exact_number(token: bytes) -> Any:
    """The exact value of a number token, or None when orjson reads it exactly."""
    text = token.decode()
    if b"." in token or b"e" in token or b"E" in token:
        as_float = float(text)
        exact = Decimal(text)
        if math.isfinite(as_float) and exact == Decimal(repr(as_float)):
            return None
        return exact
    digits = len(text) - (text[0] == "-")
    if digits < 19:
        return None
    if digits > _INT_DIGITS_LIMIT:
        return Decimal(text)
    value = int(text)
    if 0 <= value <= _UINT64_MAX:
        return None
    # Negative 19+ digit integers are always substituted, those orjson would read exactly too: the
    # sentinels of loads_exact are such integers, and no integer of the line may equal one.
    return value


def _exact_int(text: str) -> Any:
    return int(text) if len(text) <= _INT_DIGITS_LIMIT else Decimal(text)


def _exact_float(text: str) -> Any:
    as_float = float(text)
    if math.isfinite(as_float):
        shortest = repr(as_float)
        if shortest == text or Decimal(shortest) == Decimal(text):
            return as_float
    return Decimal(text)


def loads_exact(raw: bytes) -> Any:
    """Decode one JSON document, every number exact (see the module docstring for the types).

    Accepts and refuses exactly what ``orjson.loads`` does (syntax, UTF-8, nesting up to
    :data:`MAX_DEPTH`), except that numbers out of the double range are accepted.

    Raises:
        orjson.JSONDecodeError: ``raw`` is not JSON.
    """
    try:
        _loads(raw)  # orjson decides what is JSON
    except orjson.JSONDecodeError:
        return _loads_substituted(raw)  # numbers beyond a double, or not JSON at all
    try:
        # Valid JSON: the json module's scanner gives every number to the exact hooks.
        return _json_loads(raw.decode(), parse_int=_exact_int, parse_float=_exact_float)
    except (RecursionError, ValueError):
        # Deep nesting meets Python's stack limit (or, never seen, the json module disagrees with
        # orjson): the same values another way, by orjson alone.
        return _loads_substituted(raw)


def _loads_substituted(raw: bytes) -> Any:
    """:func:`loads_exact` by orjson alone: each number it would change is replaced by a sentinel
    integer, orjson decodes the line (and decides whether it is JSON), the sentinels are swapped
    for the exact values."""
    exact: list[Any] = []

    def substitute(match: re.Match[bytes]) -> bytes:
        token = match.group(1)
        if token is None:
            return match.group(0)
        value = _exact_number(token)
        if value is None:
            return token
        exact.append(value)
        # A sentinel orjson reads exactly, and that no integer left in the line can equal (every
        # negative 19+ digit integer token is substituted, see _exact_number).
        return str(_INT64_MIN + len(exact) - 1).encode()

    replaced = _TOKENS.sub(substitute, raw)
    if not exact:
        return _loads(raw)
    # Invalid for another reason: the error is orjson's for the line with its long numbers replaced
    # (positions after such a number are shifted; the message names the real problem).
    return _restore(_loads(replaced), exact)


def _restore(value: Any, exact: list[Any]) -> Any:
    """Replace the sentinels of :func:`loads_exact` by the exact values, without recursion."""
    low, high = _INT64_MIN, _INT64_MIN + len(exact)
    if type(value) is int:
        return exact[value - low] if low <= value < high else value
    stack = [value]
    while stack:
        container = stack.pop()
        pairs = container.items() if type(container) is dict else enumerate(container)
        for key, item in pairs:
            kind = type(item)
            if kind is int:
                if low <= item < high:
                    container[key] = exact[item - low]
            elif kind is dict or kind is list:
                stack.append(item)
    return value


# ------------------------------------------------------------------------------------------ encoding


def _default(obj: Any) -> Any:
    if isinstance(obj, Decimal):
        if obj.is_finite():
            return _Fragment(str(obj))
        raise TypeError(f"Decimal {obj} is not a JSON number")
    raise TypeError(f"Type is not JSON serializable: {type(obj).__name__}")


def encode_json(value: Any) -> bytes:
    """Compact JSON for ``value``, exact: the bytes ``orjson.dumps(value)`` gives wherever orjson can
    encode the value, and beyond that ``Decimal`` and integers beyond 64 bits written with their
    exact digits and nesting of any depth (orjson stops at 255 levels).

    Raises:
        TypeError: ``value`` holds something that is not JSON (the message is orjson's), a dict
            key that is not a string, or a NaN/infinite ``Decimal``.
    """
    try:
        return _dumps(value, default=_default)
    except TypeError:
        return _encode_slow(value)


_EMIT, _VALUE = 0, 1


def _encode_slow(value: Any) -> bytes:
    """:func:`encode_json` for what orjson refuses: an explicit stack instead of recursion, orjson
    for every leaf, big integers and Decimals by hand; the same bytes as orjson elsewhere."""
    out: list[bytes] = []
    todo: list[tuple[int, Any]] = [(_VALUE, value)]
    while todo:
        kind, obj = todo.pop()
        if kind == _EMIT:
            out.append(obj)
            continue
        if isinstance(obj, dict):
            if not obj:
                out.append(b"{}")
                continue
            todo.append((_EMIT, b"}"))
            entries = list(obj.items())
            for i in range(len(entries) - 1, -1, -1):
                key, item = entries[i]
                if not isinstance(key, str):
                    raise TypeError("Dict key must be str")
                todo.append((_VALUE, item))
                todo.append((_EMIT, (b"{" if i == 0 else b",") + _dumps(key) + b":"))
        elif isinstance(obj, list) or type(obj) is tuple:
            if not obj:
                out.append(b"[]")
                continue
            todo.append((_EMIT, b"]"))
            for i in range(len(obj) - 1, -1, -1):
                todo.append((_VALUE, obj[i]))
                todo.append((_EMIT, b"[" if i == 0 else b","))
        elif isinstance(obj, int) and not isinstance(obj, bool) and not _INT64_MIN <= obj <= _UINT64_MAX:
            out.append(_int_text(int(obj)))
        else:
            out.append(_dumps(obj, default=_default))
    return b"".join(out)


def _int_text(value: int) -> bytes:
    try:
        return str(value).encode()
    except ValueError:  # beyond the int -> str digit limit; Decimal converts without one
        return str(Decimal(value)).encode()

"""JSON Lines (one JSON value per line, numbers kept exact), knowing where each record ends.

See :mod:`s3batch.formats.common` for lines, limits and what raises, and :mod:`s3batch.jsonvalues`
for exact numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import IO

import orjson

from s3batch.formats.common import _BLOCK, _FAR, Record, _Source, _too_long
from s3batch.jsonvalues import MAX_DEPTH, inexact_positions, loads_exact, numbers_as_written


def _decode_json(raw: bytes, line: int) -> Record:
    """A line through the exact decoder (see :mod:`s3batch.jsonvalues`), or its reject."""
    try:
        return Record(line, loads_exact(raw))
    except orjson.JSONDecodeError as err:
        message = str(err)
        if message.startswith("depth limit"):
            return Record(line, None, f"invalid JSON: nested deeper than {MAX_DEPTH} levels, the most s3batch reads")
        return Record(line, None, f"invalid JSON: {message}")


def _decode_checked(raw: bytes, line: int) -> Record:
    """A line that may hold a number orjson changes: orjson's reading if it provably holds every
    number exactly, else the exact decoder's."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return _decode_json(raw, line)
    if numbers_as_written(raw, value):
        return tuple.__new__(Record, (line, value, None))
    return _decode_json(raw, line)


class JsonlParser:
    """One JSON value per line; blank lines are skipped."""

    def __init__(
        self,
        stream: IO[bytes],
        *,
        offset: int = 0,
        line: int = 1,
        max_line_bytes: int = 8 * 1024 * 1024,
    ) -> None:
        self._src = _Source(stream, offset, line, max_line_bytes)
        self.header: list[str] | None = None
        self._first: bytes | None = None

    @property
    def offset(self) -> int:
        return self._src.offset

    @property
    def line(self) -> int:
        return self._src.lines + 1

    def __iter__(self) -> Iterator[Record]:
        """Check the start of the object now (at offset 0), then iterate over the records lazily.

        Raises:
            ValueError: The object holds one JSON document spread over lines, not JSON Lines.
        """
        src = self._src
        at_start = src.offset == 0
        self._first = src.first_block()
        if at_start:
            opening = _document_opening(self._first)
            if opening is not None:
                raise ValueError(
                    f"it holds one JSON document spread over several lines (opened on line {opening}), not "
                    "JSON Lines (one complete JSON value per line); read it with format 'json' (or name it "
                    ".json with format auto), or convert it to JSON Lines first (for an array: jq -c '.[]')"
                )
        return self._records()

    def _records(self) -> Iterator[Record]:
        src = self._src
        read = src.read
        max_bytes = src.max_bytes
        loads = orjson.loads
        decode_error = orjson.JSONDecodeError
        new = tuple.__new__  # Record(...) goes through a Python-level __new__: 80 ns a record
        block = self._first if self._first is not None else src.first_block()
        self._first = None
        n, off = src.lines, src.offset
        carry = b""
        step = 1  # the LF after each line; 0 for a last line without one
        while True:
            if block:
                data = carry + block if carry else block
                lines = data.split(b"\n")
                carry = lines.pop()
            elif carry:
                data, lines, carry, step = carry, [carry], b"", 0
            else:
                break
            inexact = inexact_positions(data)
            base = off
            following = iter(inexact)
            next_inexact = base + next(following) if inexact else _FAR
            for raw in lines:
                n += 1
                size = len(raw)
                off += size + step
                if size > max_bytes and size - (step and raw.endswith(b"\r")) > max_bytes:
                    while next_inexact < off:
                        next_inexact = base + next(following, _FAR)
                    src.lines, src.offset = n, off
                    yield Record(n, None, _too_long("line", max_bytes))
                elif off > next_inexact:
                    # A number orjson may change is on this line.
                    while next_inexact < off:
                        next_inexact = base + next(following, _FAR)
                    src.lines, src.offset = n, off
                    yield _decode_checked(raw, n)
                elif raw and not raw.isspace():
                    src.lines, src.offset = n, off
                    try:
                        yield new(Record, (n, loads(raw), None))
                    except decode_error:  # out of the double range (1e400) is valid JSON
                        yield _decode_json(raw, n)
            if not step:
                break
            if len(carry) > max_bytes + 1:  # a line too long for any record, still going on
                n += 1
                skipped, block = _skip_line(read)
                off += len(carry) + skipped
                carry = b""
                src.lines, src.offset = n, off
                yield Record(n, None, _too_long("line", max_bytes))
                block = block or read(_BLOCK)
            else:
                block = read(_BLOCK)
        src.lines, src.offset = n, off


def _skip_line(read: Callable[[int], bytes]) -> tuple[int, bytes]:
    """Read past the next LF in bounded pieces: ``(bytes up to and with the LF, bytes read after it)``."""
    size = 0
    while True:
        piece = read(_BLOCK)
        if not piece:
            return size, b""
        end = piece.find(b"\n")
        if end >= 0:
            return size + end + 1, piece[end + 1 :]
        size += len(piece)


def _parses(text: bytes) -> bool:
    try:
        loads_exact(text)
    except orjson.JSONDecodeError:
        return False
    return True


def _document_opening(block: bytes) -> int | None:
    """The line that opens a JSON document spread over lines, judged from the first lines of the
    object; None when it reads as JSON Lines.

    It is a document when the first non-blank line is ``[`` or ``{`` alone, or when it is not valid
    JSON, starts with ``[``/``{`` and ends with ``[``, ``{`` or ``,`` (an array or object that goes on),
    and the next non-blank line is not valid JSON either. Only complete lines are judged.
    """
    pos, number, opening = 0, 0, None
    while number < 1000:
        end = block.find(b"\n", pos)
        if end < 0:
            return None
        number += 1
        text = block[pos:end].strip()
        pos = end + 1
        if not text:
            continue
        if opening is not None:
            return None if _parses(text) else opening
        if text in (b"[", b"{"):
            return number
        if text[:1] not in (b"[", b"{") or text[-1:] not in (b"[", b"{", b",") or _parses(text):
            return None
        opening = number
    return None

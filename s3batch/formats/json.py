"""JSON documents: a top-level array streamed record by record, or one object as one record.

A ``.json`` file (format ``auto``, or ``json``) is read as:

- **an array** (``[{...}, {...}, ...]``, pretty-printed or not): each element is a record, read
  one at a time (memory stays within a few blocks plus ``max_record_bytes``); its ``line`` is the
  line where the element starts. After each record the parser's ``offset`` is just past the comma
  that follows it (or at the closing ``]``), so a checkpoint resumes with a ranged GET there: the
  bytes before are never read again;
- **one object** (``{...}``): one record;
- **JSON Lines** when the file is that (its first line is a complete JSON value and the next
  non-blank line is one too): read exactly as the JSONL reader reads it (BigQuery, Firehose and
  others name JSON Lines ``.json``), so such files read as they did before this reader existed.

Values keep every number exact (:mod:`s3batch.jsonvalues`). An element that is not valid JSON but
whose extent is clear (brackets and strings balance) is a reject with its line; an element longer
than ``max_record_bytes`` is a reject, never held in memory. A document whose structure is broken
(something other than ``,`` or ``]`` after an element, a missing ``]``, text after the document, a
top-level string or number) raises :class:`BadDocument`, which the activity reports as a
non-retryable ``BadFile`` naming the file, line and byte (never the bytes themselves). A trailing
comma before ``]`` is accepted.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterator
from typing import IO, cast

import orjson

from s3batch.formats.common import _BLOCK, Record, _Source, _too_long
from s3batch.formats.jsonl import JsonlParser, _decode_checked, _decode_json
from s3batch.jsonvalues import inexact_positions

_WS = b" \t\r\n"
_OUTSIDE = re.compile(rb'[\[\]{}",]')
_INSIDE = re.compile(rb'["\\]')
_SCALAR_END = re.compile(rb'[\s,\]\[{}"]')
_NOT_WS = re.compile(rb"[^ \t\r\n]")
_SCANNER = json.JSONDecoder().raw_decode
SNIFF = 1024 * 1024
"""Bytes of the start of a file (its first MiB, BOM included) read to tell JSON Lines from a document."""


class BadDocument(ValueError):
    """The document's structure is broken: record boundaries cannot be found (no record contents)."""


def looks_like_json_lines(head: bytes) -> bool:
    """Whether a file whose first bytes (BOM included, up to :data:`SNIFF`) are ``head`` is JSON
    Lines: its first two non-blank lines are complete JSON values (a document spread over lines is
    not). The last line counts only when ``head`` is the whole file."""
    whole = len(head) < SNIFF
    head = head[:SNIFF].removeprefix(b"\xef\xbb\xbf")
    lines = head.split(b"\n")
    lines = [line for line in (lines if whole else lines[:-1]) if line.strip()]
    if len(lines) < 2:
        return False
    for line in lines[:2]:
        try:
            orjson.loads(line)
        except orjson.JSONDecodeError:
            return False
    return True


class JsonDocumentParser:
    """The records of a JSON document (see the module docstring), knowing where each one ends.

    Args:
        stream: Binary stream positioned at ``offset``.
        offset: Position of ``stream`` in the object; after 0, a checkpoint inside the array.
        line: Physical line number at ``offset``.
        max_line_bytes: Longer records become rejects.
        head: The first bytes of the object (to tell JSON Lines from a document on resume); None:
            read from ``stream`` (at offset 0).
    """

    def __init__(
        self,
        stream: IO[bytes],
        *,
        offset: int = 0,
        line: int = 1,
        max_line_bytes: int = 8 * 1024 * 1024,
        head: bytes | None = None,
    ) -> None:
        self._stream = stream
        self._src = _Source(stream, offset, line, max_line_bytes)
        self.header: list[str] | None = None
        self._head = head
        self._lines: JsonlParser | None = None
        self._data = b""
        self._pos = 0
        self._text: str | None = None
        """``_data`` read as latin-1 (for the json module's scanner), once asked for."""
        self._eof = False

    @property
    def offset(self) -> int:
        return self._lines.offset if self._lines is not None else self._src.offset

    @property
    def line(self) -> int:
        return self._lines.line if self._lines is not None else self._src.lines + 1

    def __iter__(self) -> Iterator[Record]:
        """Tell the kind of document now, then iterate over the records lazily.

        Raises:
            BadDocument: The document is a string, a number or a literal, not records.
        """
        src = self._src
        at_start = src.offset == 0
        if at_start:
            first = src.first_block()
            while len(first) + src.offset < SNIFF:  # the same bytes as a resumed attempt reads
                more = src.read(_BLOCK)
                if not more:
                    break
                first += more
            head = (src.bom if src.offset else b"") + first  # the object's first bytes
        else:
            first, head = b"", self._head or b""
        if looks_like_json_lines(head):
            stream = cast(IO[bytes], _Prefixed(first, self._stream))
            self._lines = JsonlParser(stream, offset=src.offset, line=src.lines + 1, max_line_bytes=src.max_bytes)
            self._lines._src.bom = b""  # already skipped
            return iter(self._lines)
        self._data = first
        if not at_start:
            return self._elements()
        c = self._skip_ws()
        if c is None:
            return iter(())  # an empty file
        if c == b"[":
            self._take(1)
            return self._elements()
        if c == b"{":
            return self._single()
        raise BadDocument(
            f"it holds a single JSON {_kind(c)} (line {self.line}), not an array of records or an object; "
            "a .json file must hold an array of records, one object, or JSON Lines"
        )

    # -------------------------------------------------------------- reading

    def _fill(self) -> bool:
        """Read one more block into the buffer; False at the end of the object."""
        more = self._src.read(_BLOCK)
        if not more:
            self._eof = True
            return False
        self._data = self._data[self._pos :] + more
        self._pos = 0
        self._text = None
        return True

    def _take(self, n: int) -> None:
        """Consume ``n`` buffered bytes (counted in offset and lines)."""
        pos = self._pos
        src = self._src
        src.offset += n
        src.lines += self._data.count(b"\n", pos, pos + n)
        self._pos = pos + n

    def _skip_ws(self) -> bytes | None:
        """Skip whitespace; the next byte (not consumed), None at the end."""
        while True:
            data = self._data
            m = _NOT_WS.search(data, self._pos)
            pos = m.start() if m is not None else len(data)
            self._take(pos - self._pos)
            if m is not None:
                return data[pos : pos + 1]
            if not self._fill():
                return None

    def _fast_element(self) -> bytes | None:
        """The bytes of the JSON value that starts here, found by the json module's C scanner (over the
        buffer read as latin-1, so that positions are byte positions); None when it cannot tell (not
        valid JSON, longer than the limit, nested too deep): then :meth:`_element` scans byte by byte."""
        limit = self._src.max_bytes
        while True:
            data, pos = self._data, self._pos
            if self._text is None:
                self._text = data.decode("latin-1")
            try:
                _, end = _SCANNER(self._text, pos)
            except json.JSONDecodeError as err:
                # More bytes can help only when the scanner ran out of them.
                if err.pos < len(data) and not err.msg.startswith("Unterminated string"):
                    return None
                end = None
            except RecursionError:
                return None
            if end is not None and end - pos > limit:
                return None  # skipped by the byte scan, never kept
            if end is not None and (end < len(data) or self._eof):
                self._take(end - pos)
                return data[pos:end]
            if self._eof or len(data) - pos > limit or not self._fill():
                return None

    def _element(self) -> tuple[bytes | None, int]:
        """The bytes of the JSON value that starts here (None when longer than the limit: skipped),
        and its line."""
        line = self.line
        fast = self._fast_element()
        if fast is not None:
            return fast, line
        limit = self._src.max_bytes
        kept: list[bytes] = []
        size = 0
        depth = 0
        in_string = False
        escaped = False
        start = self._pos
        pos = start
        while True:
            data = self._data
            end = self._value_end(data, pos, depth, in_string, escaped)
            if isinstance(end, int):
                size += end - start
                if size <= limit:
                    kept.append(data[start:end])
                self._take(end - self._pos)
                return (b"".join(kept) if size <= limit else None), line
            depth, in_string, escaped = end
            size += len(data) - start
            if size <= limit:
                kept.append(data[start:])
            else:
                kept = []
            self._take(len(data) - self._pos)
            if not self._fill():
                raise BadDocument(f"it ends inside the record that starts on line {line}: is it truncated?")
            start = pos = 0

    @staticmethod
    def _value_end(data: bytes, pos: int, depth: int, in_string: bool, escaped: bool) -> int | tuple[int, bool, bool]:
        """Where the value being scanned ends in ``data`` (an index), or the scan state at its end."""
        n = len(data)
        if escaped:
            if pos >= n:
                return depth, in_string, True
            pos += 1
        while pos < n:
            if in_string:
                m = _INSIDE.search(data, pos)
                if m is None:
                    return depth, True, False
                pos = m.end()
                if m.group() == b"\\":
                    if pos >= n:
                        return depth, True, True
                    pos += 1
                    continue
                in_string = False
                if depth == 0:
                    return pos
                continue
            c = data[pos]
            if depth == 0 and c not in b'[{"':  # a number or literal: up to a delimiter
                m = _SCALAR_END.search(data, pos)
                if m is None:
                    return depth, False, False
                return m.start()
            m = _OUTSIDE.search(data, pos)
            if m is None:
                return depth, False, False
            pos = m.end()
            t = m.group()
            if t == b'"':
                in_string = True
            elif t in b"[{":
                depth += 1
            elif t in b"]}":
                depth -= 1
                if depth == 0:
                    return pos
        return depth, in_string, False

    def _decode(self, raw: bytes | None, line: int) -> Record:
        if raw is None:
            return Record(line, None, _too_long("record", self._src.max_bytes))
        if inexact_positions(raw):
            return _decode_checked(raw, line)
        try:
            return Record(line, orjson.loads(raw))
        except orjson.JSONDecodeError:
            return _decode_json(raw, line)

    def _elements(self) -> Iterator[Record]:
        while True:
            c = self._skip_ws()
            if c is None:
                raise BadDocument(f"it ends before the closing ']' of its array (line {self.line}): is it truncated?")
            if c == b"]":
                self._take(1)
                self._after_document()
                return
            raw, line = self._element()
            c = self._skip_ws()
            if c == b",":
                self._take(1)
            elif c != b"]":
                what = "the end of the file" if c is None else f"{_kind(c)}"
                raise BadDocument(
                    f"expected ',' or ']' after the record that starts on line {line}, found {what} "
                    f"(line {self.line}, byte {self._src.offset}): not an array of JSON records"
                )
            yield self._decode(raw, line)

    def _single(self) -> Iterator[Record]:
        raw, line = self._element()
        record = self._decode(raw, line)
        self._after_document()
        yield record

    def _after_document(self) -> None:
        c = self._skip_ws()
        if c is not None:
            raise BadDocument(
                f"more follows its JSON document (line {self.line}, byte {self._src.offset}); a .json file holds "
                "one document (or JSON Lines, one complete value per line)"
            )


def _kind(c: bytes) -> str:
    if c == b'"':
        return "string"
    if c in b"-0123456789":
        return "number"
    if c in b"tfn":
        return "literal (true, false or null)"
    if c in b"[{":
        return "value"
    return "character that is not JSON"


class _Prefixed(io.RawIOBase):
    """A stream that first hands out ``prefix`` (bytes already read), then reads ``stream``."""

    def __init__(self, prefix: bytes, stream: IO[bytes]) -> None:
        super().__init__()
        self._prefix = prefix
        self._stream = stream

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        if self._prefix:
            out, self._prefix = self._prefix, b""
            return out
        return self._stream.read(n)

"""Streaming record parsers that know exactly where each record ends.

A parser reads a binary stream in blocks and yields :class:`Record` tuples. After each record it
exposes ``offset`` (bytes of the stream consumed, which is where the next record starts) and
``line`` (the physical line where the next record starts), so a checkpoint taken between two
records can be resumed with a ranged GET from ``offset``.

**Lines.** In CSV a line ends at LF, CRLF or a lone CR, as Python's csv module reads a file opened
with ``newline=''`` (old spreadsheet exports end lines with CR alone); in JSON Lines a line ends at
LF (a CR before it is whitespace). Line numbers count those line ends, the line breaks inside
quoted CSV fields included: the line of a record is the physical line where it starts.

**Limits.** ``max_line_bytes`` (the job's ``max_record_bytes``) bounds one *record*: its bytes from
its first character to its last, without the final line terminator (inside a quoted CSV field that
spans lines, the line breaks count). A longer record is a reject, never held in memory (memory stays
within a few blocks plus ``max_line_bytes``), and the records after it are read exactly as if it had
been read: the CSV parser follows the csv module's own state machine through the skipped bytes, so
a quote in an unquoted field (``12"inch``) is data and a quoted field that ends inside the skipped
bytes ends there. Output depends only on the bytes and the options: the csv module's process-wide
``field_size_limit`` is set to its maximum by every parser, so it never decides anything.

**Malformed input never raises**: a record that cannot be parsed is yielded with ``error`` set and
becomes a reject (with its line number) instead of failing the file. The exceptions are a file
that cannot be read at all, raised as ``ValueError`` by ``iter()`` itself (not at the first
``next()``), so a caller can tell a bad file from a bad record:

- a CSV header row that is not valid CSV, not UTF-8 or too long, or that has an empty or duplicate
  column name (every column needs a distinct, non-empty name: a duplicate would silently drop a
  column's values, and a made-up name could clash with a real one, so the file is refused);
- a JSON Lines object that holds one JSON document spread over lines (a pretty-printed array or
  object, typically a ``.json`` file) instead of one value per line. A document on one line, such
  as ``[1, 2]``, is one valid record.

**Exact values.** CSV values are strings. JSON values keep every number exact, as
:mod:`s3batch.jsonvalues` describes: orjson decodes a line unless the line holds a number orjson
would change (an integer beyond 64 bits, more digits than a double holds, an exponent out of its
range), in which case the line is decoded exactly (``int`` of any size, ``Decimal``);
:func:`s3batch.jsonvalues.encode_json` writes such values back exactly. Nesting deeper than
:data:`s3batch.jsonvalues.MAX_DEPTH` levels is a reject naming the limit.
"""

from __future__ import annotations

import csv
import sys
from collections.abc import Callable, Iterator
from typing import IO, Any, Literal, NamedTuple

import orjson

from s3batch.errors import UnknownFormatError
from s3batch.jsonvalues import MAX_DEPTH, inexact_positions, loads_exact, numbers_as_written

ParsedFormat = Literal["csv", "jsonl"]

# Only comma-separated files are recognised: nothing downstream passes a delimiter to the parser, so
# auto-detecting ``.tsv`` as CSV would silently parse tab-separated rows as one-column records.
_CSV_EXTENSIONS = (".csv",)
_JSONL_EXTENSIONS = (".jsonl", ".ndjson", ".json")
_BOM_BYTES = b"\xef\xbb\xbf"

_BLOCK = 256 * 1024
"""Bytes read per call (no result depends on it; memory is a few blocks plus one record)."""
_FAR = 1 << 62


def _widest_field_limit() -> int:
    for limit in (sys.maxsize, 2**31 - 1):
        previous = csv.field_size_limit()
        try:
            csv.field_size_limit(limit)
        except OverflowError:  # a C long narrower than Py_ssize_t
            continue
        csv.field_size_limit(previous)
        return limit
    return csv.field_size_limit()


_FIELD_LIMIT = _widest_field_limit()


class Record(NamedTuple):
    """One parsed record."""

    line: int
    """Physical line (1-based) where the record starts in the decompressed object."""
    value: Any
    """A ``{column: value}`` dict for CSV, any JSON value for JSONL; None when ``error`` is set."""
    error: str | None = None
    """Why the record could not be parsed, or None."""


def resolve_format(key: str, fmt: str) -> tuple[ParsedFormat, bool]:
    """Return ``(format, gzip)`` for an object key.

    Args:
        key: The object key; a ``.gz`` suffix means gzip.
        fmt: ``csv``, ``jsonl`` or ``auto`` (pick by extension).

    Raises:
        UnknownFormatError: ``fmt`` is ``auto`` and the extension is not recognised.
    """
    lowered = key.lower()
    gz = lowered.endswith(".gz")
    base = lowered[:-3] if gz else lowered
    if fmt == "csv" or fmt == "jsonl":
        return fmt, gz
    if fmt != "auto":
        raise UnknownFormatError(f"unknown format {fmt!r} for {key!r}: expected 'csv', 'jsonl' or 'auto'")
    if base.endswith(_CSV_EXTENSIONS):
        return "csv", gz
    if base.endswith(_JSONL_EXTENSIONS):
        return "jsonl", gz
    raise UnknownFormatError(
        f"cannot tell the format of {key!r} from its extension (expected .csv, .jsonl, .ndjson or "
        ".json, optionally .gz); set format to 'csv' or 'jsonl' in the job input"
    )


def _too_long(what: str, max_bytes: int) -> str:
    return f"{what} is longer than max_record_bytes ({max_bytes} bytes)"


def _eol_length(raw: bytes) -> int:
    """Length of the line terminator (LF, CRLF or CR) that ends ``raw``; 0 without one."""
    if raw.endswith(b"\n"):
        return 2 if raw.endswith(b"\r\n") else 1
    return 1 if raw.endswith(b"\r") else 0


class _Source:
    """A binary stream read in blocks, with the position and line count handed out so far."""

    def __init__(self, stream: IO[bytes], offset: int, line: int, max_bytes: int) -> None:
        self.read: Callable[[int], bytes] = stream.read
        """How blocks are read (``readline`` to read no further than needed, for a header)."""
        self.offset = offset
        """Bytes handed out so far (absolute position in the object)."""
        self.lines = line - 1
        """Physical lines handed out so far."""
        self.max_bytes = max_bytes
        self.bad_lines: dict[int, str] = {}
        """Line number -> problem, for lines that are too long or not UTF-8."""

    def first_block(self) -> bytes:
        """The first block; at the start of the object, without its UTF-8 BOM (counted in ``offset``)."""
        read = self.read
        block = read(_BLOCK)
        if self.offset == 0:
            while 0 < len(block) < 3:
                more = read(_BLOCK)
                if not more:
                    break
                block += more
            if block.startswith(_BOM_BYTES):
                self.offset = 3
                block = block[3:] or read(_BLOCK)
        return block


# States of the csv module's reader (default dialect: doublequote, strict, no escape character), as
# far as they decide where a record ends.
_START, _IN_FIELD, _QUOTED, _QUOTE_IN_QUOTED, _ERROR = range(5)


def _csv_scan(state: int, data: bytes, pos: int, end: int, delimiter: bytes) -> int:
    """Run the csv reader's state machine over ``data[pos:end]`` (no line terminator inside)."""
    find = data.find
    delim = delimiter[0]
    while pos < end:
        if state == _QUOTED:
            pos = find(b'"', pos, end)
            if pos < 0:
                return _QUOTED
            state = _QUOTE_IN_QUOTED
        elif state == _IN_FIELD:
            pos = find(delimiter, pos, end)
            if pos < 0:
                return _IN_FIELD
            state = _START
        else:
            c = data[pos]
            if state == _QUOTE_IN_QUOTED:
                if c == 34:
                    state = _QUOTED  # an escaped quote
                elif c == delim:
                    state = _START
                else:
                    return _ERROR  # text after a closing quote: csv raises, the line ends the record
            elif c == 34:
                state = _QUOTED
            elif c != delim:
                state = _IN_FIELD
        pos += 1
    return state


class _CsvLines(_Source):
    """The lines of a CSV stream for ``csv.reader``, split as with ``newline=''``.

    The consumer sets ``fresh`` before asking the reader for a record; the lines pulled after that
    for the same record are its continuation lines (the reader asks for one only inside a quoted
    field). A record that grows past ``max_bytes`` is skipped from that point: its remaining bytes go
    through :func:`_csv_scan` instead of the reader, bounded in memory, and the reader gets a short
    ASCII stand-in that ends the record where the csv module would have ended it.
    """

    def __init__(self, stream: IO[bytes], offset: int, line: int, max_bytes: int, delimiter: bytes) -> None:
        super().__init__(stream, offset, line, max_bytes)
        self.delimiter = delimiter
        self.fresh = True
        """Set by the consumer: the next line asked for starts a record."""

    def __iter__(self) -> Iterator[str]:
        read = self.read
        max_bytes = self.max_bytes
        limit = max_bytes + 2  # the longest accepted content plus a CRLF
        bad = self.bad_lines
        block = self.first_block()
        n, off = self.lines, self.offset
        carry = b""
        used = 0
        while True:
            if block:
                data = carry + block if carry else block
                lines = data.splitlines(True)
                # A last line without LF may go on in the next block (a CR may be half of a CRLF).
                carry = lines.pop() if lines[-1][-1] != 10 else b""
            elif carry:
                lines = carry.splitlines(True)
                carry = b""
            else:
                return
            it = iter(lines)
            for raw in it:
                n += 1
                size = len(raw)
                if self.fresh:
                    self.fresh = False
                    used = size
                else:
                    used += size
                if used > max_bytes and used - _eol_length(raw) > max_bytes:
                    self.lines, self.offset = n, off
                    stand_in, block = self._skip_record(raw, used == size, b"".join(it) + carry, True)
                    n, off = self.lines, self.offset
                    carry = b""
                    if stand_in is not None:
                        yield stand_in
                    break
                off += size
                self.lines, self.offset = n, off
                try:
                    yield raw.decode()
                except UnicodeDecodeError as err:
                    bad[n] = f"invalid UTF-8 at byte {err.start} of the line"
                    yield raw.decode("utf-8", "replace")
            else:
                if not block:
                    return  # that was the last line
                if len(carry) > limit:  # a line too long for any record, still going on
                    n += 1
                    fresh, self.fresh = self.fresh, False
                    self.lines, self.offset = n, off
                    stand_in, block = self._skip_record(carry, fresh, b"", False)
                    n, off = self.lines, self.offset
                    carry = b""
                    if stand_in is not None:
                        yield stand_in
                    block = block or read(_BLOCK)
                else:
                    block = read(_BLOCK)
                continue
            block = block or read(_BLOCK)

    def _skip_record(self, raw: bytes, fresh: bool, rest: bytes, complete: bool) -> tuple[str | None, bytes]:
        """Consume the rest of a record that is longer than ``max_bytes``, without keeping it.

        Args:
            raw: The line that took the record past the limit (counted in ``lines``, not in
                ``offset``), or the start of that line when ``complete`` is false.
            fresh: ``raw`` is the record's first line.
            rest: Bytes read after ``raw`` and not handed out yet.

        Returns:
            The stand-in line for the csv reader (None: nothing, the object ended inside a quoted
            field) and the bytes read past the record.
        """
        max_bytes = self.max_bytes
        what = "line" if not complete or len(raw) - _eol_length(raw) > max_bytes else "record"
        self.bad_lines[self.lines] = _too_long(what, max_bytes)
        read = self.read
        delimiter = self.delimiter
        state = _START if fresh else _QUOTED
        data, pos = raw + rest, 0
        counted = True  # the physical line at `pos` is counted in `lines`
        while True:
            if pos == len(data):
                data, pos = read(_BLOCK), 0
                if not data:  # the end of the object ends the record
                    if state != _QUOTED:
                        break
                    # Unterminated quoted field: the reader must fail the record as it would have.
                    return ('"' if fresh else None), b""
            if not counted:
                self.lines += 1
                counted = True
            lf = data.find(b"\n", pos)
            cr = data.find(b"\r", pos, len(data) if lf < 0 else lf)
            eol = cr if cr >= 0 else lf
            if eol < 0:
                if state != _ERROR:
                    state = _csv_scan(state, data, pos, len(data), delimiter)
                self.offset += len(data) - pos
                pos = len(data)
                continue
            if state != _ERROR:
                state = _csv_scan(state, data, pos, eol, delimiter)
            if eol == cr and eol + 1 == len(data):  # a CR at the end of what was read: CRLF?
                self.offset += eol - pos
                data, pos, eol = data[eol:] + read(_BLOCK), 0, 0
            end = eol + 2 if data[eol : eol + 2] == b"\r\n" else eol + 1
            self.offset += end - pos
            pos = end
            if state != _QUOTED:
                break  # the line break ends the record (or the reader's error did)
            counted = False  # a line break inside a quoted field: the record goes on
        return ("\n" if fresh else '"\n'), data[pos:]


class CsvParser:
    """CSV with a header row, read as the csv module reads it (``strict``; quoted fields with
    delimiters, quotes and line breaks; LF, CRLF or CR line ends; a UTF-8 BOM)."""

    def __init__(
        self,
        stream: IO[bytes],
        *,
        offset: int = 0,
        line: int = 1,
        header: list[str] | None = None,
        max_line_bytes: int = 8 * 1024 * 1024,
        delimiter: str = ",",
    ) -> None:
        """Create a parser.

        Args:
            stream: Binary stream positioned at ``offset`` of the (decompressed) object.
            offset: Position of ``stream`` in the object; 0 means the header row comes first.
            line: Physical line number at ``offset``.
            header: Column names, required when resuming from ``offset > 0``.
            max_line_bytes: Longer records become rejects (see the module docstring).
            delimiter: Field delimiter, one ASCII character other than a quote or a line break.
        """
        if offset > 0 and header is None:
            raise ValueError("resuming a CSV from a byte offset needs its header")
        if len(delimiter) != 1 or not delimiter.isascii() or delimiter in '"\r\n':
            raise ValueError(
                f"the delimiter must be one ASCII character other than a quote or a line break, not {delimiter!r}"
            )
        self._src = _CsvLines(stream, offset, line, max_line_bytes, delimiter.encode())
        self.header = header
        self._delimiter = delimiter

    @property
    def offset(self) -> int:
        return self._src.offset

    @property
    def line(self) -> int:
        return self._src.lines + 1

    def _reader(self) -> Iterator[list[str]]:
        # Records are bounded by max_line_bytes here, so csv's own limit (process-wide, and raised or
        # lowered by whatever ran before in this process) must never decide: always its widest.
        if csv.field_size_limit() != _FIELD_LIMIT:
            csv.field_size_limit(_FIELD_LIMIT)
        return csv.reader(iter(self._src), delimiter=self._delimiter, strict=True)

    def _read_header(self, reader: Iterator[list[str]]) -> list[str] | None:
        """Read the header row (blank lines before it are skipped); None for a file without rows.

        Raises:
            ValueError: The header row is not valid CSV, not UTF-8, too long, or has an empty or
                duplicate column name.
        """
        src = self._src
        bad = src.bad_lines
        while True:
            start = src.lines + 1
            src.fresh = True
            try:
                row = next(reader)
            except StopIteration:
                return None
            except csv.Error as err:
                problems = _take_problems(bad, start, src.lines) if bad else None
                if problems:
                    raise ValueError(f"the header row (line {start}) cannot be read: {problems}") from None
                raise ValueError(f"the header row (line {start}) is not valid CSV: {err}") from None
            problems = _take_problems(bad, start, src.lines) if bad else None
            if problems:
                raise ValueError(f"the header row (line {start}) cannot be read: {problems}")
            if row:
                _check_column_names(row, start)
                return row

    def __iter__(self) -> Iterator[Record]:
        """Read the header row now (when not given), then iterate over the records lazily.

        Raises:
            ValueError: The header row cannot be used (see :meth:`_read_header`). Raised by ``iter()``
                itself, not at the first ``next()``, so a caller can tell a bad file from a bad record.
        """
        reader = self._reader()
        if self.header is None:
            self.header = self._read_header(reader)
            if self.header is None:
                return iter(())
        return self._records(reader, self.header)

    def _records(self, reader: Iterator[list[str]], header: list[str]) -> Iterator[Record]:
        src = self._src
        bad = src.bad_lines
        width = len(header)
        new = tuple.__new__  # Record(...) goes through a Python-level __new__: 80 ns a record
        while True:
            start = src.lines + 1
            src.fresh = True
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as err:
                problems = _take_problems(bad, start, src.lines) if bad else None
                yield Record(start, None, problems or f"malformed CSV ({err}) in lines {start}-{src.lines}")
                continue
            if bad:
                problems = _take_problems(bad, start, src.lines)
                if problems:
                    yield Record(start, None, problems)
                    continue
            if not row:
                continue  # blank line: not a record
            if len(row) != width:
                yield Record(start, None, f"expected {width} fields (as in the header), got {len(row)}")
                continue
            yield new(Record, (start, dict(zip(header, row, strict=True)), None))


def _check_column_names(row: list[str], line: int) -> None:
    """Refuse a header that would lose values: every column needs a distinct, non-empty name."""
    seen: dict[str, int] = {}
    for number, name in enumerate(row, 1):
        if not name:
            raise ValueError(
                f"column {number} of the header row (line {line}) has no name; every column needs a "
                "distinct, non-empty name: name it in the header row"
            )
        if name in seen:
            raise ValueError(
                f"columns {seen[name]} and {number} of the header row (line {line}) have the same name, "
                "so one column's values would be lost; give every column a distinct name in the header row"
            )
        seen[name] = number


def _take_problems(bad: dict[int, str], first: int, last: int) -> str | None:
    """Remove and join the problems flagged on lines ``first..last``."""
    found = [bad.pop(n) for n in range(first, last + 1) if n in bad]
    return "; ".join(found) if found else None


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
                    "JSON Lines (one complete JSON value per line); convert it to JSON Lines first (for an "
                    "array: jq -c '.[]')"
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


Parser = CsvParser | JsonlParser


def make_parser(
    fmt: ParsedFormat,
    stream: IO[bytes],
    *,
    offset: int = 0,
    line: int = 1,
    header: list[str] | None = None,
    max_line_bytes: int = 8 * 1024 * 1024,
) -> Parser:
    """Build the parser for ``fmt`` reading ``stream`` from ``offset``."""
    if fmt == "csv":
        return CsvParser(stream, offset=offset, line=line, header=header, max_line_bytes=max_line_bytes)
    return JsonlParser(stream, offset=offset, line=line, max_line_bytes=max_line_bytes)


def read_csv_header(stream: IO[bytes], max_line_bytes: int = 8 * 1024 * 1024) -> list[str] | None:
    """Read only the header row of a CSV stream that starts at byte 0 (None for an empty file).

    The stream is read line by line (up to each LF), so nothing after the header row is parsed, and
    with LF or CRLF line ends nothing after it is read either.

    Raises:
        ValueError: The header row cannot be used (not valid CSV, not UTF-8, too long, an empty or
            duplicate column name).
    """
    parser = CsvParser(stream, max_line_bytes=max_line_bytes)
    parser._src.read = stream.readline
    return parser._read_header(parser._reader())

"""CSV with a header row, read as Python's csv module reads it, knowing where each record ends.

See :mod:`s3batch.formats.common` for lines, limits and what raises.
"""

from __future__ import annotations

import csv
import sys
from collections.abc import Iterator
from typing import IO

from s3batch.formats.common import _BLOCK, Record, _eol_length, _Source, _too_long


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

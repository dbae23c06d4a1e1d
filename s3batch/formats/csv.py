"""CSV (any delimiter, quote and escape character, a header row, given or generated column names, any
encoding of :mod:`s3batch.reading`), read as Python's csv module reads it, knowing where each record ends.

See :mod:`s3batch.formats.common` for lines, limits and what raises.
"""

from __future__ import annotations

import csv
import io
import itertools
import sys
from collections.abc import Iterator
from typing import IO, Any

from s3batch.formats.common import _BLOCK, Record, _eol_length, _Source, _take_problems, _too_long
from s3batch.formats.csv_header import check_column_names, generated_names
from s3batch.formats.csv_scan import (
    ERROR,
    ESCAPED_IN_QUOTED,
    QUOTED,
    START,
    Tokens,
    after_line_end,
    scan,
    with_nulls,
)
from s3batch.formats.transcode import Utf16AsUtf8, utf16_byte_order
from s3batch.reading import Reading

DEFAULT_READING = Reading()
_LABELS = {"utf-8": "UTF-8", "utf-16-le": "UTF-16", "utf-16-be": "UTF-16", "utf-16": "UTF-16"}


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

class _CsvLines(_Source):
    """The lines of a CSV stream for ``csv.reader``, split as with ``newline=''``.

    The consumer sets ``fresh`` before asking the reader for a record; the lines pulled after that
    for the same record are its continuation lines (the reader asks for one only inside a quoted
    field, or after an escaped line break). A record that grows past ``max_bytes`` is skipped from
    that point: its remaining bytes go through :func:`scan` instead of the reader, bounded in
    memory, and the reader gets a short stand-in that ends the record where the csv module would have
    ended it.
    """

    def __init__(
        self, stream: IO[bytes], offset: int, line: int, max_bytes: int, tokens: Tokens, encoding: str, label: str
    ) -> None:
        super().__init__(stream, offset, line, max_bytes)
        if encoding != "utf-8":
            self.bom = b""
        self.tokens = tokens
        self.quote = tokens[1].decode(encoding)
        self.encoding = encoding
        self.label = label
        """The file's encoding as named in reject reasons."""
        self.transcoded = False
        """The bytes are UTF-8 transcoded from the file's encoding (UTF-16)."""
        self.fresh = True
        """Set by the consumer: the next line asked for starts a record."""
        self.state = QUOTED
        """The reader's state at the start of the next line of a record that goes on (tracked only with
        an escape character: without one a record goes on only inside quotes)."""
        self.keep = False  # set: the lines of each record are kept in `record` (an empty field: quoted or not?)
        self.record: list[str] = []

    def __iter__(self) -> Iterator[str]:
        read = self.read
        max_bytes = self.max_bytes
        limit = max_bytes + 2  # the longest accepted content plus a CRLF
        bad = self.bad_lines
        encoding = self.encoding
        utf8 = encoding == "utf-8"
        escaped = self.tokens[2] is not None
        keep = self.keep
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
                first = self.fresh
                if first:
                    self.fresh = False
                    used = size
                else:
                    used += size
                if used > max_bytes and used - _eol_length(raw) > max_bytes:
                    self.lines, self.offset = n, off
                    stand_in, block = self._skip_record(raw, first, b"".join(it) + carry, True)
                    n, off = self.lines, self.offset
                    carry = b""
                    if stand_in is not None:
                        yield stand_in
                    break
                off += size
                self.lines, self.offset = n, off
                if escaped:
                    self._track(raw, first)
                try:
                    text = raw.decode() if utf8 else raw.decode(encoding)  # decode() alone is faster
                except UnicodeDecodeError as err:
                    bad[n] = self._undecodable(err)
                    text = raw.decode(encoding, "replace")
                if keep:
                    if first:
                        self.record = []
                    self.record.append(text)
                yield text
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

    def _track(self, raw: bytes, first: bool) -> None:
        """Follow the reader's state over one line handed out (with an escape character only)."""
        eol = _eol_length(raw)
        state = scan(START if first else self.state, raw, 0, len(raw) - eol, self.tokens)
        after = after_line_end(state, raw[len(raw) - eol :]) if state != ERROR else None
        self.state = QUOTED if after is None else after

    def _undecodable(self, err: UnicodeDecodeError) -> str:
        if self.transcoded:  # the byte position would not be the file's
            return f"invalid {self.label} in the line (an unpaired surrogate or a truncated character)"
        return f"invalid {self.label} at byte {err.start} of the line"

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
        tokens = self.tokens
        state = START if fresh else self.state
        data, pos = raw + rest, 0
        counted = True  # the physical line at `pos` is counted in `lines`
        while True:
            if pos == len(data):
                data, pos = read(_BLOCK), 0
                if not data:  # the end of the object ends the record
                    if state != QUOTED and state != ESCAPED_IN_QUOTED:
                        break
                    # Unterminated quoted field: the reader must fail the record as it would have.
                    return (self.quote if fresh else None), b""
            if not counted:
                self.lines += 1
                counted = True
            lf = data.find(b"\n", pos)
            cr = data.find(b"\r", pos, len(data) if lf < 0 else lf)
            eol = cr if cr >= 0 else lf
            if eol < 0:
                if state != ERROR:
                    state = scan(state, data, pos, len(data), tokens)
                self.offset += len(data) - pos
                pos = len(data)
                continue
            if state != ERROR:
                state = scan(state, data, pos, eol, tokens)
            if eol == cr and eol + 1 == len(data):  # a CR at the end of what was read: CRLF?
                self.offset += eol - pos
                data, pos, eol = data[eol:] + read(_BLOCK), 0, 0
            end = eol + 2 if data[eol : eol + 2] == b"\r\n" else eol + 1
            after = after_line_end(state, data[eol:end])
            self.offset += end - pos
            pos = end
            if after is None:
                break  # the line break ends the record (or the reader's error did)
            state = after
            counted = False  # a line break inside a quoted field (or escaped): the record goes on
        self.state = QUOTED
        return ("\n" if fresh else self.quote + "\n"), data[pos:]


class CsvParser:
    """CSV read as the csv module reads it (``strict``; quoted fields with delimiters, quotes and line
    breaks; LF, CRLF or CR line ends; a UTF-8 BOM), in the dialect and encoding of a :class:`Reading` (with
    ``empty_null``, an unquoted empty field is None, a quoted one ``""`` the empty string)."""

    def __init__(
        self,
        stream: IO[bytes],
        *,
        offset: int = 0,
        line: int = 1,
        header: list[str] | None = None,
        max_line_bytes: int = 8 * 1024 * 1024,
        reading: Reading = DEFAULT_READING,
    ) -> None:
        """Create a parser.

        Args:
            stream: Binary stream positioned at ``offset`` of the (decompressed) object.
            offset: Position of ``stream`` in the object; 0 means the header row (if any) comes first.
            line: Physical line number at ``offset``.
            header: Column names: required when resuming from ``offset > 0`` (the header row's, or
                those generated from the first row for ``header: none``); the given names otherwise.
            max_line_bytes: Longer records become rejects (see the module docstring).
            reading: The dialect, header and encoding. In the middle of a UTF-16 file its encoding
                names the byte order (``utf-16-le``/``-be``, see :func:`utf16_byte_order`).
        """
        if header is None and reading.names is not None:
            header = list(reading.names)
        if offset > 0 and header is None:
            raise ValueError("resuming a CSV from a byte offset needs its header")
        self._transcoder: Utf16AsUtf8 | None = None
        if reading.wide:
            stream = self._transcoded(stream, offset, reading.encoding)
        label = _LABELS.get(reading.encoding, reading.encoding)
        self._src = _CsvLines(stream, offset, line, max_line_bytes, reading.tokens(), reading.byte_encoding, label)
        self._src.transcoded = reading.wide
        self._src.keep = reading.empty_null
        self._stream = stream
        self.header = header
        self._reading = reading
        self.first_line = line
        """The line of the header row (or, with ``header: none``, of the first row), once read."""
        self._width_from = (
            "as in the header" if reading.header_row else "as many as the header names" if reading.names else
            "as in the first row"
        )

    def _transcoded(self, stream: IO[bytes], offset: int, encoding: str) -> IO[bytes]:
        prefix = b""
        if offset == 0:
            while len(prefix) < 2:
                more = stream.read(2 - len(prefix))
                if not more:
                    break
                prefix += more
            codec, bom = utf16_byte_order(prefix, encoding)
            prefix = prefix[bom:]
            start = bom
        elif encoding == "utf-16":
            raise ValueError("resuming a UTF-16 file needs its byte order (utf-16-le or utf-16-be)")
        else:
            codec, start = encoding, offset
        self._transcoder = Utf16AsUtf8(stream, codec, start, offset, prefix)
        return io.BufferedReader(self._transcoder, _BLOCK)

    @property
    def offset(self) -> int:
        if self._transcoder is not None:
            return self._transcoder.source_offset(self._src.offset)
        return self._src.offset

    @property
    def line(self) -> int:
        return self._src.lines + 1

    def _reader(self) -> Iterator[list[str]]:
        # Records are bounded by max_line_bytes here, so csv's own limit (process-wide, and raised or
        # lowered by whatever ran before in this process) must never decide: always its widest.
        if csv.field_size_limit() != _FIELD_LIMIT:
            csv.field_size_limit(_FIELD_LIMIT)
        r = self._reading
        return csv.reader(
            iter(self._src), delimiter=r.delimiter, quotechar=r.quotechar, escapechar=r.escapechar, strict=True
        )

    def _read_header(self, reader: Iterator[list[str]]) -> list[str] | None:
        """Read the header row (blank lines before it are skipped); None for a file without rows.
        With ``header: none`` it is the first row, which sets the number of columns (its line is
        ``first_line``).

        Raises:
            ValueError: The header row is not valid CSV, not in the file's encoding, too long, or has
                an empty or duplicate column name.
        """
        src = self._src
        bad = src.bad_lines
        what = "the header row" if self._reading.header_row else "the first row (it sets the number of columns)"
        while True:
            start = self.first_line = src.lines + 1
            src.fresh = True
            try:
                row = next(reader)
            except StopIteration:
                return None
            except csv.Error as err:
                problems = _take_problems(bad, start, src.lines) if bad else None
                if problems:
                    raise ValueError(f"{what} (line {start}) cannot be read: {problems}") from None
                raise ValueError(f"{what} (line {start}) is not valid CSV: {err}") from None
            problems = _take_problems(bad, start, src.lines) if bad else None
            if problems:
                raise ValueError(f"{what} (line {start}) cannot be read: {problems}")
            if row:
                if self._reading.header_row:
                    check_column_names(row, start)
                return row

    def __iter__(self) -> Iterator[Record]:
        """Read the header row now (when not given), then iterate over the records lazily.

        Raises:
            ValueError: The header row cannot be used (see :meth:`_read_header`). Raised by ``iter()``
                itself, not at the first ``next()``, so a caller can tell a bad file from a bad record.
        """
        reader = self._reader()
        if self.header is not None:
            return self._records(reader, self.header)
        row = self._read_header(reader)
        if row is None:
            return iter(())
        if self._reading.header_row:
            self.header = row
            return self._records(reader, row)
        self.header = header = generated_names(len(row))
        first = Record(self.first_line, dict(zip(header, self._nulls(row), strict=True)))
        return itertools.chain((first,), self._records(reader, header))

    def _records(self, reader: Iterator[list[str]], header: list[str]) -> Iterator[Record]:
        src = self._src
        bad = src.bad_lines
        width = len(header)
        nulls = self._reading.empty_null
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
                yield Record(start, None, f"expected {width} fields ({self._width_from}), got {len(row)}")
                continue
            if nulls and "" in row:
                row = self._nulls(row)
            yield new(Record, (start, dict(zip(header, row, strict=True)), None))

    def _nulls(self, row: list[str]) -> list[Any]:
        """``row`` with its unquoted empty fields None, with ``empty_null`` (:func:`with_nulls`); else as it is."""
        r = self._reading
        if not r.empty_null or "" not in row:
            return row
        return with_nulls(row, "".join(self._src.record), r.delimiter, r.quotechar, r.escapechar)


def read_csv_header(
    stream: IO[bytes], max_line_bytes: int = 8 * 1024 * 1024, reading: Reading = DEFAULT_READING
) -> list[str] | None:
    """Read only the header row of a CSV stream that starts at byte 0 (None for an empty file); with
    ``header: none``, the names generated for its first row.

    The stream is read line by line (up to each LF), so nothing after the header row is parsed, and
    with LF or CRLF line ends nothing after it is read either.

    Raises:
        ValueError: The header row cannot be used (not valid CSV, not in the file's encoding, too long,
            an empty or duplicate column name).
    """
    parser = CsvParser(stream, max_line_bytes=max_line_bytes, reading=reading)
    parser._src.read = parser._stream.readline
    row = parser._read_header(parser._reader())
    return row if row is None or reading.header_row else generated_names(len(row))

"""Streaming record parsers that know exactly where each record ends.

A parser reads a binary stream line by line and yields :class:`Record` tuples. After each record it
exposes ``offset`` (bytes of the stream consumed, which is where the next record starts) and
``line`` (the physical line where the next record starts), so a checkpoint taken between two
records can be resumed with a ranged GET from ``offset``.

Malformed input never raises: a record that cannot be parsed is yielded with ``error`` set and
becomes a reject (with its line number) instead of failing the file. The one exception is an
unreadable CSV header row (``ValueError`` from ``iter()``): without it no record can be named.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from typing import IO, Any, Literal, NamedTuple

import orjson

ParsedFormat = Literal["csv", "jsonl"]

# Only comma-separated files are recognised: nothing downstream passes a delimiter to the parser, so
# auto-detecting ``.tsv`` as CSV would silently parse tab-separated rows as one-column records.
_CSV_EXTENSIONS = (".csv",)
_JSONL_EXTENSIONS = (".jsonl", ".ndjson", ".json")
_BOM_BYTES = b"\xef\xbb\xbf"


class Record(NamedTuple):
    """One parsed record."""

    line: int
    """Physical line (1-based) where the record starts in the decompressed object."""
    value: Any
    """A ``{column: value}`` dict for CSV, any JSON value for JSONL; None when ``error`` is set."""
    error: str | None = None
    """Why the record could not be parsed, or None."""


class UnknownFormatError(ValueError):
    """The format is ``auto`` and the key's extension names no supported format."""


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


class _LineSource:
    """Hands out the lines of a binary stream, counting bytes and lines exactly.

    A line whose content (without its ``\\n`` or ``\\r\\n`` terminator) is longer than
    ``max_line_bytes`` is skipped (read in bounded pieces and discarded), flagged in ``bad_lines`` and
    replaced by a short stand-in line, so a huge line costs no memory. With ``quote`` set (CSV), the
    stand-in keeps the parity of the quote characters of the skipped line, so a quoted field that opens
    or closes inside the skipped line still ends where it did and the following records parse as
    they would have.
    """

    def __init__(
        self, stream: IO[bytes], offset: int, line: int, max_line_bytes: int, quote: bytes | None = None
    ) -> None:
        self.stream = stream
        self.offset = offset
        """Bytes handed out so far (absolute position in the object)."""
        self.lines = line - 1
        """Physical lines handed out so far."""
        self.max_line_bytes = max_line_bytes
        self.quote = quote
        self.bad_lines: dict[int, str] = {}
        """Line number -> problem, for lines that are too long or not UTF-8."""

    def iter_lines(self, *, decode: bool, strip_bom: bool) -> Iterator[Any]:
        """The lines of the stream: ``str`` when ``decode`` (invalid UTF-8 is flagged and replaced),
        else ``bytes``. One generator on the hot path: every line goes through it."""
        readline = self.stream.readline
        max_bytes = self.max_line_bytes
        # Room for the longest accepted content plus a CRLF terminator.
        limit = max_bytes + 2
        bom = _BOM_BYTES if strip_bom else None
        while True:
            raw = readline(limit)
            if not raw:
                return
            self.lines += 1
            if len(raw) > max_bytes and self._too_long(raw, limit):
                # The stand-in is plain ASCII; the original line is gone.
                stand_in = self._skip_rest(raw)
                yield stand_in.decode() if decode else stand_in
                continue
            self.offset += len(raw)
            if bom is not None:
                if raw.startswith(bom):
                    raw = raw[3:]
                bom = None
            if not decode:
                yield raw
                continue
            try:
                yield raw.decode("utf-8")
            except UnicodeDecodeError as err:
                self.bad_lines[self.lines] = f"invalid UTF-8 at byte {err.start} of the line"
                yield raw.decode("utf-8", "replace")

    def _too_long(self, raw: bytes, limit: int) -> bool:
        if raw.endswith(b"\n"):
            content = len(raw) - (2 if raw.endswith(b"\r\n") else 1)
        elif len(raw) == limit:
            content = limit  # and more to come: longer than the limit in any case
        else:
            content = len(raw)  # the last line, without a terminator
        return content > self.max_line_bytes

    def _skip_rest(self, raw: bytes) -> bytes:
        """Discard the rest of an over-long line; return its stand-in and flag the line."""
        readline = self.stream.readline
        quote = self.quote
        size = len(raw)
        quotes = raw.count(quote) if quote else 0
        while raw and not raw.endswith(b"\n"):
            raw = readline(1024 * 1024)
            size += len(raw)
            if quote:
                quotes += raw.count(quote)
        self.offset += size
        self.bad_lines[self.lines] = f"line is longer than max_record_bytes ({self.max_line_bytes} bytes)"
        return (quote or b"") + b"\n" if quotes % 2 else b"\n"


class CsvParser:
    """RFC 4180 CSV with a header row: quoted fields with commas and newlines, CRLF, UTF-8 BOM."""

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
            max_line_bytes: Longer lines become rejects.
            delimiter: Field delimiter.
        """
        if offset > 0 and header is None:
            raise ValueError("resuming a CSV from a byte offset needs its header")
        if len(delimiter) != 1:
            raise ValueError(f"the delimiter must be one character, not {delimiter!r}")
        self._src = _LineSource(stream, offset, line, max_line_bytes, quote=b'"')
        self.header = header
        self._delimiter = delimiter
        # csv's own per-field limit (128 KiB by default, process-wide) would reject fields that
        # max_line_bytes allows. It is only ever raised here: a field is at most max_line_bytes
        # characters, which also bounds the memory of a quoted field that never closes.
        if csv.field_size_limit() < max_line_bytes:
            csv.field_size_limit(max_line_bytes)

    @property
    def offset(self) -> int:
        return self._src.offset

    @property
    def line(self) -> int:
        return self._src.lines + 1

    def _reader(self) -> Iterator[list[str]]:
        texts = self._src.iter_lines(decode=True, strip_bom=self._src.offset == 0)
        return csv.reader(texts, delimiter=self._delimiter, strict=True)

    def _read_header(self, reader: Iterator[list[str]]) -> list[str] | None:
        """Read the header row (blank lines before it are skipped); None for a file without rows.

        Raises:
            ValueError: The header row is not valid CSV, not UTF-8 or too long.
        """
        bad = self._src.bad_lines
        while True:
            start = self._src.lines + 1
            try:
                row = next(reader)
            except StopIteration:
                return None
            except csv.Error as err:
                raise ValueError(f"the header row (line {start}) is not valid CSV: {err}") from None
            problems = _take_problems(bad, start, self._src.lines) if bad else None
            if problems:
                raise ValueError(f"the header row (line {start}) cannot be read: {problems}")
            if row:
                return row

    def __iter__(self) -> Iterator[Record]:
        """Read the header row now (when not given), then iterate over the records lazily.

        Raises:
            ValueError: The header row is not valid CSV, not UTF-8 or too long. Raised by ``iter()``
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
        while True:
            start = src.lines + 1
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as err:
                _take_problems(bad, start, src.lines)
                yield Record(start, None, f"malformed CSV ({err}) in lines {start}-{src.lines}")
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
            yield Record(start, dict(zip(header, row, strict=True)))


def _take_problems(bad: dict[int, str], first: int, last: int) -> str | None:
    """Remove and join the problems flagged on lines ``first..last``."""
    found = [bad.pop(n) for n in range(first, last + 1) if n in bad]
    return "; ".join(found) if found else None


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
        self._src = _LineSource(stream, offset, line, max_line_bytes)
        self.header: list[str] | None = None

    @property
    def offset(self) -> int:
        return self._src.offset

    @property
    def line(self) -> int:
        return self._src.lines + 1

    def __iter__(self) -> Iterator[Record]:
        src = self._src
        loads = orjson.loads
        bad = src.bad_lines
        for raw in src.iter_lines(decode=False, strip_bom=src.offset == 0):
            if bad and src.lines in bad:
                yield Record(src.lines, None, bad.pop(src.lines))
                continue
            if raw.isspace() or not raw:
                continue
            try:
                yield Record(src.lines, loads(raw))
            except orjson.JSONDecodeError as err:
                yield Record(src.lines, None, f"invalid JSON: {err}")


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

    Nothing after the header row is read or parsed.

    Raises:
        ValueError: The header row is not valid CSV, not UTF-8 or too long.
    """
    parser = CsvParser(stream, max_line_bytes=max_line_bytes)
    return parser._read_header(parser._reader())

"""What the format readers share: :class:`Record`, and a binary stream read in blocks.

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

from collections.abc import Callable
from typing import IO, Any, Literal, NamedTuple

ParsedFormat = Literal["csv", "jsonl", "json", "parquet"]

_BOM_BYTES = b"\xef\xbb\xbf"

_BLOCK = 256 * 1024
"""Bytes read per call (no result depends on it; memory is a few blocks plus one record)."""
_FAR = 1 << 62


class Record(NamedTuple):
    """One parsed record."""

    line: int
    """Physical line (1-based) where the record starts in the decompressed object."""
    value: Any
    """A ``{column: value}`` dict for CSV, any JSON value for JSONL; None when ``error`` is set."""
    error: str | None = None
    """Why the record could not be parsed, or None."""


def _too_long(what: str, max_bytes: int) -> str:
    return f"{what} is longer than max_record_bytes ({max_bytes} bytes)"


def _take_problems(bad: dict[int, str], first: int, last: int) -> str | None:
    """Remove and join the problems flagged on lines ``first..last`` (``_Source.bad_lines``)."""
    found = [bad.pop(n) for n in range(first, last + 1) if n in bad]
    return "; ".join(found) if found else None


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
        self.bom = _BOM_BYTES
        """Skipped at the start of the object (none for an encoding other than UTF-8)."""

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
            if self.bom and block.startswith(self.bom):
                self.offset += len(self.bom)
                block = block[len(self.bom) :] or read(_BLOCK)
        return block


def line_breaks(raw: bytes) -> int:
    """The physical lines of ``raw`` (rows from a record's start): its CRs, LFs and CRLFs, and a last
    line without one (at the end of the object)."""
    ended = raw.endswith((b"\n", b"\r")) or not raw
    return raw.count(b"\n") + raw.count(b"\r") - raw.count(b"\r\n") + (not ended)

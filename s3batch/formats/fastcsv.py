"""The fast CSV path: :class:`CsvParser`'s records at native speed, the same records for every input.

:class:`FastCsvParser` reads a CSV a block (about 1 MiB) at a time with pyarrow and keeps the rows of
a block that provably read as the csv module reads them (:mod:`s3batch.formats.csv_arrow`: a round
trip through a minimal-quoting writer, compared byte for byte). From the first row that does not
(a malformed record, a reject of any kind, quoting a writer would not produce, a blank line), the
exact parser (:class:`~s3batch.formats.csv.CsvParser`) reads a stretch of the file, over the same
bytes, and the fast path starts again after it. So the records, their lines, the byte offsets after
each one and every reject are the exact parser's, and chunk boundaries (which depend on them) are too.

The ``passthrough`` handler's output comes from the block as well (:meth:`FastCsvParser.take_json`):
the JSON documents of many rows are built at once by pyarrow's string kernels, byte-identical to
``orjson.dumps`` of each row's dict.

Used for UTF-8 CSV without an escape character, with a one-byte delimiter and quote and at least two
columns (:func:`fast_reading`); everything else is read by the exact parser alone.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any

from s3batch.formats.common import Record
from s3batch.formats.csv import DEFAULT_READING, CsvParser
from s3batch.formats.csv_arrow import Block, BlockDocs, BlockEncoder, BlockReader, dict_maker, line_spans
from s3batch.reading import Reading

BLOCK_BYTES = 1 << 20
"""Bytes parsed by pyarrow at once (a block ends after its last line break)."""
_EXACT_BYTES = 4 * 1024
"""Where a block's first record cannot be read fast, the exact parser reads that record; when that
happens again with few fast rows in between, it reads this many bytes, doubling each time (up to
:data:`_EXACT_MAX`): a file that is rarely damaged stays fast, a file that is mostly not canonical
costs a pyarrow attempt only every few MiB."""
_EXACT_MAX = 16 << 20
_GOOD_BLOCK = 64
"""Fast rows in a block that reset the doubling."""
_ALL = 1 << 62
_WINDOW = 1_000
"""Rows of a block turned into ``{column: value}`` dicts at once, for the records read one by one."""


def fast_reading(reading: Reading) -> bool:
    """Whether files read with ``reading`` can take the fast path."""
    return (
        reading.encoding == "utf-8"
        and reading.escapechar is None
        and len(reading.delimiter.encode()) == 1
        and len(reading.quotechar.encode()) == 1
    )


class _Tee:
    """The parser's stream as the exact parser reads it, from an offset: bytes come from the parser's
    buffer first, and what is read further is kept in the buffer (the fast path goes on from there)."""

    def __init__(self, owner: FastCsvParser, at: int) -> None:
        self.owner = owner
        self.at = at

    def read(self, n: int = -1) -> bytes:
        owner = self.owner
        n = BLOCK_BYTES if n is None or n < 0 else n
        owner.trim()  # what the exact parser has consumed is not needed again (a 50 MB record is skipped)
        if self.at + n > owner.buf_start + len(owner.buf) and not owner.eof:
            owner.fill(self.at - owner.buf_start + n)
        start = self.at - owner.buf_start
        out = owner.buf[start : start + n]
        self.at += len(out)
        return out


class FastCsvParser:
    """Reads like :class:`~s3batch.formats.csv.CsvParser` (same arguments, records, ``offset``, ``line``
    and ``header``), a block at a time where it can (see the module docstring); ``block_bytes``: the size
    of a block (tests make it tiny, so that blocks end anywhere)."""

    def __init__(
        self,
        stream: IO[bytes],
        *,
        offset: int = 0,
        line: int = 1,
        header: list[str] | None = None,
        max_line_bytes: int = 8 * 1024 * 1024,
        reading: Reading = DEFAULT_READING,
        block_bytes: int = BLOCK_BYTES,
    ) -> None:
        if header is None and reading.names is not None:
            header = list(reading.names)
        if offset > 0 and header is None:
            raise ValueError("resuming a CSV from a byte offset needs its header")
        self._stream = stream
        self._block_bytes = block_bytes
        self._reading = reading
        self._max = max_line_bytes
        self.header = header
        self.buf = b""
        self.buf_start = self._pos = offset
        self._line = line
        self.eof = False
        self._exact: CsvParser | None = None
        self._exact_it: Iterator[Record] | None = None
        self._until = 0
        self._failures = 0
        self._blocks: BlockReader | None = None
        self._block: Block | None = None
        self._row = 0
        self._values: list[dict[str, str]] = []
        """The values of rows ``_values_at`` on of the block (made a window at a time: a chunk's lookahead
        record alone must not turn a whole block into dicts)."""
        self._values_at = 0
        self._make_dicts: Callable[..., list[dict[str, str]]] | None = None
        self._spans: list[int] | None = None
        """Lines before each row of the block (None: not counted yet, or one a row)."""
        self._extra: Any = False
        """The line breaks inside each row's fields (``BlockReader.extra_lines``; False: not counted yet)."""
        self._docs: BlockDocs | None = None
        self._done = False
        self.fast_records = 0
        """Records read by the fast path (the rest were read by the exact parser)."""

    # ------------------------------------------------------------------ position

    @property
    def offset(self) -> int:
        if self._exact is not None:
            return self._exact.offset
        if self._block is not None and self._row:
            return self._pos + self._block.ends[self._row - 1]
        return self._pos

    @property
    def line(self) -> int:
        if self._exact is not None:
            return self._exact.line
        if self._block is not None and self._row:
            return self._line + self._lines_before(self._row)
        return self._line

    def _lines_before(self, row: int) -> int:
        """Physical lines of the block's first ``row`` rows (each good row is one line, and as many more
        as the line breaks inside its fields)."""
        if self._spans is not None:
            return self._spans[row]
        assert self._block is not None
        extra = self._extra_lines(self._block)
        return row if extra is None or row == 0 else row + extra.slice(0, row).sum().as_py()

    def _extra_lines(self, block: Block) -> Any:
        """``BlockReader.extra_lines`` of the block (counted once)."""
        if self._extra is False:
            assert self._blocks is not None
            self._extra = self._blocks.extra_lines(block)
        return self._extra

    def _row_lines(self, block: Block) -> list[int] | None:
        """Lines before each row of ``block`` (and after its last); None: one a row (``row`` lines before ``row``)."""
        if self._spans is None:
            extra = self._extra_lines(block)
            if extra is None:
                return None
            self._spans = line_spans(extra)
        return self._spans

    # ------------------------------------------------------------------ reading

    def trim(self) -> None:
        """Drop the bytes before the exact parser's position (the fast path resumes there at the earliest)."""
        if self._exact is not None:
            drop = self._exact.offset - self.buf_start
            if drop > 0:
                self.buf = self.buf[drop:]
                self.buf_start += drop

    def fill(self, want: int) -> None:
        """Hold at least ``want`` bytes from ``buf_start`` (fewer at the end of the stream)."""
        pieces = [self.buf]
        held = len(self.buf)
        while held < want:
            more = self._stream.read(max(want - held, 64 * 1024))
            if not more:
                self.eof = True
                break
            pieces.append(more)
            held += len(more)
        self.buf = b"".join(pieces)

    def __iter__(self) -> Iterator[Record]:
        """Like ``CsvParser.__iter__``: a header row that cannot be used raises ``ValueError`` here."""
        if self._pos == 0 or self.header is None:
            # The start of the object (a BOM, the header row): the exact parser reads the first record.
            self._start_exact(1)
        return self._records()

    def _records(self) -> Iterator[Record]:
        while True:
            record = self._next()
            if record is None:
                return
            yield record

    def _start_exact(self, until: int) -> None:
        self._exact = CsvParser(
            _Tee(self, self._pos),  # type: ignore[arg-type]  # only read() is used
            offset=self._pos,
            line=self._line,
            header=self.header,
            max_line_bytes=self._max,
            reading=self._reading,
        )
        self._exact_it = iter(self._exact)
        self.header = self._exact.header
        self._until = until

    def _leave_exact(self) -> None:
        assert self._exact is not None
        self._pos, self._line = self._exact.offset, self._exact.line
        self._exact = self._exact_it = None

    def _next(self) -> Record | None:
        while True:
            if self._exact is not None:
                assert self._exact_it is not None
                record = next(self._exact_it, None)
                if record is None:
                    self._leave_exact()
                    self._done = True
                    return None
                if self._exact.offset >= self._until:
                    self._leave_exact()
                return record
            block = self._block
            if block is not None and self._row < block.rows:
                return self._block_record(block)
            if self._done or not self._next_block():
                return None

    def _block_record(self, block: Block) -> Record:
        row = self._row
        at = row - self._values_at
        if not 0 <= at < len(self._values):
            first = not self._values  # the first record of the block read alone (e.g. a chunk's lookahead)
            self._values = self._dicts(block, row, 1 if first else _WINDOW)
            self._values_at, at = row, 0
        else:
            first = False
        # One record alone: its lines from the block's counts; records one after the other: all rows' lines at once.
        spans = None if first else self._row_lines(block)
        line = self._line + (self._lines_before(row) if spans is None else spans[row])
        record = Record(line, self._values[at], None)
        self._row = row + 1
        self.fast_records += 1
        if self._row == block.rows:
            self._finish_block()
        return record

    def _finish_block(self) -> None:
        block = self._block
        assert block is not None
        self._pos += block.ends[-1]
        self._line += self._lines_before(block.rows)
        self._block = None
        self._values = []
        self._values_at = 0
        self._row = 0
        self._spans = None
        self._extra = False

    def _next_block(self) -> bool:
        """Read the next block: fast when it can be, else start the exact parser. False at the end."""
        if self._blocks is None:
            assert self.header is not None
            if len(self.header) < 2:  # a one-column row may be written "" (not minimal quoting)
                self._start_exact(_ALL)
                return True
            delimiter, quote = self._reading.delimiter, self._reading.quotechar
            self._blocks = BlockReader(self.header, delimiter, quote, self._max, self._reading.empty_null)
            self._docs = BlockDocs(self._blocks)
        self.buf = self.buf[self._pos - self.buf_start :]
        self.buf_start = self._pos
        if len(self.buf) < self._block_bytes and not self.eof:
            self.fill(self._block_bytes)
        data = self.buf
        if not data:
            self._done = True
            return False
        last = self.eof
        if not last:
            data = data[: data.rfind(b"\n") + 1]
        block = self._blocks.read(data, last=last) if data else None
        if block is None or block.rows == 0:
            self._failures += 1
            stretch = 0 if self._failures == 1 else min(self._block_bytes, _EXACT_BYTES) << min(self._failures - 2, 12)
            self._start_exact(self._pos + min(stretch, _EXACT_MAX))
            return True
        if block.rows >= _GOOD_BLOCK or (last and block.ends[-1] == len(data)):
            self._failures = 0
        self._block, self._row = block, 0
        return True

    # ------------------------------------------------------------------ passthrough at once

    def take_json(
        self, want: int, until: int, csv_lines: list[int] | None = None, encoder: BlockEncoder | None = None
    ) -> tuple[int, list[bytes], bool, int]:
        """Up to ``want`` records as the ``passthrough`` handler's JSON documents (``encoder``: a handler's
        block encoder's, ``s3batch.columns``, stopping before a row it left to the handler), as ``take`` in
        the chunk loop takes them: stop after a record whose end reaches ``until``.

        With ``csv_lines``, the records' own CSV bytes instead (rows as the file has them, each with its
        line end: canonical CSV, for a database's CSV ``COPY``), and their lines appended to ``csv_lines``.

        Returns:
            The records taken; their documents (pieces of whole lines, each without its final line feed,
            so that ``b"\n".join`` of the chunk's outputs is the part's bytes) or CSV bytes; whether
            ``until`` was reached; and the bytes of their JSON documents (as ``HandlerRun.handle`` counts
            outputs). Fewer than ``want`` without reaching ``until``: the next record is not in a fast
            block, or is left to the handler (read those with the record iterator: :meth:`slow_rows`).
        """
        taken = size = 0
        pieces: list[bytes] = []
        while taken < want:
            block = self._block
            if self._exact is not None or block is None or self._row >= block.rows:
                if self._exact is not None or self._done or not self._next_block() or self._exact is not None:
                    break
                continue
            assert self._docs is not None
            refused: list[int] = []
            if csv_lines is None:
                encoded = self._docs.json(block, encoder)
                if encoded is None:
                    break
                blob, ends, refused = encoded
            else:  # the rows stay CSV: their JSON documents' sizes only (the byte budget counts those)
                ends = self._docs.sizes(block) or []
                if not ends:  # None: a value orjson writes as \u00XX (the caller takes such rows one by one)
                    break
            row = self._row
            n = self._run(block, want - taken, until)
            n = min(n, BlockDocs.good_run(refused, row))  # to the next row the encoder left to the handler
            if n == 0:
                break
            size += ends[row + n] - ends[row] - n
            if csv_lines is None:
                pieces.append(blob[ends[row] : ends[row + n] - 1])
            else:
                start = block.ends[row - 1] if row else 0
                pieces.append(block.raw[start : block.ends[row + n - 1]])
                csv_lines.extend(self._lines(block, row, n))
            taken += n
            if self._advance(block, n, until):
                return taken, pieces, True, size
        return taken, pieces, False, size

    def slow_rows(self, most: int) -> int:
        """How many records from here :meth:`take_json` does not take (at least 1, at most ``most``): the rows
        a block encoder left to the handler, the rest of a block that could not be encoded, or one."""
        block = self._block
        if self._exact is not None or block is None or self._docs is None:
            return 1
        return self._docs.slow_rows(block, self._row, most)

    def take_records(self, want: int, until: int) -> list[Record]:
        """Up to ``want`` records (at least one, if any is left), fewer once ``offset`` reaches ``until``:
        the records ``activities.taking.take`` reads from this parser one by one, with the rows of a fast
        block made at once (their dicts, lines and ``Record`` tuples; about a third of the cost of a
        generator step each)."""
        out: list[Record] = []
        want = max(want, 1)
        while len(out) < want:
            block = self._block
            if self._exact is not None or block is None or self._row >= block.rows:
                record = self._next()  # the exact parser, or the next block's first record
                if record is None:
                    break
                out.append(record)
                if self.offset >= until:
                    break
                continue
            row = self._row
            n = self._run(block, want - len(out), until)
            rows = zip(self._lines(block, row, n), self._dicts(block, row, n), itertools.repeat(None))
            out += map(tuple.__new__, itertools.repeat(Record), rows)  # Record._make without its Python frame
            if self._advance(block, n, until):
                break
        return out

    def _run(self, block: Block, want: int, until: int) -> int:
        """Rows taken at once from ``_row``: ``want`` at most, to the first whose end reaches ``until``."""
        reach = bisect.bisect_left(block.ends, until - self._pos, lo=self._row)
        return min(want, reach - self._row + 1, block.rows - self._row)

    def _advance(self, block: Block, n: int, until: int) -> bool:
        """Move past ``n`` rows of the block read fast; whether the last one's end reached ``until``."""
        self.fast_records += n
        self._row += n
        stop = self._pos + block.ends[self._row - 1] >= until
        if self._row == block.rows:
            self._finish_block()
        return stop

    def _dicts(self, block: Block, row: int, n: int) -> list[dict[str, str]]:
        """The ``{column: value}`` dicts of rows ``row`` to ``row + n`` of the block."""
        columns = [c.to_pylist() for c in block.table.slice(row, n).columns]
        names = self.header or []
        if self._make_dicts is None:
            self._make_dicts = dict_maker(len(names))
        return self._make_dicts(columns, *names)

    def _lines(self, block: Block, row: int, n: int) -> Iterable[int]:
        """The lines of rows ``row`` to ``row + n`` of the block."""
        spans = self._row_lines(block)
        if spans is None:
            return range(self._line + row, self._line + row + n)
        return list(map(self._line.__add__, spans[row : row + n]))

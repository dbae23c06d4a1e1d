"""Native-speed CSV blocks (pyarrow): parse a block at once, prove it reads as the csv module reads it,
and encode its rows as the ``passthrough`` handler's JSON documents at once.

The proof is a round trip: a block is *canonical* when it is exactly the bytes a minimal-quoting CSV
writer gives for the rows pyarrow read (a field quoted when, and only when, it holds the delimiter, the
quote or a line break, or, where an unquoted empty field is null, is the empty string; a quote inside
doubled; every row ended by the same line end). Python's csv
module reads canonical bytes back as exactly those rows, so where the bytes compare equal (one
``memcmp``) both parsers agree by construction, whatever pyarrow does with other input. Where they do
not (a malformed row, quoting that is not minimal, a blank line, a lone CR, bytes that are not UTF-8,
a record over ``max_record_bytes``), the first row that differs is found, and the rows before it are
still good: :mod:`s3batch.formats.fastcsv` reads from there with the exact parser.

Why pyarrow: its CSV reader is already a dependency (Parquet), parses about 6M rows/s on one thread
(docs/explanation/performance.md), and its string kernels build the canonical bytes and the JSON documents
without a Python call per row.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import Any, NamedTuple

import orjson
import pyarrow as pa  # type: ignore[import-untyped]  # pyarrow ships no type information
import pyarrow.compute as pc  # type: ignore[import-untyped]
import pyarrow.csv as pcsv  # type: ignore[import-untyped]

_SHORT_ESCAPES = (("\\", "\\\\"), ('"', '\\"'), ("\n", "\\n"), ("\r", "\\r"), ("\t", "\\t"))
"""What orjson writes for these characters (the backslash first); other control characters are
written as ``\\u00XX``, which the block encoder leaves to orjson (see :func:`json_rows`)."""


class Block(NamedTuple):
    """The good rows at the start of a block."""

    rows: int
    """Rows read as the csv module reads them (0: none; read the block's first record exactly)."""
    ends: list[int]
    """The end of each good row, from the block's start (its line end included)."""
    raw: bytes
    """The bytes of the good rows."""
    table: Any
    """The good rows, one string column per name (a ``pyarrow.Table``)."""
    special: list[frozenset[int]]
    """Per column, the bytes its values hold that need quoting in CSV or escaping in JSON (the delimiter,
    the quote, a backslash, control characters)."""


_NONE = Block(0, [], b"", None, [])


def _skip(_row: Any) -> str:
    return "skip"  # a row of another width: the round trip finds where it was


def _options(names: list[str], delimiter: str, quote: str, nulls: bool) -> tuple[Any, Any, Any]:
    read = pcsv.ReadOptions(column_names=names, use_threads=False, block_size=1 << 30)
    parse = pcsv.ParseOptions(
        delimiter=delimiter,
        quote_char=quote,
        double_quote=True,
        escape_char=False,
        newlines_in_values=True,
        ignore_empty_lines=True,
        invalid_row_handler=_skip,
    )
    convert = pcsv.ConvertOptions(
        column_types=dict.fromkeys(names, pa.string()),
        strings_can_be_null=nulls,  # an unquoted empty field only (not "", nor pyarrow's default "NULL", "NA"...)
        null_values=[""],
        quoted_strings_can_be_null=False,
        check_utf8=True,
    )
    return read, parse, convert


class BlockReader:
    """Reads blocks of one CSV dialect and header (UTF-8, no escape character, one-byte delimiter and quote).

    Args:
        names: The column names (at least two: a one-column row may be written ``""``).
        delimiter: The delimiter.
        quote: The quote character.
        max_record_bytes: A longer record is not good (the exact parser makes it a reject).
        nulls: An unquoted empty field is null (``Reading.empty_null``), a quoted one ``""`` the empty string;
            the canonical bytes write them so (else both are ``''``, written unquoted).
    """

    def __init__(
        self, names: list[str], delimiter: str, quote: str, max_record_bytes: int, nulls: bool = False
    ) -> None:
        self.names = names
        self.delimiter = delimiter
        self.quote = quote
        self.max_record_bytes = max_record_bytes
        self.nulls = nulls
        self._options = _options(names, delimiter, quote, nulls)
        # A double quote matters whatever the quote character: JSON escapes it.
        self._boring = bytes(b for b in range(256) if b == 10 or not (b < 32 or b in (ord(quote), 0x22, 0x5C)))
        """Deleted from a block to see which of the bytes that matter it holds (``bytes.translate``: 0.5 ms
        a MiB, where a regular expression kernel over a column's values costs 0.4 us a value)."""
        self._plain = bytes(b for b in range(256) if not (b < 32 or b in (ord(delimiter), ord(quote), 0x22, 0x5C)))
        """Deleted from a column's values to see which special bytes they hold."""
        self._csv_special = frozenset({ord(delimiter), ord(quote), 10, 13})
        self._quote = ord(quote)
        self._keys = [("{" if i == 0 else ",") + orjson.dumps(n).decode() + ':"' for i, n in enumerate(names)]
        self._json_fixed = len("".join(self._keys).encode()) + len(self._keys) - 1 + 3
        """Bytes of a row's JSON document besides its values: the keys, '"' before each key but the first, '"}\n'."""

    def read(self, data: bytes, *, last: bool) -> Block:
        """The good rows at the start of ``data``, which starts at a record and ends after a line end
        (or, when ``last``, at the end of the object).

        The last row of a block that is not ``last`` is never good: it may be cut inside a quoted field.
        """
        eol = b"\r\n" if data.find(b"\r\n") == data.find(b"\n") - 1 >= 0 else b"\n"
        body = data if not last or data.endswith((b"\n", b"\r")) or not data else data + eol
        try:
            body.decode()  # (about 10 GB/s) pyarrow's handler of a row of another width cannot take bad UTF-8
        except UnicodeDecodeError as err:
            cut = body.rfind(b"\n", 0, err.start) + 1
            return self.read(data[:cut], last=False) if cut else _NONE  # the rows before it
        try:
            table = pcsv.read_csv(pa.BufferReader(pa.py_buffer(body)), *self._options).combine_chunks()
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return _NONE
        columns = _columns(table)
        special: list[frozenset[int]]
        if not frozenset(body.translate(None, self._boring)) - {13}:
            special = [frozenset()] * len(columns)  # nothing quoted or escaped: a CR ends a row or is in a CRLF
        else:
            special = [frozenset(_values(c).translate(None, self._plain)) for c in columns]
        rows = self._canonical(columns, special, eol, self.nulls and self.quote.encode() * 2 in body)
        buffers = rows.buffers()
        offsets = memoryview(buffers[1]).cast("i")[rows.offset : rows.offset + len(rows) + 1]
        base = offsets[0]
        text = bytes(memoryview(buffers[2])[base : offsets[-1]])
        good = len(rows)
        if len(text) > len(body) or text != (body if len(text) == len(body) else body[: len(text)]):
            good = _first_difference(text, body, offsets)
        if not last and good == len(rows):
            good -= 1  # the block may end inside its last row
        if good > 0 and len(body) > self.max_record_bytes + len(eol):  # a shorter block has no longer row
            good = self._first_too_long(rows, eol, good)
        if good <= 0:
            return _NONE
        ends = _from(offsets[1 : good + 1], base)
        if last and body is not data:
            ends[-1] = min(ends[-1], len(data))
        return Block(good, ends, data[: ends[-1]], table.slice(0, good), special)

    def _canonical(self, columns: list[Any], special: list[frozenset[int]], eol: bytes, empties: bool) -> Any:
        """Each row as a minimal-quoting writer writes it, its line end included; with ``nulls``, a null as nothing
        and an empty string as ``""`` (looked for only where the block holds two quotes in a row: ``empties``).

        Two joins (the columns with the delimiter as separator, then the line end): a join's scalar
        arguments cost as much as its columns (12 arguments for 6 columns took 4 ms a MiB block, these
        two 1.1 ms)."""
        quote = self.quote
        fields: list[Any] = []
        for column, found in zip(columns, special, strict=True):
            chars = found & self._csv_special
            if chars:  # some values need quotes: those holding one of these characters
                if len(chars) == 1:
                    need = pc.match_substring(column, chr(next(iter(chars))))
                else:  # one pass for all (0.7 ms a MiB block for each match_substring, 1.4 ms for the class)
                    need = pc.match_substring_regex(column, "[" + "".join(f"\\x{c:02x}" for c in sorted(chars)) + "]")
                doubled = pc.replace_substring(column, quote, quote * 2) if self._quote in chars else column
                column = pc.if_else(need, pc.binary_join_element_wise(quote, doubled, quote, ""), column)
            if empties:
                column = pc.if_else(pc.equal(pc.binary_length(column), 0), quote * 2, column)
            if column.null_count:
                column = pc.fill_null(column, "")
            fields.append(column)
        return pc.binary_join_element_wise(pc.binary_join_element_wise(*fields, self.delimiter), eol.decode(), "")

    def _first_too_long(self, rows: Any, eol: bytes, good: int) -> int:
        longest = self.max_record_bytes + len(eol)
        over = pc.greater(pc.binary_length(rows.slice(0, good)), longest)
        if not pc.any(over).as_py():
            return good
        return int(pc.index(over, True).as_py())

    def extra_lines(self, block: Block) -> Any:
        """Per good row, the line breaks inside its fields (an int array), or None where no field holds
        one (each good row is then one line: it ends with one line end, or is the object's last).

        From the columns that hold a CR or an LF (``Block.special``), not the block's bytes: three
        kernels over those columns' values cost about half of counting the bytes of the block."""
        extra = None
        for column, found in zip(_columns(block.table), block.special, strict=True):
            if 10 in found and 13 in found:
                n = pc.subtract(
                    pc.add(pc.count_substring(column, "\n"), pc.count_substring(column, "\r")),
                    pc.count_substring(column, "\r\n"),
                )
            elif found & {10, 13}:  # LFs alone or CRs alone: one kernel
                n = pc.count_substring(column, "\n" if 10 in found else "\r")
            else:
                continue
            if n.null_count:
                n = pc.fill_null(n, 0)
            extra = n if extra is None else pc.add(extra, n)
        return extra

    def json_ends(self, block: Block) -> list[int] | None:
        """Where each row's JSON document would start in :meth:`json_rows`' blob (one more: the end), without
        writing them: the lengths of the values, one byte more for each character orjson escapes in two, and
        the keys and punctuation (the same for every row). None where :meth:`json_rows` gives None. For the
        byte budget of rows kept as CSV (a table's ``COPY``), about a tenth of the cost of the documents."""
        total = None
        for column, found in zip(_columns(block.table), block.special, strict=True):
            if any(b < 32 and b not in (9, 10, 13) for b in found):
                return None
            n = pc.binary_length(column)
            for char, _ in _SHORT_ESCAPES:
                if ord(char) in found:
                    n = pc.add(n, pc.count_substring(column, char))
            if n.null_count:
                n = pc.fill_null(n, 2)  # null: two bytes more than the quotes counted in _json_fixed
            total = n if total is None else pc.add(total, n)
        if total is None:
            return [0]
        return [0, *_ints(pc.cumulative_sum(pc.add(total, self._json_fixed)))]

    def json_rows(self, block: Block) -> tuple[bytes, list[int]] | None:
        """The rows of ``table`` as the ``passthrough`` handler writes them (``orjson.dumps`` of the
        ``{column: value}`` dict, a null value ``null``), each followed by a line feed, and where each starts (one
        more: the end); None when a value holds a control
        character orjson writes as ``\\u00XX`` (the caller encodes those rows one by one)."""
        pieces: list[Any] = []
        close = '"'
        for key, column, found in zip(self._keys, _columns(block.table), block.special, strict=True):
            if any(b < 32 and b not in (9, 10, 13) for b in found):
                return None
            for char, escaped in _SHORT_ESCAPES:
                if ord(char) in found:
                    column = pc.replace_substring(column, char, escaped)
            before = close
            if column.null_count:  # its quotes go with each value that is not null
                column = pc.fill_null(pc.binary_join_element_wise('"', column, '"', ""), "null")
                key, close = key[:-1], ""
            else:
                close = '"'
            if pieces:
                pieces[-1] = before + key  # one scalar between two columns: each costs as much as a column
            else:
                pieces.append(key)
            pieces += [column, close + "}\n"]
        return _concatenated(pc.binary_join_element_wise(*pieces, ""))


BlockEncoder = Callable[[Any], Any]
"""A handler's block encoder (:mod:`s3batch.columns`): a block's rows (a ``pyarrow.Table`` of string columns
named by the header) to one JSON document per row (a string array, null where the handler must see the row),
or None (every row)."""


def encode_block(encoder: BlockEncoder, table: Any) -> tuple[bytes, list[int], list[int]] | None:
    """``encoder``'s documents as :meth:`BlockReader.json_rows` gives passthrough's (each followed by a line
    feed, and where each starts), with the rows it left to the handler (in order). None: it left every row.

    Raises:
        TypeError: The encoder broke its contract (not one string per row): the file fails, naming it.
    """
    docs = encoder(table)
    if docs is None:
        return None
    if isinstance(docs, pa.ChunkedArray):
        docs = docs.combine_chunks()
    if not isinstance(docs, pa.Array) or len(docs) != table.num_rows or not pa.types.is_string(docs.type):
        name = getattr(encoder, "__name__", repr(encoder))
        raise TypeError(f"the block encoder {name!r} must return one string per row ({table.num_rows}), "
                        f"not {type(docs).__name__}")
    refused = _ints(pc.indices_nonzero(pc.is_null(docs))) if docs.null_count else []
    if len(refused) == len(docs):
        return None
    blob, ends = _concatenated(pc.binary_join_element_wise(pc.fill_null(docs, "") if refused else docs, "\n", ""))
    return blob, ends, refused


def _concatenated(rows: Any) -> tuple[bytes, list[int]]:
    """A string array's values one after the other, and where each starts (one more: the end)."""
    buffers = rows.buffers()
    offsets = memoryview(buffers[1]).cast("i")[rows.offset : rows.offset + len(rows) + 1]
    start, end = offsets[0], offsets[-1]
    blob = bytes(memoryview(buffers[2])[start:end]) if end > start else b""
    return blob, _from(offsets, start)


class BlockDocs:
    """The output documents of the block being read (``FastCsvParser.take_json``), made once a block:
    ``passthrough``'s JSON, a handler's block encoder's, or their sizes only (rows kept as CSV)."""

    def __init__(self, reader: BlockReader) -> None:
        self.reader = reader
        self._block: Block | None = None
        self._json: tuple[bytes, list[int], list[int]] | bool | None = False  # False: not made yet
        self._sizes: list[int] | bool | None = False

    def _of(self, block: Block) -> None:
        if block is not self._block:
            self._block, self._json, self._sizes = block, False, False

    def json(self, block: Block, encoder: BlockEncoder | None) -> tuple[bytes, list[int], list[int]] | None:
        """The documents (each followed by a line feed), where each starts, and the rows without one; None: none."""
        self._of(block)
        if self._json is False:
            if encoder is None:
                made = self.reader.json_rows(block)
                self._json = None if made is None else (*made, [])
            else:
                self._json = encode_block(encoder, block.table)
        return self._json  # type: ignore[return-value]

    def sizes(self, block: Block) -> list[int] | None:
        """:meth:`BlockReader.json_ends` of the block."""
        self._of(block)
        if self._sizes is False:
            self._sizes = self.reader.json_ends(block)
        return self._sizes  # type: ignore[return-value]

    @staticmethod
    def good_run(refused: list[int], row: int) -> int:
        """Rows with a document from ``row`` on (to the next refused row; a large number after the last)."""
        at = bisect.bisect_left(refused, row)
        return (1 << 62) if at == len(refused) else refused[at] - row

    def slow_rows(self, block: Block, row: int, most: int) -> int:
        """Rows from ``row`` on that have no document (at least 1, at most ``most``); 1 where not made yet."""
        if block is not self._block or self._json is False:
            return 1
        if self._json is None:
            return max(1, min(most, block.rows - row))
        refused = self._json[2]  # type: ignore[index]
        at = bisect.bisect_left(refused, row)
        run = 0
        while run < most and at + run < len(refused) and refused[at + run] == row + run:
            run += 1
        return max(run, 1)


def _values(column: Any) -> bytes:
    """The bytes of all of a string column's values, one after the other."""
    buffers = column.buffers()
    if len(column) == 0 or buffers[2] is None:
        return b""
    offsets = memoryview(buffers[1]).cast("i")
    return bytes(memoryview(buffers[2])[offsets[column.offset] : offsets[column.offset + len(column)]])


def line_spans(extra: Any) -> list[int]:
    """The lines before each good row of a block (and after the last, one more), from the line breaks inside
    each row's fields (``BlockReader.extra_lines``)."""
    return [0, *_ints(pc.cumulative_sum(pc.add(extra, 1)))]


def _ints(array: Any) -> list[int]:
    """An integer array's values as a list (through its buffer: ``to_pylist`` makes a scalar of each)."""
    array = array.cast(pa.int64())
    return memoryview(array.buffers()[1]).cast("q")[array.offset : array.offset + len(array)].tolist()


def _columns(table: Any) -> list[Any]:
    """The table's columns as arrays (a block is read as one chunk)."""
    return [column.chunk(0) if column.num_chunks == 1 else column.combine_chunks() for column in table.columns]


def _from(offsets: memoryview, base: int) -> list[int]:
    """``offsets`` (a memoryview of int32) less ``base``, as a list (``tolist`` where ``base`` is 0)."""
    return offsets.tolist() if base == 0 else [o - base for o in offsets]


def _first_difference(text: bytes, body: bytes, offsets: memoryview) -> int:
    """The number of leading rows whose canonical bytes equal the block's (binary search on prefixes)."""
    base = offsets[0]
    lo, hi = 0, len(offsets) - 1  # rows [0, lo) are equal; row hi-1 (or one before) differs
    while lo < hi:
        mid = (lo + hi + 1) // 2
        end = offsets[mid] - base
        if end <= len(body) and text[:end] == body[:end]:  # a copy and a memcmp each: 20 steps for 1 MiB
            lo = mid
        else:
            hi = mid - 1
    return lo


DISPLAY_MAX = 200
"""Wider rows get their dicts from ``dict(zip(...))`` (a generated display of more is not worth it)."""


def dict_maker(width: int) -> Callable[..., list[dict[str, str]]]:
    """A function of (columns, *names) making a block's rows into ``{name: value}`` dicts with one dict
    display each (``{k0: v0, k1: v1, ...}``: 2.4x faster than ``dict(zip(names, values))`` for six columns).

    Generated for the width as ``collections.namedtuple`` generates its methods: only the number of
    columns enters the source; the names are arguments (a header's names are distinct, so the display
    makes the dicts ``dict(zip(...))`` makes)."""
    if width > DISPLAY_MAX:
        return lambda columns, *names: [dict(zip(names, values, strict=True)) for values in zip(*columns, strict=True)]
    keys = [f"k{i}" for i in range(width)]
    values = [f"v{i}" for i in range(width)]
    display = ", ".join(f"{k}: {v}" for k, v in zip(keys, values, strict=True))
    source = (
        f"def make(columns, {', '.join(keys)}):\n"
        f"    return [{{{display}}} for {', '.join(values)}, in zip(*columns, strict=True)]\n"
    )
    namespace: dict[str, Any] = {}
    exec(source, namespace)  # generated from the width alone (see above)
    make: Callable[..., list[dict[str, str]]] = namespace["make"]
    return make

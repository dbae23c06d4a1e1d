"""The handler's JSON outputs as rows (objects), for the sinks that store columns (PostgreSQL, Parquet); and
rows kept as the file's own CSV (:class:`CsvRows`)."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator, Sequence
from typing import Any

import orjson

from s3batch.errors import BadFile
from s3batch.formats.csv_scan import with_nulls
from s3batch.jsonvalues import inexact_positions, loads_exact, numbers_as_written

BLOCK_BYTES = 128 * 1024
"""The size of one write of rows' bytes to ``COPY`` (psycopg sends at most 128 KiB at once anyway)."""


def decoded(output: list[bytes]) -> list[Any]:
    """The handler's JSON outputs as values, every number exact (see ``s3batch.jsonvalues``)."""
    loads = orjson.loads
    if not inexact_positions(b"\n".join(output)):
        return [loads(doc) for doc in output]
    values = []
    for doc in output:
        value = loads(doc)
        if inexact_positions(doc) and not numbers_as_written(doc, value):
            value = loads_exact(doc)
        values.append(value)
    return values


def field_names(values: list[Any], where: str, sink: str) -> list[str]:
    """The fields the outputs name, in the order they first appear.

    Raises:
        BadFile: An output is not a JSON object.
    """
    named: dict[str, None] = {}
    last: Any = None
    for value in values:
        if not isinstance(value, dict):
            raise BadFile(
                f"the handler's output for {where} is a JSON {type(value).__name__}, not an object: {sink} maps "
                "each output's fields to columns"
            )
        keys = value.keys()
        if keys != last:  # outputs mostly have the same fields: compared, not merged, each time
            named.update(dict.fromkeys(keys))
            last = keys
    return list(named)


def runs(values: list[Any], columns: list[str], always: Sequence[str] = ()) -> list[tuple[list[str], int, int]]:
    """The outputs ``values`` (JSON objects) as runs of consecutive outputs that name the same fields: each run's
    columns (those of ``columns`` its outputs name, and ``always``, in ``columns``' order), its first output and the
    one after its last. Written with its run's columns, a field an output lacks is left to the table (the column's
    default in a new row; an upsert leaves the row's value), as in a chunk of its own: whatever fields the other
    outputs of its chunk name, which depends on where chunks end."""
    starts: list[int] = []
    names: list[list[str]] = []
    last: Any = None
    for i, value in enumerate(values):
        keys = value.keys()
        if keys != last:  # outputs mostly have the same fields: one run
            starts.append(i)
            names.append([c for c in columns if c in keys or c in always])
            last = keys
    return list(zip(names, starts, [*starts[1:], len(values)] if starts else [], strict=True))


def tuples(values: list[Any], columns: list[str]) -> list[tuple[Any, ...]]:
    """Each output's values in ``columns``' order (None for a field it lacks)."""
    return [tuple(map(v.get, columns)) for v in values]


class CsvRows:
    """The rows of a chunk kept as the file's own CSV bytes (fast blocks, for a table's CSV ``COPY``); ``nulls``: an
    unquoted empty field is NULL, a quoted one ``""`` the empty string (``Reading.empty_null``, as ``COPY`` reads CSV
    itself), else both are the empty string (``FORCE_NOT_NULL``)."""

    def __init__(self, names: list[str], delimiter: str, quote: str, nulls: bool = False) -> None:
        self.names = names
        self.delimiter = delimiter
        self.quote = quote
        self.nulls = nulls
        self.pieces: list[bytes] = []
        """Whole rows, each with its line end (canonical CSV: see ``s3batch.formats.csv_arrow``)."""
        self.lines: list[int] = []
        """The source line of each row."""

    def __len__(self) -> int:
        return len(self.lines)

    def add(self, pieces: list[bytes]) -> None:
        for piece in pieces:
            # Only the object's last row can lack a line end; rows after it would join it. It gets the line
            # end of the rows before it: a COPY refuses a CSV whose line ends differ.
            self.pieces.append(piece if piece.endswith((b"\n", b"\r")) else piece + self.line_end)

    @property
    def line_end(self) -> bytes:
        """The line end of the rows (of the first one; ``\n`` before any)."""
        first = self.pieces[0] if self.pieces else b"\n"
        return b"\r\n" if first.endswith(b"\r\n") else first[-1:]

    def encode(self, values: list[Any]) -> bytes | None:
        """``values`` (outputs of the JSON path, e.g. a chunk's first record, read alone) as more rows of this
        CSV, each string quoted (a quoted field is never NULL, as a string of the JSON path) and, with ``nulls``, each
        None unquoted and empty (NULL): when every one is an object of exactly these columns, all strings (or None);
        else None."""
        if not values:
            return None
        names = set(self.names)
        kinds = (str, type(None)) if self.nulls else (str,)
        if not all(type(v) is dict and v.keys() == names and all(type(x) in kinds for x in v.values()) for v in values):
            return None
        q, qq, d, end = self.quote, self.quote * 2, self.delimiter, self.line_end.decode()

        def field(x: str | None) -> str:
            return "" if x is None else q + x.replace(q, qq) + q

        return "".join(d.join(field(v[n]) for n in self.names) + end for v in values).encode()

    @property
    def data(self) -> bytes:
        return b"".join(self.pieces)

    def values(self) -> list[dict[str, str | None]]:
        """The rows read back as ``{column: value}`` (as the exact parser reads canonical CSV; with ``nulls``, an
        unquoted empty field None)."""
        lines: list[str] = []  # the lines of the row being read (a quoted line break makes more than one)

        def kept() -> Iterator[str]:
            for line in io.StringIO(self.data.decode(), newline=""):
                lines.append(line)
                yield line

        reader = csv.reader(kept(), delimiter=self.delimiter, quotechar=self.quote, strict=True)
        out: list[dict[str, str | None]] = []
        for row in reader:
            if row:
                values = with_nulls(row, "".join(lines), self.delimiter, self.quote, None) if self.nulls else row
                out.append(dict(zip(self.names, values, strict=True)))
            lines.clear()
        return out

    def blocks(self, size: int = BLOCK_BYTES) -> Iterator[bytes]:
        """The rows' bytes in pieces of about ``size`` bytes (whole rows; one piece at most over ``size``):
        for ``COPY``, fewer and bigger writes than a row each, without one copy of the whole chunk."""
        run: list[bytes] = []
        held = 0
        for piece in self.pieces:
            run.append(piece)
            held += len(piece)
            if held >= size:
                yield b"".join(run) if len(run) > 1 else run[0]
                run, held = [], 0
        if run:
            yield b"".join(run)


def csv_head(values: list[Any], csv: CsvRows | None) -> bytes | None:
    """A chunk's JSON rows as more rows of its CSV rows (``CsvRows.encode``), so that one ``COPY`` takes all
    of the chunk; None without CSV rows (or when they cannot be)."""
    return csv.encode(values) if csv is not None and len(csv) else None

"""The handler's JSON outputs as rows (objects), for the sinks that store columns (PostgreSQL, Parquet); and
rows kept as the file's own CSV (:class:`CsvRows`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson

from s3batch.errors import BadFile
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


class CsvRows:
    """The rows of a chunk kept as the file's own CSV bytes (fast blocks, for a table's CSV ``COPY``)."""

    def __init__(self, names: list[str], delimiter: str, quote: str) -> None:
        self.names = names
        self.delimiter = delimiter
        self.quote = quote
        self.pieces: list[bytes] = []
        """Whole rows, each with its line end (canonical CSV: see ``s3batch.formats.csv_arrow``)."""
        self.lines: list[int] = []
        """The source line of each row."""

    def __len__(self) -> int:
        return len(self.lines)

    def add(self, pieces: list[bytes]) -> None:
        for piece in pieces:
            # Only the object's last row can lack a line end; rows after it would join it.
            self.pieces.append(piece if piece.endswith((b"\n", b"\r")) else piece + b"\n")

    @property
    def data(self) -> bytes:
        return b"".join(self.pieces)

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

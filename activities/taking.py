"""Taking a sub-batch of records for the chunk loop (``FileJob``): one by one, or, for the built-in
``passthrough`` on the fast CSV path, whole runs of rows already encoded.

Both take exactly the same records (``want`` of them, or fewer once the source offset reaches
``until``): where a chunk ends depends only on the records and the byte budget, so a chunk has the
same bounds, checkpoint and part bytes whichever way it was read.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from s3batch.formats.common import Record
from s3batch.formats.fastcsv import FastCsvParser
from s3batch.formats.parsers import Parser
from s3batch.sinks.rows import CsvRows

if TYPE_CHECKING:
    from s3batch.activities.handling import HandlerRun

    from s3batch.rejects import DelimiterProbe

Chunk = tuple[list[bytes], list[tuple[int, bytes]], list[int]]
"""A chunk being built: its outputs, its rejects as ``(line, JSON line)`` and the source line of each output."""


def take(records: Iterator[Record], parser: Parser, want: int, until: int) -> list[Record]:
    """Up to ``want`` records (at least one, if any is left), fewer once the parser's offset reaches ``until``.

    From the fast CSV path, the rows of a fast block are taken at once (:meth:`FastCsvParser.take_records`:
    the same records)."""
    if isinstance(parser, FastCsvParser):
        return parser.take_records(want, until)
    batch: list[Record] = []
    for record in records:
        batch.append(record)
        if len(batch) >= want or parser.offset >= until:
            break
    return batch


def take_packed(
    books: HandlerRun,
    probe: DelimiterProbe,
    source: tuple[Iterator[Record], FastCsvParser],
    lookahead: list[Record],
    chunk: Chunk,
    want: int,
    until: int,
    rows: CsvRows | None = None,
) -> tuple[int, int, int]:
    """One sub-batch of the passthrough handler, as :func:`take` takes it after ``lookahead``, with the rows
    of fast blocks encoded at once (:meth:`FastCsvParser.take_json`), or kept as CSV in ``rows``, and the
    others handled one by one.

    Returns the records taken, the output bytes they add (as ``HandlerRun.handle`` counts them, whatever
    form they are kept in) and the outputs not in ``chunk``'s list as one element each (``len(outputs)``
    + that = outputs)."""
    records, parser = source
    output = chunk[0]
    size = joined = 0
    taken = len(lookahead)
    pending = list(lookahead)  # records read one by one, handled before the next packed run (file order)

    def handle(batch: list[Record]) -> int:
        probe.see(parser.header, (r.value for r in batch))
        return books.handle(batch, *chunk)

    remaining = want
    while remaining > 0:
        lines = None if rows is None else rows.lines
        n, pieces, reached, n_size = parser.take_json(remaining, until, lines, books.encoder)
        if n:
            if pending:
                size += handle(pending)
                pending = []
            if rows is None:
                output.extend(pieces)
                joined += n - len(pieces)
            else:
                rows.add(pieces)
                joined += n
            books.passed_through(n)
            size += n_size
            taken += n
            remaining -= n
            if reached:
                break
            continue
        # Records the packed path does not take (not in a fast block, left to the handler), as take reads them.
        slow = take(records, parser, parser.slow_rows(remaining), until)
        if not slow:
            break
        pending += slow
        taken += len(slow)
        remaining -= len(slow)
        if parser.offset >= until:
            break
    if pending:
        size += handle(pending)
    return taken, size, joined

"""The files of a job report as ``s3batch report`` shows them: a table when every key fits in the terminal
beside the counts, else one block per file with its key whole on a line of its own (a table would fold keys
mid-word). Each file with rejects says where its rejects files are (``rejects_prefix``: list it)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.cells import cell_len
from rich.table import Table
from rich.text import Text

from s3batch import layout
from s3batch.cli.output import cell, out, safe_line
from s3batch.logs import printable
from s3batch.report import JobReport, ReportFile

STATUS_STYLE = {"succeeded": "green", "failed": "red", "cancelled": "yellow", "not_started": "dim"}
_COUNTS = ("records", "written", "rejected", "attempts")
ERROR_MIN_WIDTH = 24
"""The error column gets at least this many columns (its words wrap within it), or the files go in blocks."""


def rejects_uri(report: JobReport, f: ReportFile) -> str | None:
    """``s3://`` prefix of the rejects files of a file with rejects (None without): the report's
    ``rejects_prefix``, or for a report written before that field, the same prefix from its output layout."""
    if not f.rejected:
        return None
    if f.rejects_prefix:
        return f.rejects_prefix
    return layout.rejects_uri(report.output, f.key) if report.output else None


def _counts(f: ReportFile) -> list[str]:
    return [f"{f.records:,}", f"{f.records_written:,}", f"{f.rejected:,}", f"{f.attempts:,}"]


def fits(files: Sequence[ReportFile], width: int) -> bool:
    """Whether the table of ``files`` shows every key whole in ``width`` columns."""
    if not files:
        return True
    widths = [max(cell_len(printable(f.key)) for f in files), max(len(f.status) for f in files)]
    widths += [max(len(name), *(len(c[i]) for c in map(_counts, files))) for i, name in enumerate(_COUNTS)]
    errors = any(f.error for f in files)
    columns = len(widths) + (1 if errors else 0)
    # box=None, padding (0, 1): one space each side of every column.
    return sum(widths) + 2 * columns + (ERROR_MIN_WIDTH if errors else 0) <= width


def print_files(report: JobReport) -> None:
    """The report's files: a table, or in a narrow terminal (or for long keys) a block per file."""
    files = report.files
    if fits(files, out.width):
        _print_table(files)
        for f in files:
            where = rejects_uri(report, f)
            if where:
                out.print(safe_line(("  rejects  ", "bold"), f"{where}  ({f.rejected:,} rejected)"))
        return
    for f in files:
        out.print(cell(f.key, "bold"))
        records, written, rejected, attempts = _counts(f)
        out.print(
            safe_line(
                "  ", (f.status, STATUS_STYLE.get(f.status, "white")),
                f"  {records} records, {written} written, {rejected} rejected, {attempts} attempt(s)",
            )
        )  # fmt: skip
        if f.error:
            out.print(safe_line(f"  error    {f.error}"))
        where = rejects_uri(report, f)
        if where:
            out.print(safe_line(f"  rejects  {where}"))


def _print_table(files: Sequence[ReportFile]) -> None:
    table = Table(box=None, padding=(0, 1))
    table.add_column("file", no_wrap=True)
    table.add_column("status", no_wrap=True)
    for column in _COUNTS:
        table.add_column(column, justify="right", no_wrap=True)
    errors = any(f.error for f in files)
    if errors:
        table.add_column("error", min_width=ERROR_MIN_WIDTH)  # words wrap within the column
    for f in files:
        row: list[Text | str] = [cell(f.key), cell(f.status, STATUS_STYLE.get(f.status, "white")), *_counts(f)]
        table.add_row(*row, *([cell(f.error or "")] if errors else []))
    out.print(table)

"""Column names of a CSV file: the checks on a header row, and the names of a file without one."""

from __future__ import annotations


def check_column_names(row: list[str], line: int) -> None:
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


def generated_names(width: int) -> list[str]:
    """The column names of a file read with ``header: none``: ``col_1`` .. ``col_{width}``."""
    return [f"col_{n}" for n in range(1, width + 1)]

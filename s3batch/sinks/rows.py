"""The handler's JSON outputs as rows (objects), for the sinks that store columns (PostgreSQL, Parquet)."""

from __future__ import annotations

from typing import Any

import orjson

from s3batch.errors import BadFile
from s3batch.jsonvalues import inexact_positions, loads_exact, numbers_as_written


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

"""Handlers used by the fault and hostile-input tests.

Loaded into worker subprocesses with ``S3BATCH_HANDLER_MODULES=tests.slow_handlers,tests.fault_handlers``
and registered in-process by importing this module.

- ``counting_slow``: like ``slow_passthrough``, and appends ``<pid> <records>`` to the file named by
  ``S3BATCH_TEST_COUNT_FILE`` for every call, so a test can count the records processed more than
  once (work redone after a fault) across worker processes.
- ``poison_some``: a per-record handler that raises on records carrying ``POISON``: they must become
  rejects carrying the error, the file still succeeds.
- ``explode_on_marker``: a chunk handler that raises on any chunk with a record carrying ``BOOM``:
  such a file fails on every attempt.
- ``strict_schema``: a chunk handler that validates every row with pydantic and lets the
  ``ValidationError`` escape (a common way of writing an all-or-nothing handler).
- ``explode_until_fixed``: like ``explode_on_marker`` until a test "deploys the fix" by setting
  ``BOOM_FIXED`` (in-process workers only); then a passthrough.
- ``gate_then_fail``: like ``slow_passthrough``; chunk 3 of a file whose key holds ``-gated`` waits at a gate
  of files under ``S3BATCH_TEST_GATE_DIR`` and then fails once (a fault a retry passes), at the moment the
  process that holds the gate chooses: across processes (the history recorder's ``hand_over_failed_attempt``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict

from s3batch.formats.common import Record
from s3batch.handlers import HandlerResult, chunk_context, chunk_handler, record_handler

_DELAY = float(os.environ.get("S3BATCH_TEST_HANDLER_DELAY", "0.05"))


def _count(records: Sequence[Record]) -> None:
    path = os.environ.get("S3BATCH_TEST_COUNT_FILE")
    if path:
        # One small O_APPEND write per call: safe across processes.
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{os.getpid()} {len(records)}\n".encode())
        finally:
            os.close(fd)


@chunk_handler("counting_slow")
def counting_slow(records: Sequence[Record]) -> HandlerResult:
    _count(records)
    time.sleep(_DELAY)
    return HandlerResult([r.value for r in records], [])


@record_handler("poison_some")
def poison_some(value: dict) -> dict:
    if "POISON" in str(value):
        raise ValueError(f"poison record {value.get('id')}")
    return value


@chunk_handler("explode_on_marker")
def explode_on_marker(records: Sequence[Record]) -> HandlerResult:
    if any("BOOM" in str(r.value) for r in records):
        raise RuntimeError("this handler cannot process BOOM records")
    return HandlerResult([r.value for r in records], [])


BOOM_FIXED = False
"""Set by a test to make ``explode_until_fixed`` pass ``BOOM`` records through (the fixed handler)."""


@chunk_handler("explode_until_fixed")
def explode_until_fixed(records: Sequence[Record]) -> HandlerResult:
    if not BOOM_FIXED and any("BOOM" in str(r.value) for r in records):
        raise RuntimeError("this handler cannot process BOOM records yet")
    return HandlerResult([r.value for r in records], [])


class _Row(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: int
    secret: int


@chunk_handler("strict_schema")
def strict_schema(records: Sequence[Record]) -> HandlerResult:
    return HandlerResult([_Row.model_validate(r.value).model_dump() for r in records], [])


GATE_CHUNK = 3
"""The chunk of a ``-gated`` file at which ``gate_then_fail`` waits."""


@chunk_handler("gate_then_fail")
def gate_then_fail(records: Sequence[Record]) -> HandlerResult:
    """Passthrough, ``S3BATCH_TEST_HANDLER_DELAY`` a chunk. Chunk ``GATE_CHUNK`` of a file whose key holds
    ``-gated``, with ``S3BATCH_TEST_GATE_DIR`` set: the first time, writes ``<bucket>.reached`` there, waits (up
    to 120 s) for ``<bucket>.open``, writes ``<bucket>.failed`` and raises (retryable); later, passes."""
    context = chunk_context()
    gates = os.environ.get("S3BATCH_TEST_GATE_DIR")
    if gates and "-gated" in context.key and context.chunk == GATE_CHUNK:
        base = os.path.join(gates, context.bucket)
        if not os.path.exists(base + ".failed"):
            open(base + ".reached", "w").close()
            deadline = time.monotonic() + 120
            while not os.path.exists(base + ".open") and time.monotonic() < deadline:
                time.sleep(0.02)
            open(base + ".failed", "w").close()
            raise RuntimeError("a transient fault at the gate (the test's)")
    time.sleep(_DELAY)
    return HandlerResult([r.value for r in records], [])


def handled_records(path: str | os.PathLike[str]) -> int:
    """Records handed to ``counting_slow`` (all processes) according to the count file."""
    try:
        with open(path) as f:
            return sum(int(line.split()[1]) for line in f if line.strip())
    except FileNotFoundError:
        return 0

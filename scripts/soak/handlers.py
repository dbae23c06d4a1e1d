"""What the soak's workers load (``S3BATCH_HANDLER_MODULES=scripts.soak.handlers``).

- ``soak_count``: a passthrough that appends one line per chunk it handles to the file
  ``S3BATCH_SOAK_COUNT_FILE`` names (``job  key  etag  split  chunk  records``, tab-separated; one small
  ``O_APPEND`` write, whole across processes), so the soak counts the records handled again after faults;
- ``soak_slow``: the same, 0.2 s a chunk (jobs that run long enough to be paused, cancelled and broken).
- ``S3BATCH_SOAK_BREAK=empty-part``: a deliberately broken build, for the test of the checker only
  (``tests/test_soak_checker.py``): the part of chunk 1 of every file written to JSONL parts is committed with
  its checkpoint but without its records, as a build that checkpointed a chunk before writing its output would
  leave it after a crash. Nothing in s3batch notices (the part exists, of this version and options); the
  soak's checker must.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

from s3batch.checkpoint import Checkpoint
from s3batch.file_output import FileOutput
from s3batch.formats.common import Record
from s3batch.handlers import HandlerResult, chunk_context, chunk_handler

COUNT_FILE_ENV = "S3BATCH_SOAK_COUNT_FILE"
BREAK_ENV = "S3BATCH_SOAK_BREAK"
BREAK_MODES = ("empty-part",)
SLOW_SECONDS = 0.2


@chunk_handler("soak_count")
def soak_count(records: Sequence[Record]) -> HandlerResult:
    return _counted(records)


@chunk_handler("soak_slow")
def soak_slow(records: Sequence[Record]) -> HandlerResult:
    time.sleep(SLOW_SECONDS)
    return _counted(records)


def _counted(records: Sequence[Record]) -> HandlerResult:
    path = os.environ.get(COUNT_FILE_ENV)
    if path:
        c = chunk_context()
        line = f"{c.job_id}\t{c.key}\t{c.etag}\t{c.split}\t{c.chunk}\t{len(records)}\n"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
    return HandlerResult([r.value for r in records], [], dropped=0, lines=[r.line for r in records])


def _break(mode: str) -> None:
    if mode not in BREAK_MODES:
        raise ValueError(f"{BREAK_ENV}={mode!r}: not one of {', '.join(BREAK_MODES)}")
    commit = FileOutput.commit

    def empty_chunk_one(
        self: FileOutput, cp: Checkpoint, new: Checkpoint, output: list[bytes], rejects: Any, lines: Any = ()
    ) -> Checkpoint:
        if cp.chunk == 1 and type(self) is FileOutput:
            output = []
        return commit(self, cp, new, output, rejects, lines)

    FileOutput.commit = empty_chunk_one  # type: ignore[method-assign]


if os.environ.get(BREAK_ENV):
    _break(os.environ[BREAK_ENV])

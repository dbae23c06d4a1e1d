"""The handler of the Worker Versioning tests, loaded into worker subprocesses with
``S3BATCH_HANDLER_MODULES=tests.version_handlers``.

``version_count``: a passthrough chunk handler taking ``S3BATCH_TEST_HANDLER_DELAY`` (50 ms) per chunk
that appends ``<build ID> <job> <file> <records> <time>`` to the file ``S3BATCH_TEST_COUNT_FILE`` names
for every chunk, the job being the ``job`` column of the chunk's first record and the file the part of
its ``id`` before the dash: which version processed which file's records, when, and whether any record
was processed twice.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

from s3batch.formats.common import Record
from s3batch.handlers import HandlerResult, chunk_handler

_DELAY = float(os.environ.get("S3BATCH_TEST_HANDLER_DELAY", "0.05"))


@chunk_handler("version_count")
def version_count(records: Sequence[Record]) -> HandlerResult:
    path = os.environ["S3BATCH_TEST_COUNT_FILE"]
    build = os.environ.get("S3BATCH_BUILD_ID", "unversioned")
    first = records[0].value if records else {"job": "-", "id": "-"}
    time.sleep(_DELAY)
    # One small O_APPEND write per chunk: safe across processes.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{build} {first['job']} {first['id'].split('-')[0]} {len(records)} {time.time():.3f}\n".encode())
    finally:
        os.close(fd)
    return HandlerResult([r.value for r in records], [])

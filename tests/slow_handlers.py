"""Handlers used by the crash tests: slow enough that a worker can be killed mid-file.

Loaded into worker subprocesses with ``S3BATCH_HANDLER_MODULES=tests.slow_handlers``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

from s3batch.formats.common import Record
from s3batch.handlers import HandlerResult, chunk_handler

_DELAY = float(os.environ.get("S3BATCH_TEST_HANDLER_DELAY", "0.05"))


@chunk_handler("slow_passthrough")
def slow_passthrough(records: Sequence[Record]) -> HandlerResult:
    time.sleep(_DELAY)
    return HandlerResult([r.value for r in records], [])

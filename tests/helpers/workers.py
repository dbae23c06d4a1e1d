"""Worker subprocesses for the tests (``worker_process``), and the reliability rows the fault tests
record (``record_reliability``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from s3batch.dev.workers import WorkerProcess

ROOT = Path(__file__).resolve().parents[2]

TEST_HANDLERS = "tests.slow_handlers"
"""Handler modules a test worker loads unless told otherwise (``slow_passthrough`` and friends)."""


def worker_process(task_queue: str, log_dir: Path, name: str, **env: str) -> WorkerProcess:
    """This checkout's worker in a subprocess on ``task_queue``, with the stack's environment, the
    test handlers (``S3BATCH_HANDLER_MODULES``, unless ``env`` names others) and ``env``; not yet
    ready (call ``wait_ready``)."""
    return WorkerProcess(task_queue, log_dir, name, cwd=ROOT, env={"S3BATCH_HANDLER_MODULES": TEST_HANDLERS, **env})


RELIABILITY_FILE_ENV = "S3BATCH_RELIABILITY_FILE"
"""When set, the fault tests append one JSON row per observed fault to this file
(``scripts/reliability_report.py`` sets it and turns the rows into docs/explanation/reliability.md)."""


def record_reliability(row: dict[str, object]) -> None:
    path = os.environ.get(RELIABILITY_FILE_ENV)
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")

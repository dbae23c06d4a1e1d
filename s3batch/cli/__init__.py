"""``s3batch``: start an S3 batch job and follow it from the command line.

    s3batch start --bucket incoming --prefix customers/ --output-bucket processed --wait
    s3batch status s3batch-incoming-1a2b3c4d [--json]
    s3batch pause ID / s3batch resume ID     # pause lets running files finish
    s3batch set-concurrency ID 16
    s3batch cancel ID                        # in-flight files stop at a chunk boundary
    s3batch watch ID [--interval 1] [--once]  # live view: a bar per file in flight, speed, ETA
    s3batch report ID [--json]
    s3batch redrive ID [--id NEW_ID] [--wait] # a new job over the files that failed in ID
    s3batch redrive --rejected ID [--wait]   # ... over the records ID rejected, once their cause is fixed
    s3batch list [--running] [--source BUCKET/PREFIX] [--json]
    s3batch worker [--deployment-name D] [--build-id B]   # run a worker (a version of a Worker Deployment)
    s3batch deploy status | promote BUILD_ID [--ramp PCT] | rollback   # which version takes new jobs

``pause``, ``resume`` and ``set-concurrency`` are workflow updates, so
``temporal workflow update execute --name pause --workflow-id ID`` does the same (``set_concurrency``
takes ``--input N``).

The job flags are the fields of :class:`~s3batch.models.S3BatchInput` (``chunk_records`` is
``--chunk-records``), validated locally before anything is started. The Temporal connection comes
from Temporal's own environment (``TEMPORAL_ADDRESS``, ``TEMPORAL_NAMESPACE``, profiles; see
:mod:`s3batch.config`), the task queue from ``S3BATCH_TASK_QUEUE`` unless ``--task-queue`` is given.

Exit codes tell a script the job's state (:mod:`s3batch.cli.output`; the table in docs/reference/errors.md):
0 succeeded (for ``status`` and ``watch --once``: or running); 1 the job failed (or timed out); 2 invalid
usage or input, nothing done; 3 the command does not apply to the job in its state (an ID already used: IDs are never
reused; a control of a finished job; nothing to redrive); 4 the job was cancelled; 5 terminated; 6 not
found (no such job, not an s3batch job, no report yet); 7 Temporal or S3 unreachable; 8 another error;
130 interrupted.

The commands are thin: what they do to a job is :mod:`s3batch.client` (usable from Python), what
they print is here. :mod:`s3batch.cli.parser` is the command line itself (commands, flags, help: it
imports nothing heavy, so ``--help`` answers at once); :mod:`s3batch.cli.start` runs ``start`` and
``redrive``; :mod:`s3batch.cli.jobs` ``status``, ``report`` and ``list``; :mod:`s3batch.cli.control`
``pause``, ``resume``, ``set-concurrency`` and ``cancel``; :mod:`s3batch.cli.watch` the live view;
:mod:`s3batch.cli.render` the tables and the progress bar; :mod:`s3batch.cli.output` the consoles, errors
and exit codes. A command's module is imported only when the command runs.
"""

from __future__ import annotations

import importlib
import os
import sys

from s3batch.cli.parser import build_parser

__all__ = ["build_parser", "main", "run"]


def run(argv: list[str] | None = None) -> int:
    """Run the command line ``argv`` and return its exit code (for callers in Python)."""
    args = build_parser().parse_args(argv)
    # Imported once the command line is parsed: --help and usage errors never load what commands need.
    import asyncio

    from s3batch.cli.output import err_out, failure

    module, _, name = args.run.partition(":")
    func = getattr(importlib.import_module(f"s3batch.cli.{module}"), name)
    if getattr(args, "in_process", False):
        return int(func(args))  # s3batch worker: runs its own event loop and signal handlers
    try:
        return int(asyncio.run(func(args)))
    except KeyboardInterrupt:
        err_out.print("interrupted: the job itself keeps running (see `s3batch status ID`)")
        return 130
    except Exception as err:
        code = failure(err)
        if code is None:
            raise
        return code


def main() -> None:
    """Console-script entry point."""
    code = run()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: the Temporal client's native threads can outlive the event loop and
    # abort a finishing interpreter (temporalio/sdk-python#300), turning a success into SIGABRT.
    os._exit(code)

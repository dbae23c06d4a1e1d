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

Exit codes: 0 done; 1 the job failed, or Temporal could not be reached; 2 invalid input;
3 the command does not apply to the job in its state: the ID belongs to a job that already finished
(IDs are never reused; controls need a running job) or that is running with another input, or
``redrive`` was given a job that is still running or has no failed or cancelled files (with ``--rejected``:
no rejected record).

The commands are thin: what they do to a job is :mod:`s3batch.client` (usable from Python), what
they print is here. :mod:`s3batch.cli.jobs` has ``start``, ``status``, ``report``, ``redrive`` and
``list``; :mod:`s3batch.cli.control` ``pause``, ``resume``, ``set-concurrency`` and ``cancel``;
:mod:`s3batch.cli.watch` the live view; :mod:`s3batch.cli.render` the tables and the progress bar;
:mod:`s3batch.cli.output` the consoles, errors and exit codes. Each command module adds its own
subcommands and flags (``add_*``); :func:`build_parser` puts them in the order of ``--help``.
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import os
import re
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from botocore.exceptions import BotoCoreError
from temporalio.service import RPCError

from s3batch.cli import control, deploy, jobs, schedule, watch
from s3batch.cli.output import EXIT_FAILED, CliError, environment_error, err_out, exit_code, safe_line
from s3batch.client import ClientError
from s3batch.errors import S3BatchError


class Parser(argparse.ArgumentParser):
    """argparse, with the closest flag suggested for a flag it does not know (``--ouput-prefix``)."""

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:  # type: ignore[override]
        # (typeshed overloads parse_args on the namespace's type; this one takes and returns any)
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            self.error(self._unknown(extras, self._command_parser(parsed)))
        return parsed

    def _command_parser(self, parsed: argparse.Namespace) -> argparse.ArgumentParser:
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                return action.choices.get(str(getattr(parsed, action.dest, "")), self)
        return self

    def error(self, message: str) -> NoReturn:
        choice = re.match(r"argument \S+: invalid choice: '(.*)' \(choose from (.*)\)$", message)
        if choice:
            close = difflib.get_close_matches(choice[1], re.findall(r"'([^']*)'", choice[2]), n=1, cutoff=0.6)
            if close:
                message += f": did you mean {close[0]!r}?"
        super().error(message)

    @staticmethod
    def _unknown(extras: list[str], parser: argparse.ArgumentParser) -> str:
        known = [option for action in parser._actions for option in action.option_strings]
        lines = []
        for extra in [e for e in extras if e.startswith("-")] or extras:  # not the value after a flag
            flag = extra.split("=", 1)[0]
            close = difflib.get_close_matches(flag, known, n=1, cutoff=0.6) if flag.startswith("-") else []
            hint = f": did you mean {close[0]}?" if close else ""
            lines.append(f"unrecognized argument {extra!r}{hint}")
        return "; ".join(lines) + f" (see `{parser.prog} --help`)"


def build_parser() -> argparse.ArgumentParser:
    """The ``s3batch`` command line: each module adds its commands (the order of ``--help``)."""
    parser = Parser(
        prog="s3batch",
        description="Start and follow s3batch jobs (durable processing of files in S3 on Temporal).",
        epilog="Temporal connection: TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE, TEMPORAL_API_KEY or a "
        "temporal.toml profile, as for the temporal CLI.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    jobs.add_start(commands)
    jobs.add_status(commands)
    control.add_commands(commands)
    watch.add_watch(commands)
    jobs.add_report(commands)
    jobs.add_redrive(commands)
    jobs.add_list(commands)
    schedule.add_schedule(commands)
    schedule.add_backfill(commands)
    deploy.add_worker(commands)
    deploy.add_deploy(commands)
    return parser


def run(argv: list[str] | None = None) -> int:
    """Run the command line ``argv`` and return its exit code (for callers in Python)."""
    args = build_parser().parse_args(argv)
    if getattr(args, "in_process", False):
        return int(args.func(args))  # s3batch worker: runs its own event loop and signal handlers
    try:
        return asyncio.run(args.func(args))
    except CliError as err:
        err_out.print(safe_line(("error:", "bold red"), f" {err}"))
        return err.code
    except (ClientError, S3BatchError, BotoCoreError) as err:  # S3BatchError: e.g. S3 refused to read the report
        err_out.print(safe_line(("error:", "bold red"), f" {environment_error(err) or err}"))
        return exit_code(err) if not isinstance(err, BotoCoreError) else EXIT_FAILED
    except RPCError as err:  # the server went away, or refused a call
        status = err.status.name if err.status else "no status"
        err_out.print(safe_line(("error:", "bold red"), f" Temporal could not answer: {err.message} ({status})"))
        return EXIT_FAILED
    except KeyboardInterrupt:
        err_out.print("interrupted: the job itself keeps running (see `s3batch status ID`)")
        return 130


def main() -> None:
    """Console-script entry point."""
    code = run()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: the Temporal client's native threads can outlive the event loop and
    # abort a finishing interpreter (temporalio/sdk-python#300), turning a success into SIGABRT.
    os._exit(code)

"""What every command prints through: the consoles, markup-safe text, JSON, errors and exit codes."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from botocore.exceptions import (
    BotoCoreError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    PartialCredentialsError,
)
from rich.console import Console
from rich.text import Text

from s3batch.client import ClientError, ConnectFailed, InvalidRequest, JobNotFound, ReportNotFound, WrongJobState
from s3batch.client.deployments import DeploymentNotFound
from s3batch.errors import S3BatchError
from s3batch.logs import printable

EXIT_OK = 0
"""The job succeeded (``status`` and ``watch --once``: or is running); any other command: done."""
EXIT_FAILED = 1
"""The job failed (or timed out)."""
EXIT_BAD_INPUT = 2
"""Invalid usage or input (argparse's own code too): nothing was done."""
EXIT_WRONG_STATE = 3
"""The command does not apply to the job in its state (a control of a finished job, an ID already used,
nothing to redrive)."""
EXIT_CANCELLED = 4
"""The job was cancelled."""
EXIT_TERMINATED = 5
"""The job was terminated (by ``temporal workflow terminate``: no report was written)."""
EXIT_NOT_FOUND = 6
"""No job (schedule, deployment) with this ID, a workflow that is not an s3batch job, or no report yet."""
EXIT_UNREACHABLE = 7
"""Temporal or S3 could not be reached."""
EXIT_ERROR = 8
"""Any other error (S3 refused a request, no credentials, an object that is not a report...)."""

JOB_EXIT = {
    "running": EXIT_OK,
    "succeeded": EXIT_OK,
    "failed": EXIT_FAILED,
    "timed_out": EXIT_FAILED,
    "cancelled": EXIT_CANCELLED,
    "terminated": EXIT_TERMINATED,
}
"""The exit code of a job in each state (``JobView.status``, a report's ``status``)."""


def job_exit(status: str) -> int:
    """The exit code telling a script the job's state (:data:`JOB_EXIT`)."""
    return JOB_EXIT.get(status, EXIT_ERROR)


# No emoji codes: ":name:" in an object key must print as typed.
out = Console(soft_wrap=True, highlight=False, emoji=False)
err_out = Console(stderr=True, soft_wrap=True, highlight=False, emoji=False)


class CliError(Exception):
    """An error to print (without a traceback) and exit with ``code``. Its message may have several lines
    (:func:`print_error`)."""

    def __init__(self, message: str, code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.code = code


LOCAL_STACK_ENV = 'eval "$(.venv/bin/s3batch-stack env)"'
"""What points a shell at the local stack (``make demo`` / ``make stack-up``)."""

_NO_CREDENTIALS = (NoCredentialsError, PartialCredentialsError)
_UNREACHABLE = (EndpointConnectionError, ConnectTimeoutError)


def _cause(err: BaseException, kinds: tuple[type[BaseException], ...]) -> BaseException | None:
    """``err``, or the error it was raised from (or while handling), that is one of ``kinds``."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, kinds):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def environment_error(err: BaseException) -> str | None:
    """One line saying what is missing and how to fix it, when ``err`` (or the error it was raised
    from) is missing S3 credentials or an unreachable S3 endpoint; else None."""
    missing = _cause(err, _NO_CREDENTIALS)
    if missing is not None:
        return (
            f"no S3 credentials ({type(missing).__name__}). For the local stack run `{LOCAL_STACK_ENV}` first; "
            "elsewhere set AWS_PROFILE or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (or use an IAM role)"
        )
    unreachable = _cause(err, _UNREACHABLE)
    if unreachable is not None:
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or "AWS S3"
        return (
            f"cannot reach S3 at {endpoint} ({type(unreachable).__name__}). For the local stack: `make stack-up`, "
            f"then `{LOCAL_STACK_ENV}`; elsewhere check AWS_ENDPOINT_URL_S3 and the network"
        )
    return None


def print_error(message: str) -> None:
    """``error:`` and the first line of ``message`` on stderr, each further line below it; every line
    escaped (:func:`safe_line`)."""
    first, *more = message.split("\n")
    err_out.print(safe_line(("error:", "bold red"), f" {first}"))
    for line in more:
        err_out.print(safe_line(line))


def failure(err: Exception) -> int | None:
    """Print ``err``, an error a command may meet (a :class:`CliError`, an s3batch or client error, S3's,
    Temporal's), without a traceback, and return its exit code; None for any other error (a bug: its
    traceback shows)."""
    from temporalio.service import RPCError, RPCStatusCode

    if isinstance(err, CliError):
        print_error(str(err))
        return err.code
    if isinstance(err, ClientError | S3BatchError | BotoCoreError):  # e.g. S3 refused to read the report
        err_out.print(safe_line(("error:", "bold red"), f" {environment_error(err) or err}"))
        return exit_code(err)
    if isinstance(err, RPCError):  # the server went away, or refused a call
        status = err.status.name if err.status else "no status"
        err_out.print(safe_line(("error:", "bold red"), f" Temporal could not answer: {err.message} ({status})"))
        gone = err.status in (RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED)
        return EXIT_UNREACHABLE if gone else EXIT_ERROR
    return None


def exit_code(err: ClientError | S3BatchError | BotoCoreError) -> int:
    """The exit code of an error: invalid request 2, wrong job state 3, no such job, deployment or report 6,
    Temporal or S3 unreachable 7, else 8."""
    if isinstance(err, InvalidRequest):
        return EXIT_BAD_INPUT
    if isinstance(err, WrongJobState):
        return EXIT_WRONG_STATE
    if isinstance(err, JobNotFound | ReportNotFound | DeploymentNotFound):
        return EXIT_NOT_FOUND
    if isinstance(err, ConnectFailed) or _cause(err, _UNREACHABLE):
        return EXIT_UNREACHABLE
    return EXIT_ERROR


def safe_line(*parts: object) -> Text:
    """One line of output that rich never reads as markup: ``[/bold]`` or ``[link=...]`` in a key is
    shown as typed, never applied, and cannot crash the command. Each part is a value (shown through
    :func:`printable`) or a ``(value, style)`` pair."""
    return Text.assemble(
        *((printable(part[0]), part[1]) if isinstance(part, tuple) else printable(part) for part in parts)
    )


def cell(value: object, style: str = "") -> Text:
    """A table cell showing ``value`` as typed (table cells given as ``str`` are read as markup)."""
    return Text(printable(value), style=style)


def print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2) + "\n")
    sys.stdout.flush()

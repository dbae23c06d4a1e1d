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

from s3batch.client import ClientError, InvalidRequest, WrongJobState
from s3batch.errors import S3BatchError
from s3batch.logs import printable

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_ID_USED = 3

# No emoji codes: ":name:" in an object key must print as typed.
out = Console(soft_wrap=True, highlight=False, emoji=False)
err_out = Console(stderr=True, soft_wrap=True, highlight=False, emoji=False)


class CliError(Exception):
    """An error to print (without a traceback) and exit with ``code``."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


LOCAL_STACK_ENV = 'eval "$(.venv/bin/s3batch-stack env)"'
"""What points a shell at the local stack (``make demo`` / ``make stack-up``)."""

_NO_CREDENTIALS = (NoCredentialsError, PartialCredentialsError)
_UNREACHABLE = (EndpointConnectionError, ConnectTimeoutError)


def environment_error(err: BaseException) -> str | None:
    """One line saying what is missing and how to fix it, when ``err`` (or the error it was raised
    from) is missing S3 credentials or an unreachable S3 endpoint; else None."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, _NO_CREDENTIALS):
            return (
                f"no S3 credentials ({type(seen).__name__}). For the local stack run `{LOCAL_STACK_ENV}` first; "
                "elsewhere set AWS_PROFILE or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (or use an IAM role)"
            )
        if isinstance(seen, _UNREACHABLE):
            endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or "AWS S3"
            return (
                f"cannot reach S3 at {endpoint} ({type(seen).__name__}). For the local stack: `make stack-up`, then "
                f"`{LOCAL_STACK_ENV}`; elsewhere check AWS_ENDPOINT_URL_S3 and the network"
            )
        seen = seen.__cause__ or seen.__context__
    return None


def failure(err: Exception) -> int | None:
    """Print ``err``, an error a command may meet (an s3batch or client error, S3's, Temporal's), as one line
    without a traceback, and return its exit code; None for any other error (a bug: its traceback shows)."""
    from temporalio.service import RPCError

    if isinstance(err, (ClientError, S3BatchError, BotoCoreError)):  # S3BatchError: e.g. S3 refused to read the report
        err_out.print(safe_line(("error:", "bold red"), f" {environment_error(err) or err}"))
        return exit_code(err) if not isinstance(err, BotoCoreError) else EXIT_FAILED
    if isinstance(err, RPCError):  # the server went away, or refused a call
        status = err.status.name if err.status else "no status"
        err_out.print(safe_line(("error:", "bold red"), f" Temporal could not answer: {err.message} ({status})"))
        return EXIT_FAILED
    return None


def exit_code(err: ClientError | S3BatchError) -> int:
    """The exit code of an error: 2 for an invalid request, 3 for a job in the wrong state, else 1."""
    if isinstance(err, InvalidRequest):
        return EXIT_BAD_INPUT
    if isinstance(err, WrongJobState):
        return EXIT_ID_USED
    return EXIT_FAILED


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

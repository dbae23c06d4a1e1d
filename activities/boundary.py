"""The activity boundary: where s3batch errors become Temporal ``ApplicationError`` s, once.

Library code raises :class:`s3batch.errors.S3BatchError` subclasses; every activity is wrapped by
:func:`boundary`, which re-raises them as ``ApplicationError`` s of the same type name, message,
retryability and retry hints.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from s3batch.errors import S3BatchError, UnexpectedError

P = ParamSpec("P")
R = TypeVar("R")


def to_application_error(err: S3BatchError, *details: Any) -> ApplicationError:
    """``err`` as the ``ApplicationError`` Temporal records (``details`` are attached to it)."""
    return ApplicationError(
        err.message,
        *details,
        type=err.type,
        non_retryable=not err.retryable,
        next_retry_delay=err.retry_delay,
        category=ApplicationErrorCategory.BENIGN if err.benign else ApplicationErrorCategory.UNSPECIFIED,
    )


def unexpected(err: BaseException, where: str) -> UnexpectedError:
    """An error s3batch did not expect (a bug, or a handler's object misbehaving), retryable. Only its
    type is reported: its text may quote record contents, and it would reach workflow history, the
    report and the worker's log."""
    name = type(err).__name__
    activity.logger.warning("unexpected %s processing %s (its message is not shown: it may quote records)", name, where)
    return UnexpectedError(
        f"unexpected error processing {where}: {name} (its message is withheld: it may quote record contents); "
        "the attempt is retried. Reproduce it locally on this file to see it.",
        name,
    )


def boundary(*, attempt_details: bool = False) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Wrap an activity so the s3batch errors it raises leave it as ``ApplicationError`` s.

    Args:
        attempt_details: Attach ``{"attempt": n}`` as the error's details (the job report then says
            how many attempts a failed file had).
    """

    def wrap(fn: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(fn)
        def run(*args: P.args, **kwargs: P.kwargs) -> R:
            try:
                return fn(*args, **kwargs)
            except S3BatchError as err:
                # The file's counts too (TooManyRejects): the report shows how far a failed file got.
                details = ({"attempt": activity.info().attempt, **err.file_counts()},) if attempt_details else ()
                raise to_application_error(err, *details) from None

        return run

    return wrap

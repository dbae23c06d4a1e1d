"""The activity boundary: where s3batch errors become Temporal ``ApplicationError`` s, once.

Library code raises :class:`s3batch.errors.S3BatchError` subclasses; every activity is wrapped by
:func:`boundary`, which re-raises them as ``ApplicationError`` s of the same type name, message,
retryability and retry hints.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import threading
from collections.abc import Callable, Iterator
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


@contextlib.contextmanager
def keep_alive() -> Iterator[None]:
    """While the block runs, heartbeat from a thread of its own (a quarter of the heartbeat timeout apart), when
    the activity was given a heartbeat timeout: a short activity (a check, a listing page, a report, the ledger)
    says nothing of its progress, but its worker's death is then noticed after that timeout, not after its
    start-to-close timeout (minutes during which its job waits)."""
    timeout = activity.info().heartbeat_timeout
    if not timeout:
        yield
        return
    context = contextvars.copy_context()  # the activity's: heartbeat() finds it there
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(max(timeout.total_seconds() / 4, 0.2)):
            try:
                context.run(activity.heartbeat)
            except Exception:  # noqa: BLE001 - the activity is ending: nothing more to say
                return

    thread = threading.Thread(target=beat, name="s3batch-keep-alive", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def boundary(*, attempt_details: bool = False, keepalive: bool = False) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Wrap an activity so the s3batch errors it raises leave it as ``ApplicationError`` s.

    Args:
        attempt_details: Attach ``{"attempt": n}`` as the error's details (the job report then says
            how many attempts a failed file had).
        keepalive: Heartbeat while it runs (:func:`keep_alive`): an activity that never heartbeats itself.
    """

    def wrap(fn: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(fn)
        def run(*args: P.args, **kwargs: P.kwargs) -> R:
            try:
                with keep_alive() if keepalive else contextlib.nullcontext():
                    return fn(*args, **kwargs)
            except S3BatchError as err:
                # The file's counts too (TooManyRejects): the report shows how far a failed file got.
                details = ({"attempt": activity.info().attempt, **err.file_counts()},) if attempt_details else ()
                raise to_application_error(err, *details) from None

        return run

    return wrap

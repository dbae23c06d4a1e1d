"""The errors of s3batch, in one hierarchy, and the one way to describe a failure to a user.

Library code raises these; it never builds Temporal ``ApplicationError`` s. The activities turn them
into ``ApplicationError`` s once, at their boundary (``s3batch.activities.boundary``), with the same
``type`` string, so a workflow, a retry policy or a user matches on the names below. Each class says
whether retrying can help (``retryable``); :data:`NON_RETRYABLE_TYPES`, given to every activity's
retry policy, is derived from that.

Pure Python (no boto3, no I/O): the workflow sandbox imports this module.
"""

from __future__ import annotations

import datetime
from typing import Any, ClassVar

from temporalio.exceptions import ActivityError, ApplicationError


class S3BatchError(Exception):
    """Base of every error s3batch raises on purpose. ``message`` says what was wrong, where
    (bucket/key/line) and what to do; it never quotes record contents."""

    type_name: ClassVar[str] = "S3BatchError"
    """The ``ApplicationError`` type users and retry policies match on."""

    retryable: ClassVar[bool] = False
    """Whether another attempt can succeed (throttling, a restart); False: it fails for good."""

    benign: ClassVar[bool] = False
    """An expected hand-over, not a failure (logged and counted as benign by Temporal)."""

    retry_delay: ClassVar[datetime.timedelta | None] = None
    """How soon to retry, overriding the retry policy's backoff (None: the policy's)."""

    crosses_activities: ClassVar[bool] = True
    """Raised inside activities (and so named in their retry policy). False for the errors of the
    client API (:mod:`s3batch.client.errors`), which never leave the caller's process."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    @property
    def type(self) -> str:
        """The error's type name (``type_name``, or the one given to the instance)."""
        return self.type_name

    def file_counts(self) -> dict[str, Any]:
        """Counts of the file that failed (``FileResult`` fields: records, rejected...), reported with
        the failure; empty when the error does not know them."""
        return {}


# Non-retryable first, in the order of the retry policy's list (kept as it was written by hand).


class SourceChanged(S3BatchError):
    """The source object was overwritten since it was listed (its ETag no longer matches)."""

    type_name = "SourceChanged"


class NotFound(S3BatchError):
    """An object or bucket does not exist."""

    type_name = "NotFound"


class AccessDenied(S3BatchError):
    """S3 denied the worker's credentials."""

    type_name = "AccessDenied"


class UnknownHandler(S3BatchError):
    """No handler of that name is registered on the worker."""

    type_name = "UnknownHandler"


class InvalidInput(S3BatchError):
    """The job input cannot work (limits, allow-lists, a report that is not one)."""

    type_name = "InvalidInput"


class SinkInvalid(InvalidInput):
    """The job's sink cannot work on this worker: a connection it lacks, a missing table or columns."""


SPLIT_BOUNDARY = "split_boundary"
"""Key of a failure's details that says a split of a big file could not be cut there (``SplitBoundary``):
the workflow processes that file whole."""


class BadFile(S3BatchError):
    """The file cannot be read as its format (corrupt gzip, an unreadable header, a non-JSON output)."""

    type_name = "BadFile"


class UnknownFormatError(BadFile, ValueError):
    """The format is ``auto`` and the key's extension names no supported format (or the format name
    is unknown)."""


class S3Refused(S3BatchError):
    """The S3 server refused a request as malformed: sending it again cannot succeed."""

    type_name = "S3Refused"


class OutputKeyTooLong(S3BatchError):
    """An output key of the file would be over S3's limit of 1,024 bytes."""

    type_name = "OutputKeyTooLong"


class AccountingError(S3BatchError):
    """The books do not add up (a file or record lost or repeated): a bug to report, never retried."""

    type_name = "AccountingError"


class TooManyRejects(S3BatchError):
    """A file (``max_rejected_records``, ``max_rejected_ratio``) or the job (``max_rejected_total``)
    rejected more records than the job allows. The committed output is kept."""

    type_name = "TooManyRejects"

    def __init__(self, message: str, counts: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.counts = counts or {}

    def file_counts(self) -> dict[str, Any]:
        return dict(self.counts)


# Retryable.


class S3Error(S3BatchError):
    """A transient S3 failure (throttling, 5xx, a reset connection)."""

    type_name = "S3Error"
    retryable = True


class HandlerError(S3BatchError):
    """The job's handler raised; the whole chunk is retried."""

    type_name = "HandlerError"
    retryable = True


class SinkError(S3BatchError):
    """The sink's database failed a chunk's transaction (unreachable, restarted, or another attempt of
    the file committed that chunk first): nothing of the chunk is committed, and the next attempt
    resumes from the checkpoint in the database."""

    type_name = "SinkError"
    retryable = True


class SilentAttempt(S3BatchError):
    """An attempt was silent longer than its heartbeat timeout (its process frozen or starved), so the server may
    have timed it out, given its file to another attempt, or ended its job meanwhile: it stops before its next
    commit instead of writing after the fact. Nothing to do: when the server still runs it, a retry resumes from
    the last committed checkpoint."""

    type_name = "SilentAttempt"
    retryable = True
    retry_delay = datetime.timedelta(milliseconds=100)


class WorkerShutdown(S3BatchError):
    """The worker is shutting down: the file continues on another worker from its checkpoint."""

    type_name = "WorkerShutdown"
    retryable = True
    benign = True
    retry_delay = datetime.timedelta(milliseconds=100)


class UnexpectedError(S3BatchError):
    """An error s3batch did not expect (a bug, or a handler's object misbehaving), retryable. Its type
    is the name of the original exception's class; its text is withheld (it may quote records)."""

    retryable = True

    def __init__(self, message: str, type_name: str) -> None:
        super().__init__(message)
        self._type = type_name

    @property
    def type(self) -> str:
        return self._type


def _in_order(cls: type[S3BatchError]) -> list[type[S3BatchError]]:
    found = []
    for sub in cls.__subclasses__():
        found.append(sub)
        found.extend(_in_order(sub))
    return found


NON_RETRYABLE_TYPES: list[str] = list(
    dict.fromkeys(c.type_name for c in _in_order(S3BatchError) if c.crosses_activities and not c.retryable)
)
"""The error types no activity retries (for ``RetryPolicy(non_retryable_error_types=...)``)."""

SOURCE_CHANGED = SourceChanged.type_name
NOT_FOUND = NotFound.type_name
ACCESS_DENIED = AccessDenied.type_name
UNKNOWN_HANDLER = UnknownHandler.type_name
INVALID_INPUT = InvalidInput.type_name
BAD_FILE = BadFile.type_name
S3_REFUSED = S3Refused.type_name
OUTPUT_KEY_TOO_LONG = OutputKeyTooLong.type_name
ACCOUNTING_ERROR = AccountingError.type_name
TOO_MANY_REJECTS = TooManyRejects.type_name
S3_ERROR = S3Error.type_name
HANDLER_ERROR = HandlerError.type_name
WORKER_SHUTDOWN = WorkerShutdown.type_name


def describe_failure(err: BaseException) -> str:
    """The user-facing reason of a failure: ``"<type>: <message>"`` of the error an activity (or the
    workflow) raised, found under the wrappers Temporal adds (a workflow failure, activity errors).

    Args:
        err: A ``WorkflowFailureError``, an ``ActivityError`` or anything else with a ``cause``.
    """
    cause = getattr(err, "cause", None)
    while isinstance(cause, ActivityError) and cause.cause is not None:
        cause = cause.cause  # the activity's own error says what went wrong
    if isinstance(cause, ApplicationError):
        return f"{cause.type or 'Error'}: {cause.message}"
    return f"{type(cause).__name__}: {cause}" if cause else str(err)

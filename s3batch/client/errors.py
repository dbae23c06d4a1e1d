"""What the client functions raise: each message says what was wrong and what to do.

The command line maps these to its exit codes (:mod:`s3batch.cli.output`): an :class:`InvalidRequest` is 2,
a :class:`WrongJobState` 3, a :class:`JobNotFound` or :class:`ReportNotFound` 6, a :class:`ConnectFailed` 7,
any other :class:`ClientError` 8.
"""

from __future__ import annotations

from s3batch.errors import S3BatchError


class ClientError(S3BatchError):
    """A client call that could not be done (no such job, Temporal unreachable, no report yet).

    Part of the one hierarchy of :mod:`s3batch.errors`, but never raised inside an activity, so
    never named in a retry policy."""

    type_name = "ClientError"
    crosses_activities = False


class JobNotFound(ClientError):
    """No job has this workflow ID in the namespace."""


class NotAJob(JobNotFound):
    """The workflow with this ID is not an s3batch job: a workflow of another type."""

    def __init__(self, message: str, workflow_id: str, workflow_type: str) -> None:
        super().__init__(message)
        self.workflow_id = workflow_id
        self.workflow_type = workflow_type


class ConnectFailed(ClientError):
    """Temporal could not be reached."""


class ReportNotFound(ClientError):
    """The job has no report (yet): it is written when the job ends."""


class InvalidRequest(ClientError):
    """The request itself is invalid: unusable settings, or a control the job refused."""


class ControlRejected(InvalidRequest):
    """The running job refused a control update (e.g. a concurrency out of range)."""


class WrongJobState(ClientError):
    """The call does not apply to the job in its state (finished, still running, nothing failed)."""


class JobNotRunning(WrongJobState):
    """A control needs a running job, and this one finished."""


class JobIdUsed(WrongJobState):
    """A job with this ID already ran and finished: an ID is never reused, so nothing was started."""

    def __init__(self, message: str, workflow_id: str, run_id: str | None = None) -> None:
        super().__init__(message)
        self.workflow_id = workflow_id
        self.run_id = run_id


class JobIdRunning(WrongJobState):
    """A job with this ID is running with another input: nothing was started (the running job goes on)."""

    def __init__(self, message: str, workflow_id: str) -> None:
        super().__init__(message)
        self.workflow_id = workflow_id


class NothingToRedrive(WrongJobState):
    """The job is still running, or its report lists no file to process again."""

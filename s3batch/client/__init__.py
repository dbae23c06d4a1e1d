"""The s3batch client API: start jobs and follow them from Python, as the ``s3batch`` command does.

    from s3batch import S3BatchInput, client

    temporal = await client.connect()            # or your own Client with plugins=[S3BatchPlugin()]
    started = await client.start(temporal, S3BatchInput(bucket="incoming", output_bucket="processed"))
    view = await client.describe(temporal, started.workflow_id)   # progress, files in flight
    await client.pause(temporal, started.workflow_id)
    result, error = await client.outcome(temporal, started.workflow_id)
    report = await client.report(temporal, started.workflow_id)

Every function takes a Temporal :class:`~temporalio.client.Client` whose data converter is the
plugin's (``plugins=[S3BatchPlugin()]``), and raises the errors of :mod:`s3batch.client.errors`.
"""

from __future__ import annotations

from s3batch.client.control import cancel, pause, resume, set_concurrency
from s3batch.client.errors import (
    ClientError,
    ConnectFailed,
    ControlRejected,
    InvalidRequest,
    JobIdRunning,
    JobIdUsed,
    JobNotFound,
    JobNotRunning,
    NotAJob,
    NothingToRedrive,
    ReportNotFound,
    WrongJobState,
)
from s3batch.client.inflight import FILE_ACTIVITIES, ObjectsCache, in_flight_files
from s3batch.client.jobs import (
    connect,
    default_workflow_id,
    describe,
    describe_run,
    environment_keys,
    jobs_query,
    list_jobs,
    outcome,
    progress,
    start,
    status_word,
    ui_url,
    waiting_for_worker,
    workers_polling,
)
from s3batch.client.redrive import prepare_redrive
from s3batch.client.redrive_rejected import prepare_rejected_redrive
from s3batch.client.reports import ended_report, find_report, job_input, report
from s3batch.client.views import (
    InFlightFile,
    JobSummary,
    JobView,
    Outcome,
    RedrivePlan,
    StartedJob,
    StoredReport,
)

__all__ = [
    "FILE_ACTIVITIES",
    "ClientError",
    "ConnectFailed",
    "ControlRejected",
    "InFlightFile",
    "InvalidRequest",
    "JobIdRunning",
    "JobIdUsed",
    "JobNotFound",
    "JobNotRunning",
    "JobSummary",
    "JobView",
    "NotAJob",
    "NothingToRedrive",
    "ObjectsCache",
    "Outcome",
    "RedrivePlan",
    "ReportNotFound",
    "StartedJob",
    "StoredReport",
    "WrongJobState",
    "cancel",
    "connect",
    "default_workflow_id",
    "describe",
    "describe_run",
    "ended_report",
    "environment_keys",
    "find_report",
    "in_flight_files",
    "job_input",
    "jobs_query",
    "list_jobs",
    "outcome",
    "pause",
    "prepare_redrive",
    "prepare_rejected_redrive",
    "progress",
    "report",
    "resume",
    "set_concurrency",
    "start",
    "status_word",
    "ui_url",
    "waiting_for_worker",
    "workers_polling",
]

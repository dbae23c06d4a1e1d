"""Start jobs, find them, and read their state: progress, in-flight files, outcome."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import (
    Client,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowQueryFailedError,
)
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from s3batch import WORKFLOW_TYPE
from s3batch import search_attributes as sa
from s3batch.client.errors import ConnectFailed, InvalidRequest, JobIdRunning, JobIdUsed, JobNotFound, NotAJob
from s3batch.client.inflight import ObjectsCache, in_flight_files
from s3batch.client.views import TASK_WAIT_SECONDS, JobSummary, JobView, Outcome, StartedJob
from s3batch.codec import KeyringError
from s3batch.config import Settings, connect_config, ui_base
from s3batch.config import connect as connect_temporal
from s3batch.converter import settings_converter
from s3batch.errors import describe_failure
from s3batch.messages import Progress, S3BatchResult
from s3batch.models import S3BatchInput

QUERY_TIMEOUT = timedelta(seconds=5)
POLLER_SEEN_WITHIN = timedelta(seconds=90)
"""A worker long-polls its task queue for up to about 70 s per poll: one not seen for longer is gone
(the server keeps listing a stopped worker as a poller for minutes)."""

STATUS_WORDS = {
    WorkflowExecutionStatus.COMPLETED: "succeeded",
    WorkflowExecutionStatus.CANCELED: "cancelled",
    WorkflowExecutionStatus.CONTINUED_AS_NEW: "running",
}
"""The job's status in s3batch's words (those of the report and the search attributes) where
Temporal's differ: ``succeeded`` for completed, ``cancelled`` for canceled."""


def status_word(status: WorkflowExecutionStatus | None) -> str:
    """``running``, ``succeeded``, ``failed``, ``cancelled``, ``terminated`` or ``timed_out``."""
    if status is None:
        return "unknown"
    return STATUS_WORDS.get(status) or status.name.lower()


# ------------------------------------------------------------------------------ connecting


def environment_keys() -> list[bytes]:
    """The encryption keyring of the environment (first = current), ``[]`` without encryption.

    Raises:
        InvalidRequest: The encryption settings are not usable.
    """
    try:
        return Settings().keyring()
    except KeyringError as err:
        raise InvalidRequest(f"the encryption settings are not usable: {err}") from None


async def connect() -> Client:
    """A Temporal client with s3batch's data converter (:mod:`s3batch.converter`, the one
    :class:`~s3batch.plugin.S3BatchPlugin` installs; encrypted with the ``S3BATCH_ENCRYPTION_*`` keyring), from the
    environment (Temporal's own variables and profiles, as for the ``temporal`` CLI; see :mod:`s3batch.config`).

    Raises:
        InvalidRequest: The encryption settings are not usable.
        ConnectFailed: Temporal could not be reached.
    """
    try:
        converter = settings_converter(Settings())
    except KeyringError as err:
        raise InvalidRequest(f"the encryption settings are not usable: {err}") from None
    try:
        return await connect_temporal([], data_converter=converter)
    except (RuntimeError, RPCError, OSError) as err:
        target = connect_config()["target_host"]
        raise ConnectFailed(
            f"cannot connect to Temporal at {target} ({connect_reason(err)}): is its server running, and is this "
            'its address? For the local stack: `make stack-up`, then `eval "$(.venv/bin/s3batch-stack env)"`; '
            "elsewhere set TEMPORAL_ADDRESS (or a temporal.toml profile)"
        ) from None


_TRANSPORT_REASONS = (
    ("connection refused", "connection refused"),
    ("dns error", "the host name does not resolve"),
    ("timed out", "timed out"),
    ("deadline", "timed out"),
    ("certificate", "TLS certificate refused"),
    ("tls", "TLS handshake failed"),
    ("connection reset", "connection reset"),
)


def connect_reason(err: BaseException) -> str:
    """A few words on why a connection to Temporal failed, from the SDK's transport error (a dump of nested
    Rust errors, several lines long): ``connection refused``, ``the host name does not resolve``..."""
    text = str(err).lower()
    for found, reason in _TRANSPORT_REASONS:
        if found in text:
            return reason
    return f"{type(err).__name__}: {str(err).splitlines()[0][:80]}" if str(err) else type(err).__name__


def ui_url(client: Client, workflow_id: str) -> str:
    """The job's page in the Temporal Web UI."""
    return f"{ui_base(Settings())}/namespaces/{client.namespace}/workflows/{workflow_id}"


# ------------------------------------------------------------------------------ starting


def default_workflow_id(job: S3BatchInput, *, encrypted: bool) -> str:
    """``s3batch-<bucket>-<random>``; with encryption ``s3batch-<random>``: workflow IDs are stored
    in plain text, and the bucket name is what encryption hides."""
    if encrypted:
        return f"s3batch-{uuid.uuid4().hex[:16]}"
    return f"s3batch-{job.bucket}-{uuid.uuid4().hex[:8]}"


def _was_started(handle: WorkflowHandle[Any, Any]) -> bool:
    """False when the start found the ID already running (``USE_EXISTING`` returned that run)."""
    # The SDK keeps the start response on the handle but exposes no public flag for it.
    response = getattr(handle, "_start_workflow_response", None)
    return bool(getattr(response, "started", True))


async def _start_workflow(
    client: Client, job: S3BatchInput, workflow_id: str, task_queue: str, keys: Sequence[bytes], *, indexed: bool
) -> WorkflowHandle[Any, S3BatchResult]:
    return await client.start_workflow(
        WORKFLOW_TYPE,
        job,
        id=workflow_id,
        task_queue=task_queue,
        result_type=S3BatchResult,
        # A running job with this ID is followed, not started again; a finished one is not rerun.
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
        search_attributes=sa.at_start(job.bucket, job.prefix, keys) if indexed else None,
        # Shown as the job's summary in the Web UI (a payload: encrypted with a key).
        static_summary=f"s3://{job.bucket}/{job.prefix} -> s3://{job.output_bucket}/{job.output_prefix}",
    )


async def start(
    client: Client,
    job: S3BatchInput,
    workflow_id: str | None = None,
    task_queue: str | None = None,
    *,
    keys: Sequence[bytes] | None = None,
) -> StartedJob:
    """Start ``job``, or find it already running under ``workflow_id`` (then nothing is started and
    the running job keeps its own input).

    Args:
        workflow_id: Default: :func:`default_workflow_id`.
        task_queue: Default: ``S3BATCH_TASK_QUEUE`` or ``s3-batch``.
        keys: The encryption keyring (default: the environment's): with a key, the job is indexed
            by an HMAC of its source, never its name (see :mod:`s3batch.search_attributes`).

    Raises:
        JobIdUsed: A job with this ID already ran and finished (an ID is never reused).
        JobIdRunning: A job with this ID is running with another input.
    """
    keys = environment_keys() if keys is None else list(keys)
    workflow_id = workflow_id or default_workflow_id(job, encrypted=bool(keys))
    queue = task_queue or Settings().task_queue
    try:
        try:
            handle = await _start_workflow(client, job, workflow_id, queue, keys, indexed=True)
        except RPCError as err:
            # The namespace lacks the s3batch search attributes: the job runs unindexed.
            if err.status != RPCStatusCode.INVALID_ARGUMENT or sa.SOURCE.name not in err.message:
                raise
            handle = await _start_workflow(client, job, workflow_id, queue, keys, indexed=False)
    except WorkflowAlreadyStartedError as err:
        raise JobIdUsed(
            f"job {workflow_id!r} already ran (run {err.run_id}) and is finished; an ID is never reused, so "
            "nothing was started",
            workflow_id,
            err.run_id,
        ) from None
    already_running = not _was_started(handle)
    if already_running:
        await _check_same_input(client, workflow_id, job)
    return StartedJob(
        workflow_id=workflow_id,
        run_id=handle.result_run_id,
        namespace=client.namespace,
        already_running=already_running,
        ui_url=ui_url(client, workflow_id),
    )


async def _check_same_input(client: Client, workflow_id: str, job: S3BatchInput) -> None:
    """A start that found ``workflow_id`` running follows it only when it runs this very job.

    Raises:
        JobIdRunning: The running job has another input (named by the fields that differ).
    """
    from s3batch.client.reports import job_input  # reports imports this module

    running = (await job_input(client, workflow_id)).model_dump(mode="json")
    wanted = job.model_dump(mode="json")
    differ = sorted(name for name in {*running, *wanted} if running.get(name) != wanted.get(name))
    if differ:
        raise JobIdRunning(
            f"job {workflow_id!r} is running with another input (it differs in {', '.join(differ)}); nothing was "
            "started. Pass another ID to start this job, or the same input to follow the running one",
            workflow_id,
        )


# ------------------------------------------------------------------------------ reading a job


async def describe_run(
    client: Client, workflow_id: str
) -> tuple[WorkflowHandle[Any, S3BatchResult], WorkflowExecutionDescription]:
    """A handle on the latest run of a job that exists, and that run's description.

    Raises:
        JobNotFound: No job has this ID.
        NotAJob: The workflow with this ID is not an s3batch job.
    """
    handle = client.get_workflow_handle(workflow_id, result_type=S3BatchResult)
    try:
        desc = await handle.describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise JobNotFound(f"no job with ID {workflow_id!r} in namespace {client.namespace!r}") from None
        raise
    if desc.workflow_type != WORKFLOW_TYPE:
        raise NotAJob(
            f"workflow {workflow_id!r} is not an s3batch job: it is a {desc.workflow_type!r} workflow (s3batch "
            f"jobs are {WORKFLOW_TYPE!r}); `temporal workflow describe --workflow-id {workflow_id}` shows it",
            workflow_id,
            desc.workflow_type,
        )
    return handle, desc


async def workers_polling(client: Client, task_queue: str) -> int:
    """How many workers poll ``task_queue`` now (for workflow or activity tasks, seen within
    :data:`POLLER_SEEN_WITHIN`): 0 means a job there waits, and nothing tells it so but this."""
    now = datetime.now(UTC)
    seen: set[str] = set()
    for kind in (TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW, TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY):
        request = DescribeTaskQueueRequest(
            namespace=client.namespace, task_queue=TaskQueue(name=task_queue), task_queue_type=kind
        )
        response = await client.workflow_service.describe_task_queue(request)
        for poller in response.pollers:
            if now - poller.last_access_time.ToDatetime(UTC) <= POLLER_SEEN_WITHIN:
                seen.add(poller.identity)
    return len(seen)


def task_wait(desc: WorkflowExecutionDescription) -> float:
    """Seconds the job's pending workflow task has waited for a worker to pick it up (0: none waits)."""
    task = desc.raw_description.pending_workflow_task
    if not task.HasField("scheduled_time") or task.HasField("started_time"):
        return 0.0
    return max((datetime.now(UTC) - task.scheduled_time.ToDatetime(UTC)).total_seconds(), 0.0)


async def waiting_for_worker(client: Client, workflow_id: str) -> str | None:
    """The task queue of a running job that no worker serves (none polls it, or its workflow task has
    waited :data:`TASK_WAIT_SECONDS` for one), else None."""
    _, desc = await describe_run(client, workflow_id)
    if desc.status != WorkflowExecutionStatus.RUNNING:
        return None
    if task_wait(desc) >= TASK_WAIT_SECONDS or not await workers_polling(client, desc.task_queue):
        return desc.task_queue
    return None


async def progress(client: Client, workflow_id: str) -> Progress | None:
    """The job's ``progress`` query, or None when it cannot answer now (no worker yet)."""
    handle = client.get_workflow_handle(workflow_id)
    try:
        return await handle.query("progress", result_type=Progress, rpc_timeout=QUERY_TIMEOUT)
    except (WorkflowQueryFailedError, RPCError):
        return None


async def outcome(client: Client, workflow_id: str) -> Outcome:
    """Wait for the job's end, following its latest run (whatever continue-as-new does)."""
    handle = client.get_workflow_handle(workflow_id, result_type=S3BatchResult)
    try:
        return Outcome(await handle.result(), None)
    except WorkflowFailureError as err:
        return Outcome(None, describe_failure(err))


async def describe(client: Client, workflow_id: str, objects_cache: ObjectsCache | None = None) -> JobView:
    """Describe a job: progress and in-flight checkpoints while it runs, its outcome once done.

    Args:
        objects_cache: See :func:`in_flight_files` (for a caller that polls).

    Raises:
        JobNotFound: No job has this ID.
    """
    _, desc = await describe_run(client, workflow_id)
    status = status_word(desc.status)
    view = JobView(workflow_id=workflow_id, run_id=desc.run_id, status=status, ui_url=ui_url(client, workflow_id))
    if desc.status == WorkflowExecutionStatus.RUNNING:
        view.task_queue = desc.task_queue
        view.workers = await workers_polling(client, desc.task_queue)
        view.task_wait = task_wait(desc)
        # With no worker the query could only wait for its timeout (5 s of every `s3batch status`) to get None.
        view.progress = await progress(client, workflow_id) if view.workers else None
        view.in_flight = await in_flight_files(client, workflow_id, desc.run_id, desc.raw_description, objects_cache)
    else:
        view.result, view.error = await outcome(client, workflow_id)
    return view


# ------------------------------------------------------------------------------ listing jobs


def jobs_query(
    *, running: bool = False, bucket: str | None = None, prefix: str = "", keys: Sequence[bytes] = ()
) -> str:
    """The visibility query of s3batch jobs: all of them, the running ones, or those of one source
    (``bucket``/``prefix`` exactly; with encryption matched by its HMAC under each of ``keys``)."""
    query = f'WorkflowType="{WORKFLOW_TYPE}"'
    if running:
        query += ' AND ExecutionStatus="Running"'
    if bucket is not None:
        query += f" AND {sa.source_query(bucket, prefix, keys)}"
    return query


async def list_jobs(client: Client, query: str | None = None, *, limit: int = 50) -> list[JobSummary]:
    """Jobs matching a visibility ``query`` (default: every s3batch job; see :func:`jobs_query`),
    newest first, at most ``limit``."""
    jobs = []
    async for wf in client.list_workflows(query or jobs_query(), limit=limit):
        attrs = wf.typed_search_attributes
        jobs.append(
            JobSummary(
                workflow_id=wf.id,
                run_id=wf.run_id,
                status=status_word(wf.status),
                start_time=wf.start_time,
                close_time=wf.close_time,
                task_queue=wf.task_queue,
                source=attrs.get(sa.SOURCE),
                search_status=attrs.get(sa.STATUS),
                files_done=attrs.get(sa.FILES_DONE),
                files_failed=attrs.get(sa.FILES_FAILED),
            )
        )
    return jobs

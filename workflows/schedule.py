"""How the workflow runs its activities: the short activities (:func:`short_activity`) and the options of the
file activities, the input of a file activity and the start of one, which pending files go together into one
activity (a group of small files), and when a run is full. Nothing else here awaits: but for
:func:`short_activity` and :func:`start_file_activity`, these are pure functions."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.workflow import ActivityCancellationType

with workflow.unsafe.imports_passed_through():
    from s3batch.activities.s3_activities import S3Activities
    from s3batch.workflows.patches import (
        LARGEST_FIRST,
        LOCAL_SHORT_ACTIVITIES,
        SHORT_ACTIVITIES_HEARTBEAT,
        UPGRADE_ON_NEW_VERSION,
    )

    from s3batch.errors import NON_RETRYABLE_TYPES
    from s3batch.messages import (
        JobCheck,
        JobState,
        ListObjectsInput,
        ObjectRef,
        ProcessFileInput,
        ProcessGroupInput,
        SplitRange,
    )
    from s3batch.models import S3BatchInput

SHORT_TIMEOUT = timedelta(minutes=5)
"""Start-to-close timeout of the short activities (check, listing page, report segment, report)."""
SHORT_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=12,  # about 5 minutes: rides out an S3 outage, never loops forever
    non_retryable_error_types=NON_RETRYABLE_TYPES,
)
"""Retries of the short activities."""

LOCAL_STEPS: tuple[Callable[..., Any], ...] = (S3Activities.check_job, S3Activities.list_objects)
"""The short steps run as local activities: the check (its one write, the output's probe, is the same for every
attempt of a job) and a page of a prefix, a manifest or a redrive's report (they only read)."""

ArgT = TypeVar("ArgT")
ResultT = TypeVar("ResultT")


async def short_activity(spec: S3BatchInput, method: Callable[[Any, ArgT], ResultT], arg: ArgT) -> ResultT:
    """Run a short activity (the check, a listing page, a report segment, the report, the ledger) of ``spec``'s job.

    With the patch :data:`LOCAL_SHORT_ACTIVITIES`, the steps of :data:`LOCAL_STEPS` are local activities: the
    worker running the workflow task runs them and the task goes on, no round trip through the server (a
    one-file job took five workflow tasks, each 20-30 ms of dispatch and persistence). Only steps that write
    nothing a later step relies on: a workflow task can be stale (its worker frozen past the task's timeout, the
    run ended elsewhere meanwhile), and a stale task's local activities all run when it wakes, where an
    activity is only a command the server refuses (``tests/test_stale_workflow_task.py``). The report, its
    segments, the ledger and an incremental listing page (what it took is what the ledger advances over) stay
    activities. Jobs whose history has no marker here run every step as an activity, as before.
    """
    if method in LOCAL_STEPS and workflow.patched(LOCAL_SHORT_ACTIVITIES):
        return await workflow.execute_local_activity_method(
            method, arg, start_to_close_timeout=SHORT_TIMEOUT, retry_policy=SHORT_RETRY
        )
    return await workflow.execute_activity_method(method, arg, **short_options(spec))


def short_options(spec: S3BatchInput) -> dict[str, Any]:
    """Timeouts and retries of a short activity: with the patch :data:`SHORT_ACTIVITIES_HEARTBEAT`, the job's
    heartbeat timeout too (the activity heartbeats while it runs), so a short activity whose worker died is
    retried after that, not after :data:`SHORT_TIMEOUT`."""
    options: dict[str, Any] = {"start_to_close_timeout": SHORT_TIMEOUT, "retry_policy": SHORT_RETRY}
    if workflow.patched(SHORT_ACTIVITIES_HEARTBEAT):
        options["heartbeat_timeout"] = timedelta(seconds=spec.heartbeat_timeout_seconds)
    return options
HAND_OVER_GRACE = timedelta(seconds=1)
"""Once a run has started its ``files_per_run`` files, how long its files in flight may go on before
those still running are stopped at a chunk boundary and handed to the next run (whose files then
fill the slots the run's last small files leave)."""


def file_activity_options(spec: S3BatchInput) -> dict[str, Any]:
    """Timeouts, cancellation and retries of a file (or group) activity."""
    return {
        "start_to_close_timeout": timedelta(hours=24),
        "heartbeat_timeout": timedelta(seconds=spec.heartbeat_timeout_seconds),
        # On job cancellation, wait until the file has stopped at its chunk boundary, so the
        # report is written after every checkpoint.
        "cancellation_type": ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
        "retry_policy": RetryPolicy(
            initial_interval=timedelta(seconds=1),
            backoff_coefficient=2.0,
            maximum_interval=timedelta(seconds=60),
            maximum_attempts=spec.max_attempts,
            non_retryable_error_types=NON_RETRYABLE_TYPES,
        ),
    }


def start_file_activity(spec: S3BatchInput, group: list[ObjectRef]) -> workflow.ActivityHandle[Any]:
    """Start the activity of one file, or of a group of small files (the one command issued here)."""
    options = file_activity_options(spec)
    if len(group) == 1:
        return workflow.start_activity_method(
            S3Activities.process_file, file_input(spec, group[0]), summary=group[0].key, **options
        )
    return workflow.start_activity_method(
        S3Activities.process_group,
        ProcessGroupInput(file=file_input(spec, group[0]), more=group[1:]),
        summary=f"{group[0].key} and {len(group) - 1} more small files",
        **options,
    )


def start_split_activity(spec: S3BatchInput, obj: ObjectRef, split: SplitRange) -> workflow.ActivityHandle[Any]:
    """Start the activity of one byte-range split of a big file (``s3batch.workflows.splits``)."""
    req = file_input(spec, obj).model_copy(update={"split": split})
    summary = f"{obj.key} (split {split.index + 1} of {split.count})"
    options = file_activity_options(spec)
    return workflow.start_activity_method(S3Activities.process_file, req, summary=summary, **options)


def file_input(spec: S3BatchInput, obj: ObjectRef) -> ProcessFileInput:
    """The input of the activity that processes ``obj``."""
    return ProcessFileInput(
        job_id=workflow.info().workflow_id,
        bucket=obj.bucket or spec.bucket,  # a manifest's objects carry their bucket
        obj=obj,
        output_bucket=spec.output_bucket,
        output_prefix=spec.output_prefix,
        format=spec.format,
        handler=spec.handler,
        chunk_records=spec.chunk_records,
        max_record_bytes=spec.max_record_bytes,
        max_rejected_records=spec.max_rejected_records,
        max_rejected_ratio=spec.max_rejected_ratio,
        delimiter=spec.delimiter,
        quotechar=spec.quotechar,
        escapechar=spec.escapechar,
        header=spec.header,
        encoding=spec.encoding,
        sink=spec.sink,
        rejected_of=spec.rejected_of,  # None (a job of any other kind): left out of the input, as before
    )


def keep_check(st: JobState, check: JobCheck, source_indexed: bool) -> None:
    """Keep in the job's state what its check found: whether s3batch's search attributes can be set
    (``source_indexed``: the job was started with ``S3BatchSource``), and its manifest's version."""
    st.indexed = check.search_attributes or source_indexed
    st.manifest_version = check.manifest_version


def listing_input(spec: S3BatchInput, st: JobState, page_size: int) -> ListObjectsInput:
    """The input of the next listing page of a job that is not incremental (of a redrive: of the report redriven;
    of rejected records, ``rejected``, unless it redrives the failed files of such a redrive)."""
    rejected = spec.rejected_of is not None and spec.only_failed_of is None
    return ListObjectsInput(
        bucket=spec.bucket,
        prefix=spec.prefix,
        continuation_token=st.continuation_token,
        page_size=page_size,
        report=spec.rejected_of if rejected else spec.only_failed_of,
        rejected=rejected or None,  # None: left out of the input, as before
        manifest=spec.manifest,  # None, and left out of the input, for a job without one (and below)
        manifest_version=st.manifest_version,
        selection=spec.selection() if spec.selection().active else None,
    )


def run_is_full(st: JobState, started: int) -> bool:
    """The run has started its ``files_per_run`` files (or its history is long enough, or a newer
    worker version is current): it starts no more, and continues as new once its files in flight are
    done (or handed over: ``HAND_OVER_GRACE``)."""
    return started >= st.files_per_run or workflow.info().is_continue_as_new_suggested() or new_version_current()


def new_version_current() -> bool:
    """Worker Versioning: since this run started, another version of the workers became its target (made
    current, or ramping and chosen for this job). The run is pinned to its own version; its successor
    starts on the target one (``s3batch.versioning``), so the sooner it continues as new, the sooner the
    old version drains. The flag comes with a workflow task, so it is seen when a file ends or an update
    arrives. Always False on unversioned workers."""
    info = workflow.info()
    return info.is_target_worker_deployment_version_changed() and workflow.patched(UPGRADE_ON_NEW_VERSION)


def largest_first(objects: list[ObjectRef]) -> list[ObjectRef]:
    """A listing page's files in the order they start: the biggest first (ties in key order), so a big file
    listed after many small ones does not start last and hold its run (and the job) up after they are done;
    the small ones then fill the other slots, and are grouped as before. In key order for jobs started
    before this order (``LARGEST_FIRST``)."""
    if not workflow.patched(LARGEST_FIRST):
        return list(objects)
    return sorted(objects, key=lambda obj: -obj.size)


def next_group(st: JobState, spec: S3BatchInput, limit: int) -> list[ObjectRef]:
    """Pop the next pending object, with the small objects that follow it when it is small itself
    (at most ``limit`` objects in all)."""

    def small(obj: ObjectRef) -> bool:
        # A file to split is never grouped (jobs before split_bytes have it at 1 GiB, over group_max_bytes).
        splits = spec.split_bytes is not None and obj.size > spec.split_bytes
        return spec.group_max_files > 1 and obj.size < spec.group_max_bytes and obj.key not in st.solo and not splits

    first = st.pending.pop(0)
    group = [first]
    if small(first):
        total = first.size
        while (
            st.pending
            and len(group) < min(spec.group_max_files, limit)
            and small(st.pending[0])
            and total + st.pending[0].size <= spec.group_max_bytes
        ):
            total += st.pending[0].size
            group.append(st.pending.pop(0))
    elif first.key in st.solo:
        st.solo.remove(first.key)
    return group

"""How the workflow runs its activities: the options of the short activities and of the file
activities, the input of a file activity, and which pending files go together into one activity
(a group of small files). Pure functions: nothing here issues a workflow command."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.workflow import ActivityCancellationType

with workflow.unsafe.imports_passed_through():
    from s3batch.errors import NON_RETRYABLE_TYPES
    from s3batch.messages import JobState, ObjectRef, ProcessFileInput
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
    )


def next_group(st: JobState, spec: S3BatchInput, limit: int) -> list[ObjectRef]:
    """Pop the next pending object, with the small objects that follow it when it is small itself
    (at most ``limit`` objects in all)."""

    def small(obj: ObjectRef) -> bool:
        return spec.group_max_files > 1 and obj.size < spec.group_max_bytes and obj.key not in st.solo

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

"""The end of a job: its report (one activity) and, from its totals, why it fails, and the steps of its closing
awaited to their end (:func:`to_the_end`). Used by the workflow's control flow (:mod:`~s3batch.workflows.batch`)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from s3batch.activities.s3_activities import S3Activities
    from s3batch.workflows.patches import FINAL_REPORT_STANDS
    from s3batch.workflows.schedule import short_activity

    from s3batch.errors import ACCOUNTING_ERROR
    from s3batch.messages import FileResult, FinalReportInput, JobState, Totals
    from s3batch.models import JobSpec, JobStatus, S3BatchInput

T = TypeVar("T")


async def to_the_end(step: Awaitable[T]) -> T:
    """Await ``step`` of a job's closing (its report, its ledger, its last handlers) to its end, even when a cancel of
    the job arrives meanwhile: the job ends with the status its report was begun with (patch ``final-report-stands``;
    before, the cancel stopped the report activity and a ``cancelled`` report was written, which the first attempt,
    still running on a frozen worker, overwrote). A job whose history has no marker there stops as it did."""
    task = asyncio.ensure_future(step)
    while True:
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if workflow.patched(FINAL_REPORT_STANDS):
                continue
            if task.done():
                raise
            task.cancel()  # as before the patch: the cancel reaches the step
            return await task


async def write_report(spec: S3BatchInput, st: JobState, status: JobStatus, files: list[FileResult]) -> str:
    """Write the job's report (``files``: this run's results); returns its key.

    Raises:
        ApplicationError: ``AccountingError``, the report does not hold every listed key exactly once.
    """
    try:
        return await short_activity(
            spec,
            S3Activities.write_report,
            FinalReportInput(
                job_id=workflow.info().workflow_id,
                job=JobSpec.of(spec),
                status=status,
                totals=st.totals,
                segments=st.report_segments,
                files=files,
                listed_digest=st.listed_digest,
                listing_done=st.listing_done,
                last_listed_key=st.last_listed_key,
                continuation_token=None if st.listing_done else st.continuation_token,
            ),
        )
    except ActivityError as err:
        # The report was written but does not hold every listed key exactly once: the job fails
        # with the report's own error, not as a generic activity failure.
        cause = err.cause
        if isinstance(cause, ApplicationError) and cause.type == ACCOUNTING_ERROR:
            raise ApplicationError(cause.message, type=ACCOUNTING_ERROR, non_retryable=True) from None
        raise


def job_failure(spec: S3BatchInput, totals: Totals, key: str, *, failed: bool, empty: bool) -> ApplicationError | None:
    """The error a finished job fails with (its report at ``key``), or ``None`` when it succeeded."""
    if empty:
        return ApplicationError(
            f"no file matched s3://{spec.bucket}/{spec.prefix} (fail_if_empty): check the bucket and prefix "
            f"(a prefix is the start of the keys, e.g. 'incoming/2026-11-30/'). The report at "
            f"s3://{spec.output_bucket}/{key} says the same.",
            type="EmptyPrefix",
            non_retryable=True,
        )
    if failed:
        return ApplicationError(
            f"{totals.files_failed} of {totals.files_listed} files failed (max_failed_files="
            f"{spec.max_failed_files}); every other file was processed. The report at "
            f"s3://{spec.output_bucket}/{key} lists each failed file with its error.",
            type="JobFailed",
            non_retryable=True,
        )
    return None

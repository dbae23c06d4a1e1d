"""The job's books: what each file activity reported, added to the totals and key digests carried
from run to run, and the check that they add up (no file lost or counted twice). Pure bookkeeping:
nothing here issues a workflow command."""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, RetryState

with workflow.unsafe.imports_passed_through():
    from s3batch.accounting import combine, key_digest
    from s3batch.errors import ACCOUNTING_ERROR, describe_failure
    from s3batch.messages import FileResult, JobState, ObjectRef
    from s3batch.rejects import counts_of, with_job_warnings


class Books:
    """The books of one run.

    Args:
        state: The job's state (carried over by continue-as-new): totals, pending files, digests.
    """

    def __init__(self, state: JobState) -> None:
        self.state = state
        self.in_flight: dict[str, ObjectRef] = {}
        """Files whose activity is running, by key."""
        self.results: list[FileResult] = []
        """This run's per-file results (flushed to a report segment at continue-as-new)."""

    def record_group(self, group: list[ObjectRef], results: list[FileResult], bucket: str) -> None:
        """Record the results of one activity: exactly one per file of its group (none when the
        group failed and its files were put back to run alone)."""
        keys = {obj.key for obj in group}
        for result in results:
            if result.key not in keys:
                raise ApplicationError(
                    f"accounting error: a result for {result.key!r}, which was not in the group of "
                    f"{len(group)} file(s) starting with {group[0].key!r}",
                    type=ACCOUNTING_ERROR,
                    non_retryable=True,
                )
            keys.discard(result.key)
            if result.status == "failed":
                workflow.logger.warning("file s3://%s/%s failed: %s", bucket, result.key, result.error)
            self.record(result)
        if results and keys:
            raise ApplicationError(
                f"accounting error: no result for {len(keys)} of the {len(group)} file(s) of a group "
                f"(e.g. {min(keys)!r})",
                type=ACCOUNTING_ERROR,
                non_retryable=True,
            )

    def record(self, result: FileResult) -> None:
        totals = self.state.totals
        if result.status == "succeeded":
            totals.files_succeeded += 1
        elif result.status == "cancelled":
            totals.files_cancelled += 1
        elif result.status == "not_started":
            totals.files_not_started += 1
        else:
            totals.files_failed += 1
        totals.records += result.records
        totals.records_written += result.records_written
        totals.rejected += result.rejected
        totals.bytes_read += result.bytes_read
        totals.dropped += result.dropped
        self.state.warnings = with_job_warnings(self.state.warnings, result)
        if self.state.done_digest is not None:
            self.state.done_digest = combine(self.state.done_digest, key_digest([result.key]))
        self.results.append(result)

    def check(self) -> None:
        """Fail the job loudly when its counts or key digests do not add up (a lost or doubled file).

        files listed = succeeded + failed + cancelled + not started + pending + in flight, and the
        digest of the listed keys = that of the recorded results' keys + the pending and in-flight ones.
        """
        st = self.state
        t = st.totals
        accounted = (
            t.files_succeeded
            + t.files_failed
            + t.files_cancelled
            + t.files_not_started
            + len(st.pending)
            + len(self.in_flight)
        )
        problems = []
        if accounted != t.files_listed:
            problems.append(
                f"{t.files_listed} files listed, but {t.files_succeeded} succeeded + {t.files_failed} failed + "
                f"{t.files_cancelled} cancelled + {t.files_not_started} not started + {len(st.pending)} pending + "
                f"{len(self.in_flight)} in flight = {accounted}"
            )
        if st.listed_digest is not None and st.done_digest is not None:
            open_keys = key_digest([*(obj.key for obj in st.pending), *self.in_flight])
            if combine(st.done_digest, open_keys) != st.listed_digest:
                problems.append("the keys of the recorded results are not the keys listed (a file lost or repeated)")
        if problems:
            raise ApplicationError(
                f"accounting error in run {st.run} of the job: {'; '.join(problems)}. This is a bug in s3batch: "
                "please report it with the workflow history; no result of this job should be trusted.",
                type=ACCOUNTING_ERROR,
                non_retryable=True,
            )


def completed_anyway(handle: workflow.ActivityHandle[Any]) -> list[FileResult] | None:
    """The results of an activity that completed while its task was being cancelled, if it did.

    temporalio 1.35 keeps that result on the handle's private ``_result_fut``; without it (another
    SDK version) the files are reported cancelled, and their committed output is found by a redrive.
    """
    fut = getattr(handle, "_result_fut", None)
    if not isinstance(fut, asyncio.Future) or not fut.done() or fut.cancelled() or fut.exception() is not None:
        return None
    outcome = fut.result()
    items = outcome if isinstance(outcome, list) else [outcome]
    return [item for item in items if isinstance(item, FileResult)] or None


def cancelled_result(obj: ObjectRef) -> FileResult:
    return FileResult(
        key=obj.key,
        etag=obj.etag,
        status="cancelled",
        error="job cancelled: stopped at a chunk boundary after its last checkpoint",
    )


def failed_result(obj: ObjectRef, err: ActivityError, max_attempts: int) -> FileResult:
    cause = err.cause
    attempts = max_attempts if err.retry_state == RetryState.MAXIMUM_ATTEMPTS_REACHED else 1
    counts: dict[str, Any] = {}
    if isinstance(cause, ApplicationError) and cause.details:
        detail = cause.details[0]
        if isinstance(detail, dict) and "attempt" in detail:
            attempts = int(detail["attempt"])
        counts = counts_of(detail)  # how far the file got (TooManyRejects)
    return FileResult(
        key=obj.key, etag=obj.etag, status="failed", attempts=attempts, error=describe_failure(err), **counts
    )

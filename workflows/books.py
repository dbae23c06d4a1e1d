"""The job's books: what each file activity reported, added to the totals and key digests carried
from run to run, and the check that they add up (no file lost or counted twice). Pure bookkeeping:
nothing here issues a workflow command (but a patch's marker, :func:`retry_cut`, :func:`stop_cut`)."""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, RetryState, is_cancelled_exception
from temporalio.exceptions import TimeoutError as ActivityTimeout

with workflow.unsafe.imports_passed_through():
    from s3batch.workflows.patches import HAND_OVER_FAILED_ATTEMPT, STOPPED_ATTEMPT

    from s3batch.accounting import combine, key_digest
    from s3batch.after_success import count
    from s3batch.errors import ACCOUNTING_ERROR, NON_RETRYABLE_TYPES, describe_failure
    from s3batch.messages import FileResult, JobState, ListObjectsResult, ObjectRef
    from s3batch.rejects import counts_of, with_job_warnings

WHOLE_WARNING = (
    "processed whole, not in splits: a quoted field holds a line break where a split would begin "
    '(set "split_bytes": null to never split)'
)
"""The warning of a file over ``split_bytes`` that could not be split and was processed whole."""


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

    def listed(self, page: ListObjectsResult) -> None:
        """Count a listing page's files (already added to ``pending``) and where the listing stands."""
        st = self.state
        if page.objects:
            st.last_listed_key = page.objects[-1].key
        if st.listed_digest is not None:
            st.listed_digest = combine(st.listed_digest, key_digest(obj.key for obj in page.objects))
        st.continuation_token = page.next_token
        st.listing_done = page.next_token is None
        st.totals.files_listed += len(page.objects)

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
        if self.state.whole and result.key in self.state.whole:  # over split_bytes, but processed whole
            self.state.whole = [k for k in self.state.whole if k != result.key] or None
            result = result.model_copy(update={"warnings": [*(result.warnings or []), WHOLE_WARNING]})
            if result.status in ("cancelled", "failed"):  # its splits' output, read wrong at a boundary, is void
                result = void_split(result)
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
        if result.already_written:  # found done, written by an earlier job (None before the field: left out)
            totals.already_written = (totals.already_written or 0) + result.already_written
        totals.after_success = count(totals.after_success, result.after_success)  # None without the option
        self.state.warnings = with_job_warnings(self.state.warnings, result)
        if self.state.done_digest is not None:
            self.state.done_digest = combine(self.state.done_digest, key_digest([result.key]))
        self.results.append(result)
        self._forget_hand_over(result.key)

    def hand_over(self, group: list[ObjectRef], results: list[FileResult], bucket: str, *, splits: int = 1) -> None:
        """Put the files of ``group`` that stopped for a hand-over (their result says ``cancelled``)
        back at the front of ``pending``, for the next run, and record the others (files finished or
        failed meanwhile). Neither succeeded nor failed, a handed-over file is counted once, when its
        result comes in a later run. A file that ran in ``splits`` byte-range splits runs in the same
        splits in the next run (``JobState.split_counts``).

        A file whose leg committed no chunk since its last hand-over is ``kept``: it is not handed
        over again, so every file makes progress.
        """
        st = self.state
        stopped = {r.key: r.chunks for r in results if r.status == "cancelled"}
        again = [obj for obj in group if obj.key in stopped]
        handed = st.handed_over or {}
        for obj in again:
            chunks = stopped.get(obj.key, 0)
            if obj.key in handed and chunks <= handed[obj.key]:
                st.kept = [*(st.kept or []), obj.key]
            handed[obj.key] = max(chunks, handed.get(obj.key, 0))
        st.handed_over = handed or None
        if splits > 1 and again:
            st.split_counts = {**(st.split_counts or {}), **{obj.key: splits for obj in again}}
        st.pending[0:0] = again
        rest = [obj for obj in group if obj.key not in stopped]
        if rest:
            self.record_group(rest, [r for r in results if r.status != "cancelled"], bucket)

    def failed(
        self, group: list[ObjectRef], err: ActivityError, max_attempts: int, *, stopped: bool, handing_over: bool
    ) -> list[FileResult]:
        """The results of a failed file activity (none when a group's files are put back to run alone).

        ``stopped``: the workflow asked the activity to stop (a cancel, ``max_rejected_total``, a hand-over).
        ``handing_over``: for a hand-over, an activity that timed out meanwhile (its worker was lost: the
        server retries no activity it was asked to cancel), or whose attempt failed meanwhile for a reason
        a retry may pass (:func:`retry_cut`), is stopped too, not failed: the next run starts it again
        from its committed checkpoint. For a cancel (or ``max_rejected_total``) it is stopped too
        (:func:`stop_cut`): ``cancelled``, the report reading its committed output back.
        """
        lost = handing_over and (isinstance(err.cause, ActivityTimeout) or retry_cut(err))
        lost = lost or (stopped and not handing_over and stop_cut(err))
        if stopped and (is_cancelled_exception(err) or lost):
            return [cancelled_result(obj) for obj in group]
        if len(group) == 1:
            return [failed_result(group[0], err, max_attempts)]
        # Give each file of the failed group its own activity (and its own retries), so one
        # bad file cannot fail its neighbours.
        workflow.logger.warning("group of %d files failed (%s); retrying them one by one", len(group), err)
        self.state.pending[0:0] = group
        self.state.solo.extend(obj.key for obj in group)
        return []

    def may_hand_over(self) -> bool:
        """No file in flight is ``kept`` (each of them may be handed over)."""
        kept = self.state.kept or []
        return bool(self.in_flight) and not any(key in kept for key in self.in_flight)

    def close_pending(self) -> None:
        """Record the pending files of a stopped job: ``not_started``, but ``cancelled`` for a file an
        earlier run handed over (it has committed output, whose counts the report reads back) or whose splits
        failed at a boundary (their output is void: ``split_void``, removed with the report)."""
        handed = self.state.handed_over or {}
        whole = self.state.whole or ()  # put back to run whole after its splits failed: they wrote output
        for obj in self.state.pending:
            started = obj.key in handed or obj.key in whole
            self.record(cancelled_result(obj) if started else FileResult.not_started(obj.key, obj.etag))
        self.state.pending = []

    def _forget_hand_over(self, key: str) -> None:
        st = self.state
        if st.handed_over and key in st.handed_over:
            del st.handed_over[key]
            st.handed_over = st.handed_over or None
        if st.kept and key in st.kept:
            st.kept = [k for k in st.kept if k != key] or None
        if st.split_counts and key in st.split_counts:
            del st.split_counts[key]
            st.split_counts = st.split_counts or None

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


def retry_cut(err: ActivityError) -> bool:
    """Whether ``err`` is the failure of an attempt that a retry may pass, ending an activity the workflow had
    asked to stop: the server retries no such activity (retry state ``CANCEL_REQUESTED``), whatever attempts
    it had left. Asks the ``hand-over-failed-attempt`` patch, only where it changes the outcome (the histories
    of jobs started before it have no marker there)."""
    cause = err.cause
    if err.retry_state != RetryState.CANCEL_REQUESTED or not isinstance(cause, ApplicationError):
        return False
    if cause.non_retryable or cause.type in NON_RETRYABLE_TYPES:
        return False  # it failed for good: no retry would have passed it
    return workflow.patched(HAND_OVER_FAILED_ATTEMPT)


def stop_cut(err: ActivityError) -> bool:
    """Whether ``err`` ended an activity that a cancel of the job (or ``max_rejected_total``) had asked to stop, for
    a reason a retry may pass: an attempt that failed so, or timed out (its worker lost or frozen). The server retries
    no such activity (retry state ``CANCEL_REQUESTED``); its file stopped where its output was committed. Asks the
    ``stopped-attempt`` patch only where it changes the outcome."""
    cause = err.cause
    if err.retry_state != RetryState.CANCEL_REQUESTED or not isinstance(cause, ApplicationError | ActivityTimeout):
        return False
    if isinstance(cause, ApplicationError) and (cause.non_retryable or cause.type in NON_RETRYABLE_TYPES):
        return False  # it failed for good: no retry would have passed it
    return workflow.patched(STOPPED_ATTEMPT)


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


UNSPLITTABLE = (
    "it could not be split (a quoted line break at a split boundary), so what its splits wrote is removed and a "
    "redrive processes it whole"
)
"""Why the split output of a file is void: a split found that the next one began inside a record."""
UNCHECKED = (
    "its splits stopped before each had reached its end, where it checks that the next split began at a record "
    "(not inside a quoted one), so what they wrote is removed and a redrive processes it from its start"
)
"""Why the split output of a file is void: stopped before every boundary between its splits was checked."""


def void_split(result: FileResult, why: str = UNSPLITTABLE) -> FileResult:
    """``result`` of a file stopped with split output that cannot be trusted (``why``): ``split_void``, what its
    splits wrote removed with the report."""
    error = f"{result.error + '; ' if result.error else ''}{why}"
    return result.model_copy(update={"split_void": True, "error": error})


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

"""``S3BatchWorkflow``: list a prefix page by page and process every object, durably.

The workflow holds at most one listing page of keys, runs at most ``max_concurrent_files`` file
activities at once, and continues as new every ``JobState.files_per_run`` files (or when the server suggests
it), flushing that run's per-file results to S3 so its history and state stay small whatever the
number of files.

Control, by workflow updates (so ``temporal workflow update execute --name pause`` works as well as
``s3batch pause``):

- ``pause`` / ``resume``: a paused job starts no new file. Pause lets running files finish: an
  activity already in flight (one file, or a group of small files) runs to its end.
- ``set_concurrency(n)``: the number of files in flight, 1..1000, for this run and later ones
  (lowering it lets the extra files in flight finish).
- Cancelling the workflow is graceful: no new file starts, in-flight files are asked to stop at their
  next chunk boundary (after their checkpoint) and waited for, the report is written with them as
  ``cancelled``, and the workflow then ends as cancelled.

This module holds the workflow's control flow and its commands, but for two steps:
:mod:`~s3batch.workflows.ledger` (an incremental job's listing and ledger) and
:mod:`~s3batch.workflows.report` (the report, and why a finished job fails). The rest is pure:
:mod:`~s3batch.workflows.inputs` validates its arguments, :mod:`~s3batch.workflows.schedule` builds
activity options and inputs and groups small files, :mod:`~s3batch.workflows.books` keeps the job's
books, :mod:`~s3batch.workflows.status` renders its details, progress and search attributes.
"""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, is_cancelled_exception

with workflow.unsafe.imports_passed_through():
    from s3batch.activities.s3_activities import S3Activities
    from s3batch.workflows.books import Books, cancelled_result, completed_anyway, failed_result
    from s3batch.workflows.inputs import parse_job, parse_state
    from s3batch.workflows.ledger import list_incremental_page, write_ledger
    from s3batch.workflows.report import job_failure, write_report
    from s3batch.workflows.schedule import SHORT_RETRY, SHORT_TIMEOUT, file_activity_options, file_input, next_group
    from s3batch.workflows.status import SearchIndex, details, job_progress, source_of

    from s3batch import search_attributes as sa
    from s3batch.accounting import combine, key_digest
    from s3batch.errors import TOO_MANY_REJECTS
    from s3batch.incremental import run_output_prefix
    from s3batch.messages import (
        FileResult,
        ListObjectsInput,
        ObjectRef,
        ProcessGroupInput,
        Progress,
        ReportSegmentInput,
        S3BatchResult,
    )
    from s3batch.models import JobSpec, JobStatus, S3BatchInput
    from s3batch.rejects import total_crossed

LIST_PAGE_SIZE = 500
MAX_CONCURRENCY = 1_000

# Patches: changes that alter the commands of a running job (see tests/histories/).
KEEP_REQUEUED_FILES = "keep-requeued-files"
"""Files of a failed group, put back in ``pending`` while the next page was being listed, are kept
(v0.1.0 replaced ``pending`` with the new page, dropping them)."""
REPORT_ON_ANY_CANCEL = "report-on-any-cancel"
"""A job cancelled while a short activity (listing, check, report segment) is in flight still writes
its report (v0.1.0 ended without one)."""
FAIL_IF_EMPTY = "fail-if-empty"
"""A job with ``fail_if_empty`` whose prefix matched no file fails (``EmptyPrefix``) after writing its
report as failed (jobs before it could only succeed with 0 files)."""

@workflow.defn(name="S3BatchWorkflow")
class S3BatchWorkflow:
    @workflow.init
    def __init__(self, job: Any = None, state: Any = None) -> None:
        # The state is read here, not in run(), so an update arriving in a run's first activation
        # sees (and changes) the state carried over by continue-as-new. Both arguments default to
        # None: a missing argument must fail the workflow clearly, not its task (which would hang).
        self._state = parse_state(state, continued=workflow.info().continued_run_id is not None)
        self._job: S3BatchInput | None = None
        self._given: S3BatchInput | None = None
        """The job as given (an incremental job's ``_job`` writes under its run's own output prefix)."""
        self._wake = 0
        """Bumped by every control update, to wake the scheduling loop."""
        self._cancelling = False
        self._stopping = False
        """Files in flight are being stopped because the job is over ``max_rejected_total``."""
        self._index = SearchIndex()
        self._books = Books(self._state)
        self._finished = 0
        self._active = 0
        """File activities running (a group of small files is one)."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._fatal: ApplicationError | None = None
        """An accounting error found by a file task, raised by the scheduling loop."""

    @property
    def _spec(self) -> S3BatchInput:
        """The job (set by ``run`` before any activity starts)."""
        assert self._job is not None
        return self._job

    @workflow.run
    async def run(self, job: Any = None, state: Any = None) -> S3BatchResult:
        """Process every object under ``bucket/prefix``.

        Args:
            job: The job, as an :class:`S3BatchInput` or its JSON.
            state: Set by continue-as-new only.
        """
        spec = self._given = parse_job(job)
        if spec.incremental is not None:
            run_prefix = run_output_prefix(spec.output_prefix, workflow.info().workflow_id)
            spec = spec.model_copy(update={"output_prefix": run_prefix})
        self._job = spec
        try:
            return await self._run(spec)
        except asyncio.CancelledError:
            await self._cancel(spec)
            raise
        except ActivityError as err:
            # Cancelled while a listing page, the check or a report segment was in flight: the
            # activity's cancellation arrives as an ActivityError. v0.1.0 ended such a job without
            # its report.
            if is_cancelled_exception(err) and workflow.patched(REPORT_ON_ANY_CANCEL):
                await self._cancel(spec)
            raise

    async def _run(self, spec: S3BatchInput) -> S3BatchResult:
        st = self._state
        self._update_details()
        if st.run == 0:
            check = await workflow.execute_activity_method(
                S3Activities.check_job, JobSpec.of(spec), start_to_close_timeout=SHORT_TIMEOUT, retry_policy=SHORT_RETRY
            )
            st.indexed = check.search_attributes or workflow.info().typed_search_attributes.get(sa.SOURCE) is not None
            self._index.checked_source = source_of(check)
            # Jobs started by this release keep key digests; older ones are checked by counts only.
            st.listed_digest = st.done_digest = 0

        started_this_run = 0
        while True:
            while not st.paused and self._active < self._limit():
                if started_this_run >= st.files_per_run or workflow.info().is_continue_as_new_suggested():
                    break
                if not st.pending:
                    if st.listing_done:
                        break
                    await self._list_next_page()
                    continue
                started_this_run += self._start_next(max(1, st.files_per_run - started_this_run))
            if not self._active and not st.paused:
                break
            self._update_details()  # files just started count as in flight
            await self._wait_for_change()
            if self._fatal is not None:
                raise self._fatal
            over = total_crossed(st.totals, spec.max_rejected_total)  # None without the option: no new command
            if over is not None:
                return await self._stop_for_rejects(spec, over)

        self._books.check()
        if st.pending or not st.listing_done:
            await self._continue_as_new()
        return await self._finish()

    def _start_next(self, limit: int) -> int:
        """Start the activity of the next file (or group of small files); returns how many files."""
        group = next_group(self._state, self._spec, limit)
        for obj in group:
            self._books.in_flight[obj.key] = obj
        self._active += 1
        task = asyncio.create_task(self._process(group))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return len(group)

    async def _wait_for_change(self) -> None:
        """Until a file activity ends or a control update arrives."""
        finished, wake = self._finished, self._wake

        def changed() -> bool:
            return self._finished != finished or self._wake != wake

        await workflow.wait_condition(changed)

    def _limit(self) -> int:
        """Files in flight allowed now: the last ``set_concurrency``, else the job's own setting."""
        spec = self._job
        return self._state.max_concurrent_files or (spec.max_concurrent_files if spec else 1)

    async def _cancel(self, spec: S3BatchInput) -> None:
        """Graceful cancellation: stop the files in flight at a chunk boundary and write the report."""
        self._cancelling = True
        self._update_details()
        await self._stop_files()
        workflow.logger.info(
            "job cancelled: %d file(s) stopped in flight, %d not started",
            self._state.totals.files_cancelled,
            self._state.totals.files_not_started,
        )
        self._books.check()
        key = await write_report(spec, self._state, "cancelled", self._books.results)
        await write_ledger(spec, self._given or spec, "cancelled", key, listing_done=self._state.listing_done)
        self._update_details(final="cancelled")
        await workflow.wait_condition(workflow.all_handlers_finished)

    async def _stop_files(self) -> None:
        """Stop the files in flight at a chunk boundary (``cancelled``); the others are ``not_started``."""
        for task in list(self._tasks):
            # The activities use WAIT_CANCELLATION_COMPLETED: each task ends once its activity
            # has stopped after its last checkpoint (or finished anyway).
            task.cancel()
        await workflow.wait_condition(lambda: not self._active)
        # Files that never started are in the report too (a redrive of this job picks them up), and
        # the listing's position: a redrive lists on after the last key this job saw.
        for obj in self._state.pending:
            self._books.record(FileResult.not_started(obj.key, obj.etag))
        self._state.pending = []

    async def _stop_for_rejects(self, spec: S3BatchInput, reason: str) -> S3BatchResult:
        """Over ``max_rejected_total``: stop the files like a cancel, write the report, fail the job."""
        self._stopping = True
        await self._stop_files()
        self._books.check()
        key = await write_report(spec, self._state, "failed", self._books.results)
        await write_ledger(spec, self._given or spec, "failed", key, listing_done=self._state.listing_done)
        self._update_details(final="failed")
        await workflow.wait_condition(workflow.all_handlers_finished)
        raise ApplicationError(
            f"{reason} The report: s3://{spec.output_bucket}/{key}", type=TOO_MANY_REJECTS, non_retryable=True
        )

    async def _list_next_page(self) -> None:
        st = self._state
        spec = self._spec
        if spec.incremental is not None:
            page = await list_incremental_page(spec, self._given or spec, st.continuation_token, LIST_PAGE_SIZE)
        else:
            page = await workflow.execute_activity_method(
                S3Activities.list_objects,
                ListObjectsInput(
                    bucket=spec.bucket,
                    prefix=spec.prefix,
                    continuation_token=st.continuation_token,
                    page_size=LIST_PAGE_SIZE,
                    report=spec.only_failed_of,
                    manifest=spec.manifest,  # None, and left out of the input, for a job without one (and below)
                    selection=spec.selection() if spec.selection().active else None,
                ),
                start_to_close_timeout=SHORT_TIMEOUT,
                retry_policy=SHORT_RETRY,
            )
        if workflow.patched(KEEP_REQUEUED_FILES):
            # A failed group's files may have been put back while this page was being listed.
            st.pending.extend(page.objects)
        else:
            st.pending = list(page.objects)
        if page.objects:
            st.last_listed_key = page.objects[-1].key
        if st.listed_digest is not None:
            st.listed_digest = combine(st.listed_digest, key_digest(obj.key for obj in page.objects))
        st.continuation_token = page.next_token
        st.listing_done = page.next_token is None
        st.totals.files_listed += len(page.objects)
        self._update_details()

    def _start_file_activity(self, group: list[ObjectRef]) -> workflow.ActivityHandle[Any]:
        options = file_activity_options(self._spec)
        if len(group) == 1:
            return workflow.start_activity_method(
                S3Activities.process_file, file_input(self._spec, group[0]), summary=group[0].key, **options
            )
        return workflow.start_activity_method(
            S3Activities.process_group,
            ProcessGroupInput(file=file_input(self._spec, group[0]), more=group[1:]),
            summary=f"{group[0].key} and {len(group) - 1} more small files",
            **options,
        )

    async def _process(self, group: list[ObjectRef]) -> None:
        results: list[FileResult] = []
        handle = self._start_file_activity(group)
        try:
            outcome = await handle
            results = outcome if isinstance(outcome, list) else [outcome]
        except asyncio.CancelledError:
            # Only the job's cancellation cancels this task; the activity has already stopped. When
            # it completed in the very activation that cancelled it, the SDK still raises: its
            # result (the files it finished) is then taken from the handle.
            results = completed_anyway(handle) or [cancelled_result(obj) for obj in group]
        except ActivityError as err:
            results = self._failed(group, err)
        try:
            self._books.record_group(group, results, self._spec.bucket)
        except ApplicationError as err:
            # An exception in this task would be lost: the scheduling loop raises it.
            self._fatal = err
        finally:
            for obj in group:
                del self._books.in_flight[obj.key]
            self._active -= 1
            self._finished += 1
            self._update_details()

    def _failed(self, group: list[ObjectRef], err: ActivityError) -> list[FileResult]:
        """The results of a failed file activity (none when a group's files are put back to run alone)."""
        if (self._cancelling or self._stopping) and is_cancelled_exception(err):
            return [cancelled_result(obj) for obj in group]
        if len(group) == 1:
            return [failed_result(group[0], err, self._spec.max_attempts)]
        # Give each file of the failed group its own activity (and its own retries), so one
        # bad file cannot fail its neighbours.
        workflow.logger.warning("group of %d files failed (%s); retrying them one by one", len(group), err)
        self._state.pending[0:0] = group
        self._state.solo.extend(obj.key for obj in group)
        return []

    async def _continue_as_new(self) -> None:
        st = self._state
        spec = self._spec
        if self._books.results:
            await workflow.execute_activity_method(
                S3Activities.write_report_segment,
                ReportSegmentInput(
                    output_bucket=spec.output_bucket,
                    output_prefix=spec.output_prefix,
                    segment=st.report_segments,
                    files=self._books.results,
                ),
                start_to_close_timeout=SHORT_TIMEOUT,
                retry_policy=SHORT_RETRY,
            )
            st.report_segments += 1
        st.run += 1
        await workflow.wait_condition(workflow.all_handlers_finished)
        # Only the fields the user gave: a worker of an older version, which knows no field added
        # since, can still read the job.
        given = self._given or spec
        workflow.continue_as_new(args=[given.model_dump(mode="json", exclude_unset=True), st.model_dump(mode="json")])

    async def _finish(self) -> S3BatchResult:
        st = self._state
        spec = self._spec
        failed = st.totals.files_failed > spec.max_failed_files
        empty = spec.fail_if_empty and st.totals.files_listed == 0 and workflow.patched(FAIL_IF_EMPTY)
        status: JobStatus = "failed" if failed or empty else "succeeded"
        key = await write_report(spec, self._state, status, self._books.results)
        await write_ledger(spec, self._given or spec, status, key, listing_done=self._state.listing_done)
        self._update_details(final=status)
        await workflow.wait_condition(workflow.all_handlers_finished)
        error = job_failure(spec, st.totals, key, failed=failed, empty=empty)
        if error is not None:
            raise error
        warnings = st.warnings or []
        return S3BatchResult(
            status="succeeded", totals=st.totals, report_bucket=spec.output_bucket, report_key=key, warnings=warnings
        )

    @workflow.query
    def progress(self) -> Progress:
        """Counters of the whole job (all runs so far) and the files in flight."""
        return job_progress(self._state, self._books.in_flight, self._limit(), self._cancelling)

    @workflow.update
    def pause(self) -> Progress:
        """Start no new file until ``resume``; files in flight run to their end."""
        self._state.paused = True
        return self._changed()

    @workflow.update
    def resume(self) -> Progress:
        """Start files again after ``pause`` (a no-op when the job is not paused)."""
        self._state.paused = False
        return self._changed()

    @workflow.update
    def set_concurrency(self, n: int) -> Progress:
        """Process at most ``n`` files at once from now on, in this run and later ones."""
        self._state.max_concurrent_files = n
        return self._changed()

    @set_concurrency.validator
    def _validate_concurrency(self, n: int) -> None:
        # A rejected update never reaches history: the job is untouched and the caller gets the error.
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_CONCURRENCY:
            raise ValueError(f"concurrency must be an integer from 1 to {MAX_CONCURRENCY}, got {n!r}")

    def _changed(self) -> Progress:
        self._wake += 1
        self._update_details()
        return self.progress()

    def _update_details(self, final: str | None = None) -> None:
        spec = getattr(self, "_job", None)
        self._index.upsert(self._state, spec, self._cancelling, final)
        workflow.set_current_details(
            details(self._state, spec, len(self._books.in_flight), self._limit(), self._cancelling, final)
        )

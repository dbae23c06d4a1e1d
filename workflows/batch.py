"""``S3BatchWorkflow``: list a prefix page by page and process every object, durably.

The workflow holds at most one listing page of keys, runs at most ``max_concurrent_files`` file
activities at once, and continues as new every ``JobState.files_per_run`` files (or when the server
suggests it), flushing that run's per-file results to S3 so its history and state stay small. Files
still in flight a moment (``HAND_OVER_GRACE``) after a run has started its files are stopped at a chunk
boundary and handed to the next run, which resumes them while its own files fill the other slots.

Control, by workflow updates (``temporal workflow update execute --name pause`` works as well as
``s3batch pause``):

- ``pause`` / ``resume``: a paused job starts no new file; an activity already in flight (one file,
  or a group of small files) runs to its end.
- ``set_concurrency(n)``: the number of files in flight, 1..1000, for this run and later ones
  (lowering it lets the extra files in flight finish).
- Cancelling the workflow is graceful: no new file starts, in-flight files stop at their next chunk
  boundary (after their checkpoint), the report lists them as ``cancelled``, the job ends cancelled.

Besides the control flow here: ``ledger`` (listing pages, an incremental job's ledger), ``report`` (the
report, why a finished job fails), ``inputs``, ``schedule`` (activity options and inputs, groups of small
files), ``splits`` (big files in splits), ``books``, ``status``, ``patches``, all under ``s3batch.workflows``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, is_cancelled_exception
from temporalio.workflow import ContinueAsNewVersioningBehavior

with workflow.unsafe.imports_passed_through():
    from s3batch.activities.s3_activities import S3Activities
    from s3batch.workflows.after_success import after_success
    from s3batch.workflows.books import Books, cancelled_result, completed_anyway
    from s3batch.workflows.inputs import parse_job, parse_state
    from s3batch.workflows.ledger import list_page, write_ledger
    from s3batch.workflows.patches import (
        FAIL_IF_EMPTY,
        HAND_OVER_SPLITS,
        HAND_OVER_STRAGGLERS,
        KEEP_REQUEUED_FILES,
        REPORT_ON_ANY_CANCEL,
        SPLIT_BIG_FILES,
    )
    from s3batch.workflows.report import job_failure, to_the_end, write_report
    from s3batch.workflows.schedule import (
        HAND_OVER_GRACE,
        keep_check,
        largest_first,
        next_group,
        run_is_full,
        short_activity,
        start_file_activity,
    )
    from s3batch.workflows.splits import run_splits, split_count, split_outcome
    from s3batch.workflows.status import SearchIndex, details, job_progress, source_of

    from s3batch import search_attributes as sa
    from s3batch.errors import TOO_MANY_REJECTS
    from s3batch.incremental import run_output_prefix
    from s3batch.messages import FileResult, ObjectRef, Progress, ReportSegmentInput, S3BatchResult
    from s3batch.models import JobSpec, JobStatus, S3BatchInput
    from s3batch.rejects import total_crossed

LIST_PAGE_SIZE = 500
MAX_CONCURRENCY = 1_000

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
        self._handing_over = False
        """Files in flight are being stopped to hand them to the next run."""
        self._grace: asyncio.Task[None] | None = None
        """The timer of ``HAND_OVER_GRACE``, started when the run is full."""
        self._index = SearchIndex()
        self._books = Books(self._state)
        self._finished = 0
        self._active = 0
        """File activities running (a group of small files is one)."""
        self._split_slots = 0
        """Of those, the slots of files in splits beyond one a file (a file in 3 splits: 2)."""
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
            check = await short_activity(spec, S3Activities.check_job, JobSpec.of(spec))
            keep_check(st, check, workflow.info().typed_search_attributes.get(sa.SOURCE) is not None)
            self._index.checked_source = source_of(check)
            # Jobs started by this release keep key digests; older ones are checked by counts only.
            st.listed_digest = st.done_digest = 0

        started_this_run = 0
        while True:
            while not st.paused and self._active < self._limit():
                if run_is_full(st, started_this_run):
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
            if self._straggling(started_this_run):
                await self._hand_over()
            else:
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
        splits = split_count(self._spec, self._state, group[0], self._limit() - self._active) if len(group) == 1 else 1
        if splits > 1 and not workflow.patched(SPLIT_BIG_FILES):
            splits = 1
        for obj in group:
            self._books.in_flight[obj.key] = obj
        self._active += splits  # a file in splits takes a slot per split
        self._split_slots += splits - 1
        task = asyncio.create_task(self._process(group) if splits == 1 else self._process_splits(group[0], splits))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return len(group)

    def _straggling(self, started: int) -> bool:
        """The run is full, more files wait for the next run, and the files in flight have had their
        grace (``HAND_OVER_GRACE``): they should be handed over. Starts the grace timer when due."""
        st = self._state
        more = st.pending or not st.listing_done
        if st.paused or st.hand_over is False or not more or not run_is_full(st, started):
            return False
        if not self._books.may_hand_over() or not workflow.patched(HAND_OVER_STRAGGLERS):
            return False
        if self._active >= self._limit() or len(self._books.in_flight) + self._split_slots != self._active:
            return False  # no slot idle, or small files in groups (done in seconds): nothing to gain
        if self._split_slots and not workflow.patched(HAND_OVER_SPLITS):
            return False  # a job started before: it waits for its files in splits
        if self._grace is None:
            self._grace = asyncio.create_task(self._grace_timer())
        return self._grace.done()

    async def _grace_timer(self) -> None:
        await workflow.sleep(HAND_OVER_GRACE)
        self._wake += 1

    async def _hand_over(self) -> None:
        """Stop the files in flight at their next chunk boundary (after their checkpoint) and put them
        at the front of the pending files: the next run resumes them and fills every slot again."""
        workflow.logger.info("handing %d file(s) in flight over to the next run", len(self._books.in_flight))
        self._handing_over = True
        await self._stop_in_flight()

    async def _stop_in_flight(self) -> None:
        """Stop the files in flight at a chunk boundary (a cancel, ``max_rejected_total``, a hand-over)."""
        for task in list(self._tasks):
            # The activities use WAIT_CANCELLATION_COMPLETED: each task ends once its activity
            # has stopped after its last checkpoint (or finished anyway).
            task.cancel()
        await workflow.wait_condition(lambda: not self._active)

    async def _wait_for_change(self) -> None:
        """Until a file activity ends or a control update arrives."""
        finished, wake = self._finished, self._wake

        def changed() -> bool:
            return self._finished != finished or self._wake != wake

        await workflow.wait_condition(changed)

    def _ending(self) -> bool:
        """The job is being cancelled, or stopped for ``max_rejected_total``."""
        return self._cancelling or self._stopping

    def _limit(self) -> int:
        """Files in flight allowed now: the last ``set_concurrency``, else the job's own setting."""
        spec = self._job
        return self._state.max_concurrent_files or (spec.max_concurrent_files if spec else 1)

    async def _cancel(self, spec: S3BatchInput) -> None:
        """Graceful cancellation: stop the files in flight at a chunk boundary and write the report."""
        self._cancelling = True
        self._update_details()
        await self._stop_in_flight()
        await self._close(spec, "cancelled")
        totals = self._state.totals
        workflow.logger.info("job cancelled: %d file(s) stopped, %d not started", totals.files_cancelled,
                             totals.files_not_started)

    async def _close(self, spec: S3BatchInput, status: JobStatus) -> str:
        """Write the report and the ledger of a job ending ``status``; returns the report's key."""
        # Files that never started are in the report too (a redrive of this job picks them up), and
        # the listing's position: a redrive lists on after the last key this job saw.
        self._books.close_pending()
        self._books.check()
        key = await to_the_end(write_report(spec, self._state, status, self._books.results))
        await to_the_end(write_ledger(spec, self._given or spec, status, key, listing_done=self._state.listing_done))
        self._update_details(final=status)
        await to_the_end(workflow.wait_condition(workflow.all_handlers_finished))
        return key

    async def _stop_for_rejects(self, spec: S3BatchInput, reason: str) -> S3BatchResult:
        """Over ``max_rejected_total``: stop the files like a cancel, write the report, fail the job."""
        self._stopping = True
        await self._stop_in_flight()
        key = await self._close(spec, "failed")
        raise ApplicationError(
            f"{reason} The report: s3://{spec.output_bucket}/{key}", type=TOO_MANY_REJECTS, non_retryable=True
        )

    async def _list_next_page(self) -> None:
        st = self._state
        spec = self._spec
        page = await list_page(spec, self._given or spec, st, LIST_PAGE_SIZE)
        if workflow.patched(KEEP_REQUEUED_FILES):
            # A failed group's files may have been put back while this page was being listed.
            st.pending.extend(largest_first(page.objects))
        else:
            st.pending = list(page.objects)
        self._books.listed(page)
        self._update_details()

    async def _process(self, group: list[ObjectRef]) -> None:
        results: list[FileResult] = []
        handle = start_file_activity(self._spec, group)
        try:
            outcome = await handle
            results = outcome if isinstance(outcome, list) else [outcome]
        except asyncio.CancelledError:
            # Only the job's cancellation (or a hand-over) cancels this task; the activity has stopped. When
            # it completed in the very activation that cancelled it, the SDK still raises: its
            # result (the files it finished) is then taken from the handle.
            results = completed_anyway(handle) or [cancelled_result(obj) for obj in group]
        except ActivityError as err:
            over = self._handing_over and not self._ending()  # a hand-over, not a cancel
            stopped = self._ending() or over
            results = self._books.failed(group, err, self._spec.max_attempts, stopped=stopped, handing_over=over)
        try:
            results = await after_success(self._spec, group, results)  # those that succeeded: archived...
            if self._handing_over and not self._ending():
                self._books.hand_over(group, results, self._spec.bucket)
            else:
                self._books.record_group(group, results, self._spec.bucket)
        except ApplicationError as err:
            # An exception in this task would be lost: the scheduling loop raises it.
            self._fatal = err
        finally:
            self._ended(group, 1)

    def _ended(self, group: list[ObjectRef], slots: int) -> None:
        """The activity (or splits) of ``group`` has ended and is recorded: free its ``slots``."""
        for obj in group:
            del self._books.in_flight[obj.key]
        self._active -= slots
        self._split_slots -= slots - 1
        self._finished += 1
        self._update_details()

    async def _process_splits(self, obj: ObjectRef, count: int) -> None:
        """Process a big file as ``count`` byte-range splits at once; record one result for it."""
        spec = self._spec
        try:
            ended = await run_splits(spec, obj, count, lambda: self._ending() or self._handing_over)
            over = self._handing_over and not self._ending()  # a hand-over, not a cancel
            outcome = split_outcome(self._books, spec, obj, ended, stopped=self._ending() or over, handing_over=over)
            outcome = await after_success(spec, [obj], outcome) if outcome else outcome
            if outcome is None:
                pass  # put back, to be processed whole
            elif over:
                self._books.hand_over([obj], outcome, spec.bucket, splits=count)
            else:
                self._books.record_group([obj], outcome, spec.bucket)
        except ApplicationError as err:
            self._fatal = err  # raised by the scheduling loop
        finally:
            self._ended([obj], count)

    async def _continue_as_new(self) -> None:
        st = self._state
        spec = self._spec
        if self._books.results:
            await short_activity(
                spec,
                S3Activities.write_report_segment,
                ReportSegmentInput(
                    output_bucket=spec.output_bucket,
                    output_prefix=spec.output_prefix,
                    segment=st.report_segments,
                    files=self._books.results,
                ),
            )
            st.report_segments += 1
        st.run += 1
        await workflow.wait_condition(workflow.all_handlers_finished)
        # Only the fields the user gave: a worker of an older version, which knows no field added
        # since, can still read the job.
        given = self._given or spec
        args = [given.model_dump(mode="json", exclude_unset=True), st.model_dump(mode="json")]
        workflow.continue_as_new(args=args, initial_versioning_behavior=ContinueAsNewVersioningBehavior.AUTO_UPGRADE)

    async def _finish(self) -> S3BatchResult:
        st = self._state
        spec = self._spec
        failed = st.totals.files_failed > spec.max_failed_files
        empty = spec.fail_if_empty and st.totals.files_listed == 0 and workflow.patched(FAIL_IF_EMPTY)
        status: JobStatus = "failed" if failed or empty else "succeeded"
        key = await self._close(spec, status)
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
        return job_progress(self._state, self._books.in_flight, self._limit(), self._cancelling, self._job)

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

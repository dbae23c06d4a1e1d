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
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, RetryState, is_cancelled_exception
from temporalio.workflow import ActivityCancellationType

with workflow.unsafe.imports_passed_through():
    from s3batch.activities.s3_activities import S3Activities

    from s3batch import layout
    from s3batch import search_attributes as sa
    from s3batch.accounting import combine, key_digest
    from s3batch.errors import ACCOUNTING_ERROR, INVALID_INPUT, NON_RETRYABLE_TYPES
    from s3batch.models import (
        FileResult,
        FinalReportInput,
        JobSpec,
        JobState,
        JobStatus,
        ListObjectsInput,
        ObjectRef,
        ProcessFileInput,
        ProcessGroupInput,
        Progress,
        ReportSegmentInput,
        S3BatchInput,
        S3BatchResult,
        describe_validation_error,
    )

_M = TypeVar("_M", bound=BaseModel)

LIST_PAGE_SIZE = 500
MAX_CONCURRENCY = 1_000

# Patches: changes that alter the commands of a running job (see tests/histories/).
KEEP_REQUEUED_FILES = "keep-requeued-files"
"""Files of a failed group, put back in ``pending`` while the next page was being listed, are kept
(v0.1.0 replaced ``pending`` with the new page, dropping them)."""
REPORT_ON_ANY_CANCEL = "report-on-any-cancel"
"""A job cancelled while a short activity (listing, check, report segment) is in flight still writes
its report (v0.1.0 ended without one)."""
TUNING_STATE_FIELDS = frozenset({"files_per_run"})
"""What a job may pass as the second argument when its run did not continue from another: a tuning
knob (tests use it to force continue-as-new after a few files), nothing that says what was done."""

_SHORT_ACTIVITY = {
    "start_to_close_timeout": timedelta(minutes=5),
    "retry_policy": RetryPolicy(
        initial_interval=timedelta(seconds=1),
        maximum_interval=timedelta(seconds=30),
        maximum_attempts=12,  # about 5 minutes: rides out an S3 outage, never loops forever
        non_retryable_error_types=NON_RETRYABLE_TYPES,
    ),
}


def parse_job(raw: Any) -> S3BatchInput:
    """Validate the workflow input, turning a bad input into a clear, non-retryable failure.

    The workflow method takes ``Any`` on purpose: had it declared ``S3BatchInput``, a decoding error
    would fail the workflow *task*, which the server retries forever (the job would hang).
    """
    if isinstance(raw, S3BatchInput):
        return raw
    if raw is None:
        raise ApplicationError(
            "invalid job input: input: no input given; pass the job as JSON, e.g. "
            '{"bucket": "incoming", "output_bucket": "processed"}',
            type=INVALID_INPUT,
            non_retryable=True,
        )
    return _validated(S3BatchInput, raw, "job input", "input")


def parse_state(raw: Any, *, continued: bool) -> JobState:
    """Validate the state handed over by continue-as-new.

    Args:
        raw: The workflow's second argument.
        continued: The run continued from another (``workflow.info().continued_run_id`` is set):
            only then may the state carry progress (run number, totals, pending files, digests...).
            A job started with a forged state would skip its pre-flight check, report files it never
            processed, or pass its own books. A new job may give ``{"files_per_run": N}`` only.

    Raises:
        ApplicationError: ``InvalidInput`` naming the second argument (the job fails at once).
    """
    what = "second argument (continue-as-new state)"
    if raw is None:
        return JobState()
    if not continued:
        fields = sorted(str(name) for name in raw) if isinstance(raw, dict) else None
        if fields is None or not TUNING_STATE_FIELDS.issuperset(fields):
            given = (
                f"fields {', '.join(repr(name[:40]) for name in fields[:8])}{' ...' if len(fields) > 8 else ''}"
                if fields
                else f"a {type(raw).__name__}"
            )
            raise ApplicationError(
                f"invalid {what}: state: only a run continued from another (continue-as-new) carries a state; a "
                f"new job may pass at most {{\"files_per_run\": N}} there, got {given}. Start the job with its "
                "input as the only argument.",
                type=INVALID_INPUT,
                non_retryable=True,
            )
    return _validated(JobState, raw, what, "state")


def _validated(model: type[_M], raw: Any, what: str, root: str) -> _M:
    """``model`` from ``raw``, or a non-retryable ``InvalidInput`` failure naming each bad field."""
    try:
        return model.model_validate(raw)
    except ValidationError as err:
        raise ApplicationError(
            f"invalid {what}: {describe_validation_error(err, what=root)}",
            type=INVALID_INPUT,
            non_retryable=True,
        ) from None


@workflow.defn(name="S3BatchWorkflow")
class S3BatchWorkflow:
    @workflow.init
    def __init__(self, job: Any = None, state: Any = None) -> None:
        # The state is read here, not in run(), so an update arriving in a run's first activation
        # sees (and changes) the state carried over by continue-as-new. Both arguments default to
        # None: a missing argument must fail the workflow clearly, not its task (which would hang).
        self._state = parse_state(state, continued=workflow.info().continued_run_id is not None)
        self._job: S3BatchInput | None = None
        self._wake = 0
        """Bumped by every control update, to wake the scheduling loop."""
        self._cancelling = False
        self._indexed: tuple[str, int, int] | None = None
        """Search attribute values last upserted (status, files done, files failed)."""
        self._checked_source: tuple[bool, str | None] | None = None
        """This run's check result about ``S3BatchSource``: whether it said, and the value it gave
        (None: leave it out). None when no check ran in this run."""
        self._in_flight: dict[str, ObjectRef] = {}
        self._results: list[FileResult] = []
        self._finished = 0
        self._active = 0
        """File activities running (a group of small files is one)."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._fatal: ApplicationError | None = None
        """An accounting error found by a file task, raised by the scheduling loop."""

    @workflow.run
    async def run(self, job: Any = None, state: Any = None) -> S3BatchResult:
        """Process every object under ``bucket/prefix``.

        Args:
            job: The job, as an :class:`S3BatchInput` or its JSON.
            state: Set by continue-as-new only.
        """
        spec = parse_job(job)
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
                S3Activities.check_job, JobSpec.of(spec), **_SHORT_ACTIVITY
            )
            st.indexed = check.search_attributes or workflow.info().typed_search_attributes.get(sa.SOURCE) is not None
            self._checked_source = _source_of(check)
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
                group = self._next_group(max(1, st.files_per_run - started_this_run))
                for obj in group:
                    self._in_flight[obj.key] = obj
                started_this_run += len(group)
                self._active += 1
                task = asyncio.create_task(self._process(group))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            if not self._active and not st.paused:
                break
            self._update_details()  # files just started count as in flight
            finished, wake = self._finished, self._wake
            await workflow.wait_condition(
                lambda finished=finished, wake=wake: self._finished != finished or self._wake != wake
            )
            if self._fatal is not None:
                raise self._fatal

        self._check_books()
        if st.pending or not st.listing_done:
            await self._continue_as_new()
        return await self._finish()

    def _limit(self) -> int:
        """Files in flight allowed now: the last ``set_concurrency``, else the job's own setting."""
        spec = self._job
        return self._state.max_concurrent_files or (spec.max_concurrent_files if spec else 1)

    async def _cancel(self, spec: S3BatchInput) -> None:
        """Graceful cancellation: stop the files in flight at a chunk boundary and write the report."""
        self._cancelling = True
        self._update_details()
        for task in list(self._tasks):
            # The activities use WAIT_CANCELLATION_COMPLETED: each task ends once its activity
            # has stopped after its last checkpoint (or finished anyway).
            task.cancel()
        await workflow.wait_condition(lambda: not self._active)
        # Files that never started are in the report too (a redrive of this job picks them up), and
        # the listing's position: a redrive lists on after the last key this job saw.
        for obj in self._state.pending:
            self._record(FileResult.not_started(obj.key, obj.etag))
        self._state.pending = []
        workflow.logger.info(
            "job cancelled: %d file(s) stopped in flight, %d not started",
            self._state.totals.files_cancelled,
            self._state.totals.files_not_started,
        )
        self._check_books()
        await self._write_report(spec, "cancelled")
        self._update_details(final="cancelled")
        await workflow.wait_condition(workflow.all_handlers_finished)

    async def _list_next_page(self) -> None:
        st = self._state
        spec = self._job
        page = await workflow.execute_activity_method(
            S3Activities.list_objects,
            ListObjectsInput(
                bucket=spec.bucket,
                prefix=spec.prefix,
                continuation_token=st.continuation_token,
                page_size=LIST_PAGE_SIZE,
                report=spec.only_failed_of,
            ),
            **_SHORT_ACTIVITY,
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

    def _next_group(self, limit: int) -> list[ObjectRef]:
        """Pop the next object, with the small objects that follow it when it is small itself (at
        most ``limit`` objects in all)."""
        st = self._state
        spec = self._job

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

    def _file_input(self, obj: ObjectRef) -> ProcessFileInput:
        spec = self._job
        return ProcessFileInput(
            job_id=workflow.info().workflow_id,
            bucket=spec.bucket,
            obj=obj,
            output_bucket=spec.output_bucket,
            output_prefix=spec.output_prefix,
            format=spec.format,
            handler=spec.handler,
            chunk_records=spec.chunk_records,
            max_record_bytes=spec.max_record_bytes,
        )

    async def _process(self, group: list[ObjectRef]) -> None:
        spec = self._job
        options: dict[str, Any] = {
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
        results: list[FileResult] = []
        handle: workflow.ActivityHandle[Any]
        if len(group) == 1:
            handle = workflow.start_activity_method(
                S3Activities.process_file, self._file_input(group[0]), summary=group[0].key, **options
            )
        else:
            handle = workflow.start_activity_method(
                S3Activities.process_group,
                ProcessGroupInput(file=self._file_input(group[0]), more=group[1:]),
                summary=f"{group[0].key} and {len(group) - 1} more small files",
                **options,
            )
        try:
            outcome = await handle
            results = outcome if isinstance(outcome, list) else [outcome]
        except asyncio.CancelledError:
            # Only the job's cancellation cancels this task; the activity has already stopped. When
            # it completed in the very activation that cancelled it, the SDK still raises: its
            # result (the files it finished) is then taken from the handle.
            results = _completed_anyway(handle) or [_cancelled_result(obj) for obj in group]
        except ActivityError as err:
            if self._cancelling and is_cancelled_exception(err):
                results = [_cancelled_result(obj) for obj in group]
            elif len(group) == 1:
                results = [_failed_result(group[0], err, spec.max_attempts)]
            else:
                # Give each file of the failed group its own activity (and its own retries), so one
                # bad file cannot fail its neighbours.
                workflow.logger.warning("group of %d files failed (%s); retrying them one by one", len(group), err)
                self._state.pending[0:0] = group
                self._state.solo.extend(obj.key for obj in group)
        try:
            self._record_group(group, results)
        except ApplicationError as err:
            # An exception in this task would be lost: the scheduling loop raises it.
            self._fatal = err
        finally:
            for obj in group:
                del self._in_flight[obj.key]
            self._active -= 1
            self._finished += 1
            self._update_details()

    def _record_group(self, group: list[ObjectRef], results: list[FileResult]) -> None:
        """Record the results of one activity: exactly one per file of its group (none when the
        group failed and its files were put back to run alone)."""
        spec = self._job
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
                workflow.logger.warning("file s3://%s/%s failed: %s", spec.bucket, result.key, result.error)
            self._record(result)
        if results and keys:
            raise ApplicationError(
                f"accounting error: no result for {len(keys)} of the {len(group)} file(s) of a group "
                f"(e.g. {min(keys)!r})",
                type=ACCOUNTING_ERROR,
                non_retryable=True,
            )

    def _record(self, result: FileResult) -> None:
        totals = self._state.totals
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
        if self._state.done_digest is not None:
            self._state.done_digest = combine(self._state.done_digest, key_digest([result.key]))
        self._results.append(result)

    def _check_books(self) -> None:
        """Fail the job loudly when its counts or key digests do not add up (a lost or doubled file).

        files listed = succeeded + failed + cancelled + not started + pending + in flight, and the
        digest of the listed keys = that of the recorded results' keys + the pending and in-flight ones.
        """
        st = self._state
        t = st.totals
        accounted = (
            t.files_succeeded
            + t.files_failed
            + t.files_cancelled
            + t.files_not_started
            + len(st.pending)
            + len(self._in_flight)
        )
        problems = []
        if accounted != t.files_listed:
            problems.append(
                f"{t.files_listed} files listed, but {t.files_succeeded} succeeded + {t.files_failed} failed + "
                f"{t.files_cancelled} cancelled + {t.files_not_started} not started + {len(st.pending)} pending + "
                f"{len(self._in_flight)} in flight = {accounted}"
            )
        if st.listed_digest is not None and st.done_digest is not None:
            open_keys = key_digest([*(obj.key for obj in st.pending), *self._in_flight])
            if combine(st.done_digest, open_keys) != st.listed_digest:
                problems.append("the keys of the recorded results are not the keys listed (a file lost or repeated)")
        if problems:
            raise ApplicationError(
                f"accounting error in run {st.run} of the job: {'; '.join(problems)}. This is a bug in s3batch: "
                "please report it with the workflow history; no result of this job should be trusted.",
                type=ACCOUNTING_ERROR,
                non_retryable=True,
            )

    async def _continue_as_new(self) -> None:
        st = self._state
        spec = self._job
        if self._results:
            await workflow.execute_activity_method(
                S3Activities.write_report_segment,
                ReportSegmentInput(
                    output_bucket=spec.output_bucket,
                    output_prefix=spec.output_prefix,
                    segment=st.report_segments,
                    files=self._results,
                ),
                **_SHORT_ACTIVITY,
            )
            st.report_segments += 1
        st.run += 1
        await workflow.wait_condition(workflow.all_handlers_finished)
        # Only the fields the user gave: a worker of an older version, which knows no field added
        # since, can still read the job.
        workflow.continue_as_new(args=[spec.model_dump(mode="json", exclude_unset=True), st.model_dump(mode="json")])

    async def _write_report(self, spec: S3BatchInput, status: JobStatus) -> str:
        st = self._state
        try:
            return await workflow.execute_activity_method(
                S3Activities.write_report,
                FinalReportInput(
                    job_id=workflow.info().workflow_id,
                    job=JobSpec.of(spec),
                    status=status,
                    totals=st.totals,
                    segments=st.report_segments,
                    files=self._results,
                    listed_digest=st.listed_digest,
                    listing_done=st.listing_done,
                    last_listed_key=st.last_listed_key,
                    continuation_token=None if st.listing_done else st.continuation_token,
                ),
                **_SHORT_ACTIVITY,
            )
        except ActivityError as err:
            # The report was written but does not hold every listed key exactly once: the job fails
            # with the report's own error, not as a generic activity failure.
            cause = err.cause
            if isinstance(cause, ApplicationError) and cause.type == ACCOUNTING_ERROR:
                raise ApplicationError(cause.message, type=ACCOUNTING_ERROR, non_retryable=True) from None
            raise

    async def _finish(self) -> S3BatchResult:
        st = self._state
        spec = self._job
        assert spec is not None
        failed = st.totals.files_failed > spec.max_failed_files
        status: JobStatus = "failed" if failed else "succeeded"
        key = await self._write_report(spec, status)
        self._update_details(final=status)
        await workflow.wait_condition(workflow.all_handlers_finished)
        if failed:
            raise ApplicationError(
                f"{st.totals.files_failed} of {st.totals.files_listed} files failed (max_failed_files="
                f"{spec.max_failed_files}); every other file was processed. The report at "
                f"s3://{spec.output_bucket}/{key} lists each failed file with its error.",
                type="JobFailed",
                non_retryable=True,
            )
        return S3BatchResult(status="succeeded", totals=st.totals, report_bucket=spec.output_bucket, report_key=key)

    @workflow.query
    def progress(self) -> Progress:
        """Counters of the whole job (all runs so far) and the files in flight."""
        t = self._state.totals
        return Progress(
            files_listed=t.files_listed,
            files_succeeded=t.files_succeeded,
            files_failed=t.files_failed,
            files_in_flight=len(self._in_flight),
            records=t.records,
            records_written=t.records_written,
            rejected=t.rejected,
            bytes_read=t.bytes_read,
            listing_done=self._state.listing_done,
            run=self._state.run,
            in_flight=sorted(self._in_flight),
            paused=self._state.paused,
            max_concurrent_files=self._limit(),
            cancelling=self._cancelling,
            files_cancelled=t.files_cancelled,
        )

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

    def _upsert_search_attributes(self, final: str | None) -> None:
        # Only once the attributes are known to exist (the worker registered them, or the run was
        # started with S3BatchSource): upserting unregistered ones would fail the workflow task
        # and hang the job.
        if not self._state.indexed:
            return
        t = self._state.totals
        if final:
            status = final
        elif self._cancelling:
            status = "cancelling"
        else:
            status = "paused" if self._state.paused else "processing"
        values = (status, t.files_succeeded + t.files_failed, t.files_failed)
        if values == self._indexed:
            return
        updates = [
            sa.STATUS.value_set(status),
            sa.FILES_DONE.value_set(values[1]),
            sa.FILES_FAILED.value_set(values[2]),
        ]
        if self._indexed is None and workflow.info().typed_search_attributes.get(sa.SOURCE) is None:
            source = self._source_attribute()
            if source is not None:
                updates.append(sa.SOURCE.value_set(source))
        self._indexed = values
        workflow.upsert_search_attributes(updates)

    def _source_attribute(self) -> str | None:
        """The ``S3BatchSource`` to upsert for a run started without one, or None to leave it out.

        The workflow cannot know whether payloads are encrypted (the codec runs outside its sandbox),
        so the value comes from the worker's check: an HMAC when the worker has a key. Only the run
        that ran the check upserts it; later runs inherit it through continue-as-new.

        No patch guards this: an upsert is the same command whatever attributes and values it
        carries, and replaying the v0.1.0 histories with other values (or without S3BatchSource in
        the upsert) passes (tests/test_replay.py).
        """
        if self._checked_source is None:
            return None
        said, value = self._checked_source
        if said:
            return value
        # The check ran on a worker whose activities do not report the value (an earlier release):
        # plain, as that release does. docs/SECURITY.md says to upgrade every worker.
        return sa.source_value(self._job.bucket, self._job.prefix)

    def _update_details(self, final: str | None = None) -> None:
        t = self._state.totals
        spec = getattr(self, "_job", None)
        head = f"s3://{spec.bucket}/{spec.prefix} -> s3://{spec.output_bucket}/{spec.output_prefix}" if spec else ""
        self._upsert_search_attributes(final)
        if final:
            state = final
        elif self._cancelling:
            state = "cancelling"
        elif self._state.paused:
            state = "paused (files in flight finish)"
        else:
            state = "listing" if not self._state.listing_done else "processing"
        workflow.set_current_details(
            f"**{state}** {head}\n\n"
            f"files: {t.files_succeeded + t.files_failed} done of {t.files_listed} listed"
            f"{'' if self._state.listing_done else '+'}, {t.files_failed} failed, "
            f"{len(self._in_flight)} in flight (max {self._limit()})"
            f"{f', {t.files_cancelled} cancelled' if t.files_cancelled else ''}\n\n"
            f"records: {t.records_written} written, {t.rejected} rejected; {t.bytes_read} bytes read"
            + (
                f"\n\nreport: s3://{spec.output_bucket}/{layout.report_key(spec.output_prefix)}"
                if final and spec
                else ""
            )
        )


def _source_of(check: Any) -> tuple[bool, str | None]:
    """``(said, value)`` about ``S3BatchSource`` in a check result: ``said`` is False when the result
    has no ``source`` at all (activities of an earlier release), whether declared or an extra field."""
    extra = getattr(check, "model_extra", None) or {}
    fields = getattr(check, "model_fields_set", set())
    if "source" not in fields and "source" not in extra:
        return False, None
    value = getattr(check, "source", None)
    return True, value if isinstance(value, str) and value else None


def _completed_anyway(handle: workflow.ActivityHandle[Any]) -> list[FileResult] | None:
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


def _cancelled_result(obj: ObjectRef) -> FileResult:
    return FileResult(
        key=obj.key,
        etag=obj.etag,
        status="cancelled",
        error="job cancelled: stopped at a chunk boundary after its last checkpoint",
    )


def _failed_result(obj: ObjectRef, err: ActivityError, max_attempts: int) -> FileResult:
    cause = err.cause
    attempts = max_attempts if err.retry_state == RetryState.MAXIMUM_ATTEMPTS_REACHED else 1
    if isinstance(cause, ApplicationError):
        if cause.details and isinstance(cause.details[0], dict) and "attempt" in cause.details[0]:
            attempts = int(cause.details[0]["attempt"])
        message = f"{cause.type or 'Error'}: {cause.message}"
    else:
        message = f"{type(cause).__name__}: {cause}" if cause else str(err)
    return FileResult(key=obj.key, etag=obj.etag, status="failed", attempts=attempts, error=message)

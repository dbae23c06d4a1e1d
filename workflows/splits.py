"""Byte-range splits of one big file, the workflow's side: how many, their nominal ranges, and one
report entry from their results.

A pending file larger than the job's ``split_bytes`` (an uncompressed CSV or JSON Lines file written to
S3 parts, in UTF-8) is cut, from its listed size alone, into ``ceil(size / split_bytes)`` nominal ranges,
at most one per free slot and at most :data:`~s3batch.layout.MAX_SPLITS`. Each is a ``process_file``
activity of its own (its own retries, heartbeats and checkpoint), moved to record boundaries by the
activity (:mod:`s3batch.activities.splits`). The file takes one slot per split while they run; its report
entry adds their counts up and says ``splits``.

Pure functions, but for :func:`run_splits` (which starts the splits, waits for them and may cancel them) and
:func:`merged` (which may ask ``workflow.patched``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Callable, Sequence
from typing import NamedTuple

from temporalio import workflow
from temporalio.exceptions import ActivityError, RetryState, is_cancelled_exception

with workflow.unsafe.imports_passed_through():
    from s3batch.workflows.books import (
        UNCHECKED,
        Books,
        cancelled_result,
        completed_anyway,
        retry_cut,
        stop_cut,
        void_split,
    )
    from s3batch.workflows.patches import FAIL_ALL_REJECTED
    from s3batch.workflows.schedule import start_split_activity

    from s3batch import layout
    from s3batch.errors import SPLIT_BOUNDARY, UnknownFormatError
    from s3batch.formats.keys import resolve_format
    from s3batch.messages import FileResult, JobState, ObjectRef, ReasonCount, SplitRange
    from s3batch.models import S3BatchInput
    from s3batch.rejects import (
        ALL_REJECTED,
        FileLimits,
        all_rejected,
        all_rejected_advice,
        crossed,
        describe_reasons,
        merge,
        ratio,
        warnings_of,
    )

_UTF8 = (None, "utf-8", "utf8", "utf_8")


class Ended(NamedTuple):
    """How a file's splits ended (:func:`run_splits`)."""

    results: list[FileResult]
    """Their results (a split stopped without one: cancelled, nothing committed)."""
    error: ActivityError | None
    """The failure of the first split that failed, if one did."""
    checked: bool
    """Every boundary between them was checked: each split but the last reached its end, where it finds whether
    the next one began at a record (else it may have begun inside a quoted record, and read a fragment of it)."""


def split_count(spec: S3BatchInput, st: JobState, obj: ObjectRef, free: int) -> int:
    """How many splits ``obj`` is processed in (1: whole), with ``free`` slots to run them in; a file an
    earlier run handed over in splits runs in the same ones."""
    if obj.key in (st.whole or ()):
        return 1
    if st.split_counts and obj.key in st.split_counts:
        return st.split_counts[obj.key]
    limit = spec.split_bytes
    if limit is None or obj.size <= limit or free < 2:
        return 1
    if spec.sink is not None and spec.sink.type != "s3":
        return 1  # a table: one checkpoint row per file
    if spec.rejected_of is not None:
        return 1  # a redrive of rejected records reads each file whole, taking its rejected lines (a job since it)
    if spec.encoding not in _UTF8:
        return 1  # the boundaries are found as line feed bytes
    try:
        fmt, compression = resolve_format(obj.key, spec.format)
    except UnknownFormatError:
        return 1  # the activity says what is wrong
    if compression is not None or fmt not in ("csv", "jsonl"):
        return 1
    return max(1, min(-(-obj.size // limit), free, layout.MAX_SPLITS))


def split_ranges(obj: ObjectRef, count: int) -> list[SplitRange]:
    """The ``count`` nominal byte ranges of ``obj``, of equal size, covering it."""
    cuts = [obj.size * i // count for i in range(count + 1)]
    return [SplitRange(index=i, count=count, start=cuts[i], end=cuts[i + 1]) for i in range(count)]


def merged(spec: S3BatchInput, obj: ObjectRef, results: list[FileResult]) -> FileResult:
    """One report entry for a file from the results of its splits, one each (all succeeded or cancelled:
    a failed split fails the file before this). Over a file limit on rejects when added up, or every record
    rejected under no limit (the ``fail-all-rejected`` patch): ``failed``. Run in the workflow."""
    records = sum(r.records for r in results)
    rejected = sum(r.rejected for r in results)
    tally: Counter[str] = Counter()
    for r in results:
        for reason in r.reject_reasons or []:
            tally[reason.reason] += reason.count
    ranked = merge([], tally)  # the most common reasons, as a file's checkpoint keeps them
    warnings = warnings_of(rejected, records, ranked, None)
    for r in results:  # a delimiter hint (found by the first split)
        warnings += [w for w in r.warnings or [] if "of its records were rejected" not in w and w not in warnings]
    status = "cancelled" if any(r.status == "cancelled" for r in results) else "succeeded"
    # A file found done is one whose every split was (an earlier job wrote it whole: ``already_written``, 0 written).
    # When only some were (a redrive of a cancelled job: some splits ended there, the others resume from their
    # checkpoints with their counts so far), the file's written records are all of them, as for a file resumed
    # whole (before: 38,416 written and 5,458 already written for a file of 43,874, found by the soak).
    found_done = all(r.already_written is not None for r in results)
    written = sum(r.records_written + (0 if found_done else r.already_written or 0) for r in results)
    result = FileResult(
        key=obj.key,
        etag=obj.etag,
        status=status,
        records=records,
        records_written=written,
        rejected=rejected,
        dropped=sum(r.dropped for r in results),
        bytes_read=sum(r.bytes_read for r in results),
        chunks=sum(r.chunks for r in results),
        attempts=max(r.attempts for r in results),
        resumed_from_record=sum(r.resumed_from_record for r in results),
        error=next((r.error for r in results if r.status == "cancelled"), None),
        reject_ratio=ratio(rejected, records) if rejected else None,
        reject_reasons=[ReasonCount(reason=k, count=v) for k, v in ranked] if rejected else None,
        warnings=warnings or None,
        splits=len(results),
        already_written=(sum(r.already_written or 0 for r in results) or None) if found_done else None,
        version_id=next((r.version_id for r in results if r.version_id), None),
    )
    limits = FileLimits(max_rejected_records=spec.max_rejected_records, max_rejected_ratio=spec.max_rejected_ratio)
    done = status == "succeeded"
    over = crossed(limits, rejected, records, done=done)
    # Only where it changes the outcome: the histories of jobs started before it have no marker there.
    if over is None and done and all_rejected(limits, rejected, records) and workflow.patched(FAIL_ALL_REJECTED):
        over = ALL_REJECTED
    if over is None:
        return result
    where = f"s3://{spec.bucket if obj.bucket is None else obj.bucket}/{obj.key}"
    output = f"s3://{spec.output_bucket}/{layout.file_dir(spec.output_prefix, obj.key)}"
    reasons = describe_reasons(ranked, rejected)
    if over == ALL_REJECTED:
        error = (
            f"TooManyRejects: {where}: all {records} records read by its {len(results)} splits were rejected, and "
            "no reject limit allows that (a file whose every record is rejected fails unless the job sets one); "
            f"most common reasons: {reasons}. {all_rejected_advice(output, workflow.info().workflow_id)}"
        )
    else:
        error = (
            f"TooManyRejects: {where}: {rejected} of the {records} records read by its {len(results)} splits were "
            f"rejected ({ratio(rejected, records):.1%}), over {over}; most common reasons: {reasons}. Its parts and "
            f"rejects under {output} are kept. The rejects files give each rejected line and its full reason."
        )
    return result.model_copy(update={"status": "failed", "error": error})


async def run_splits(spec: S3BatchInput, obj: ObjectRef, count: int, ending: Callable[[], bool]) -> Ended:
    """Start the ``count`` splits of ``obj`` and wait for them all; on the first that fails (or a cancel of
    the job: ``ending``), stop the others at their next chunk boundary. Returns how they ended."""
    handles = [start_split_activity(spec, obj, r) for r in split_ranges(obj, count)]
    with contextlib.suppress(asyncio.CancelledError):  # the job is being cancelled or stopped: see below
        await workflow.wait(handles, return_when=asyncio.FIRST_EXCEPTION)
    if not all(h.done() for h in handles):
        for h in handles:
            h.cancel()
    while not all(h.done() for h in handles):
        # Each split stops at its next chunk boundary (WAIT_CANCELLATION_COMPLETED); a cancel of the job
        # arriving meanwhile (a split failed first) changes nothing: they are stopping already.
        with contextlib.suppress(asyncio.CancelledError):
            await workflow.wait(handles)
    results: list[FileResult] = []
    error: ActivityError | None = None
    reached_end: list[bool] = []
    cause = _failed_alone(handles)
    for h in handles:
        if h.cancelled():
            anyway = completed_anyway(h)
            results += anyway or [cancelled_result(obj)]
            reached_end.append(bool(anyway) and all(r.status == "succeeded" for r in anyway or ()))
            continue
        exc = h.exception()
        reached_end.append(exc is None and h.result().status == "succeeded")
        if exc is None:
            results.append(h.result())
        elif not isinstance(exc, ActivityError):
            raise exc
        elif is_cancelled_exception(exc) and (ending() or cause is not None or error is not None):
            results.append(cancelled_result(obj))  # stopped by the job's cancel, or by a sibling's failure
        elif ending() and stop_cut(exc):
            results.append(cancelled_result(obj))  # its attempt failed or timed out after the cancel: stopped
        else:
            error = error or exc
    return Ended(results, cause or error, all(reached_end[:-1]))


def _failed_alone(handles: Sequence[workflow.ActivityHandle[FileResult]]) -> ActivityError | None:
    """The failure of the first split that failed on its own (not asked to stop), whichever its place (before: the
    first failure in order, which could be that of a sibling it stopped, recorded as the file's)."""
    for h in handles:
        exc = None if h.cancelled() else h.exception()
        if not isinstance(exc, ActivityError) or is_cancelled_exception(exc):
            continue
        if exc.retry_state != RetryState.CANCEL_REQUESTED:
            return exc
    return None


def cannot_split(error: ActivityError) -> bool:
    """Whether a split failed because the file cannot be split where it began (``SplitBoundary``)."""
    details: Sequence[object] = getattr(error.cause, "details", None) or ()
    return bool(details) and isinstance(details[0], dict) and details[0].get(SPLIT_BOUNDARY) is True


def split_outcome(
    books: Books, spec: S3BatchInput, obj: ObjectRef, ended: Ended, *, stopped: bool, handing_over: bool = False
) -> list[FileResult] | None:
    """The result to record for a file whose splits ended (``ended``: :func:`run_splits`'s; ``stopped`` and
    ``handing_over`` as ``Books.failed`` takes them); None when it could not be split and was put back to be
    processed whole (:func:`process_whole`).

    A CSV file recorded ``cancelled`` or ``failed`` whose boundaries were not all checked (``ended.checked``: its
    splits stopped early) is ``split_void``: one of them may have begun inside a quoted record and read a fragment
    of it, so what they wrote is removed with the report and a redrive processes the file from its start (before:
    a fragment of a record among its rejects; found by the soak, seed 60512). A file handed over is not (the next
    run resumes its splits, which check their boundaries as they reach them), nor one in JSON Lines (a line feed
    always ends a record)."""
    results, error, checked = ended
    trusted = checked or handing_over or resolve_format(obj.key, spec.format)[0] != "csv"
    if error is not None and handing_over and retry_cut(error):
        results, error = [*results, cancelled_result(obj)], None  # a retry the hand-over cut short: stopped too
    if error is None:
        result = merged(spec, obj, results)
        unsure = result.status != "succeeded" and not trusted
        return [void_split(result, UNCHECKED) if unsure else result]
    if cannot_split(error) and (handing_over or not stopped):  # a hand-over: the next run processes it whole
        process_whole(books.state, obj)
        return None
    if cannot_split(error):
        # Stopped (a cancel, max_rejected_total) before it could run whole: not a failure of the file. What its
        # splits wrote is void (one began inside a record), removed with the report (before: ``failed``, its
        # splits' output counted, a record read two ways among it; found by the soak, seed 67).
        return [void_split(cancelled_result(obj))]
    outcome = books.failed([obj], error, spec.max_attempts, stopped=stopped, handing_over=handing_over)
    return outcome if trusted else [void_split(r, UNCHECKED) for r in outcome]


def process_whole(st: JobState, obj: ObjectRef) -> None:
    """Put ``obj``, which could not be split, back at the front of the pending files, to run whole."""
    workflow.logger.warning("%s cannot be split (a quoted line break at a split boundary): processed whole", obj.key)
    st.whole = [*(st.whole or []), obj.key]
    if st.split_counts and obj.key in st.split_counts:  # handed over in splits before: whole from now on
        del st.split_counts[obj.key]
        st.split_counts = st.split_counts or None
    st.pending.insert(0, obj)

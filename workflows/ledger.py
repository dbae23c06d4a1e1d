"""An incremental job's ledger steps (see ``s3batch.incremental``): its listing pages, cut by the ledger,
and the ledger's advance after the report. Each issues one activity, as the workflow's control flow
(:mod:`~s3batch.workflows.batch`) asks."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from s3batch.activities.s3_activities import S3Activities
    from s3batch.workflows.schedule import listing_input, short_activity

    from s3batch.incremental import ListIncrementalInput, WriteLedgerInput, ledger_uri
    from s3batch.messages import JobState, ListObjectsResult
    from s3batch.models import JobStatus, S3BatchInput


async def list_page(spec: S3BatchInput, given: S3BatchInput, st: JobState, page_size: int) -> ListObjectsResult:
    """The next listing page of the job: of its incremental listing, or of its prefix (or manifest, or report)."""
    if spec.incremental is not None:
        return await list_incremental_page(spec, given, st.continuation_token, page_size)
    return await short_activity(spec, S3Activities.list_objects, listing_input(spec, st, page_size))


async def list_incremental_page(
    spec: S3BatchInput, given: S3BatchInput, continuation_token: str | None, page_size: int
) -> ListObjectsResult:
    """A page of an incremental job's listing, cut by its ledger (``given``: the job as given, whose
    output prefix holds the ledger; ``spec`` writes under its run's own)."""
    assert spec.incremental is not None
    return await short_activity(
        spec,
        S3Activities.list_incremental,
        ListIncrementalInput(
            bucket=spec.bucket,
            prefix=spec.prefix,
            continuation_token=continuation_token,
            page_size=page_size,
            selection=spec.selection() if spec.selection().active else None,
            ledger=ledger_uri(given.output_bucket, given.output_prefix, spec.incremental),
            window_seconds=spec.incremental.window_seconds,
            output_bucket=spec.output_bucket,
            output_prefix=spec.output_prefix,
            job_id=workflow.info().workflow_id,
            execution=workflow.info().first_execution_run_id,
        ),
    )


async def write_ledger(
    spec: S3BatchInput, given: S3BatchInput, status: JobStatus, report_key: str, *, listing_done: bool
) -> None:
    """After the report of an incremental job: advance its ledger over the files that succeeded (no
    command for another job)."""
    if spec.incremental is None:
        return
    await short_activity(
        spec,
        S3Activities.write_ledger,
        WriteLedgerInput(
            ledger=ledger_uri(given.output_bucket, given.output_prefix, spec.incremental),
            run_id=workflow.info().workflow_id,
            execution=workflow.info().first_execution_run_id,
            source=f"s3://{spec.bucket}/{spec.prefix}",
            window_seconds=spec.incremental.window_seconds,
            output_bucket=spec.output_bucket,
            output_prefix=spec.output_prefix,
            report_key=report_key,
            status=status,
            listing_done=listing_done,
        ),
    )

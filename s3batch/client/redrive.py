"""Redrive: a new job over the files that failed (or were cancelled, or never started) in a
finished job.

The new job has the same input, so it writes into the same output layout (a redriven file that
committed parts resumes from them), plus ``only_failed_of``. It overwrites the layout's
``_report.json`` when it ends, so the original report is first copied next to it and the new job
reads its files from that copy.
"""

from __future__ import annotations

import asyncio
import uuid

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from s3batch import layout
from s3batch.client.errors import JobIdUsed, NothingToRedrive
from s3batch.client.jobs import describe_run, status_word
from s3batch.client.reports import copy_report, find_report, job_input
from s3batch.client.views import RedrivePlan, StoredReport
from s3batch.models import S3BatchInput
from s3batch.report import ReportFile


def _files_to_redrive(wid: str, job: S3BatchInput, stored: StoredReport) -> tuple[list[ReportFile], bool]:
    """The report's files to process again, and whether the job left part of its listing undone.

    Raises:
        NothingToRedrive: The report is another job's, or lists nothing to process again.
    """
    owner = stored.report.job_id
    if owner != wid:
        raise NothingToRedrive(
            f"the report at {stored.uri} belongs to job {owner!r}, not to {wid!r}: a later job wrote into the "
            f"same output layout (a redrive does). Redrive that one instead: `s3batch redrive {owner}`"
        )
    files = stored.report.redrive_files(job.prefix)
    # A job cancelled before its listing ended also left the rest of its listing undone.
    unlisted = not stored.report.listing.done
    if not files and not unlisted:
        raise NothingToRedrive(
            f"job {wid!r} has no failed or cancelled files in its report {stored.uri}: nothing to redrive"
        )
    return files, unlisted


async def check_new_id(client: Client, new_id: str) -> None:
    """Raises JobIdUsed when ``new_id`` already ran and finished (checked before copying: the copy
    must not replace the report that job redrove)."""
    try:
        existing = await client.get_workflow_handle(new_id).describe()
    except RPCError as err:
        if err.status != RPCStatusCode.NOT_FOUND:
            raise
    else:
        if existing.status != WorkflowExecutionStatus.RUNNING:
            raise JobIdUsed(
                f"job {new_id!r} already ran and is finished; an ID is never reused, so nothing was started", new_id
            )


async def prepare_redrive(
    client: Client, workflow_id: str, new_id: str | None = None, task_queue: str | None = None
) -> RedrivePlan:
    """Check that ``workflow_id`` has files to redrive, copy its report next to it, and return the
    new job to start (:func:`s3batch.client.start` with the plan's ``job``, ``workflow_id`` and
    ``task_queue``).

    Args:
        new_id: ID of the new job (default: ``ID-redrive-<random>``).
        task_queue: Default: the finished job's.

    Raises:
        JobNotFound: No job has this ID.
        NothingToRedrive: The job is still running, has no report, or nothing in it to redrive, or it took its
            files from a manifest (a redrive lists a prefix).
        JobIdUsed: ``new_id`` already ran and finished.
    """
    wid = workflow_id
    _, desc = await describe_run(client, wid)
    status = status_word(desc.status)
    if desc.status == WorkflowExecutionStatus.RUNNING:
        raise NothingToRedrive(
            f"job {wid!r} is still running: a redrive takes the failed files from the report written when "
            f"a job ends. Wait for it (`s3batch watch {wid}`) or cancel it (`s3batch cancel {wid}`) first; "
            "nothing was started."
        )
    job = await job_input(client, wid)
    if job.manifest is not None:
        raise NothingToRedrive(
            f"job {wid!r} took its files from the manifest {job.manifest}, and a redrive lists a prefix: it cannot "
            "redrive them. Start a job over a manifest of the files its report lists as failed, cancelled or not "
            f"started (`s3batch report {wid} --json`); nothing was started."
        )
    stored = await find_report(job)
    if stored is None:
        uri = f"s3://{job.output_bucket}/{layout.report_key(job.output_prefix)}"
        raise NothingToRedrive(
            f"job {wid!r} ended ({status}) without a report at {uri}, so no file failed in it: nothing to "
            f"redrive (`s3batch status {wid}` says how it ended; start it again to rerun it)"
        )
    files, unlisted = _files_to_redrive(wid, job, stored)
    new_id = new_id or f"{wid}-redrive-{uuid.uuid4().hex[:8]}"
    await check_new_id(client, new_id)
    copy_key = layout.report_copy_key(job.output_prefix, new_id)
    copy_uri = f"s3://{job.output_bucket}/{copy_key}"
    await asyncio.to_thread(copy_report, stored, copy_key)
    return RedrivePlan(
        of=wid,
        workflow_id=new_id,
        job=S3BatchInput.model_validate({**job.model_dump(), "only_failed_of": copy_uri}),
        task_queue=task_queue or desc.task_queue,
        files=files,
        unlisted=unlisted,
        report=stored.uri,
        original_report=copy_uri,
    )

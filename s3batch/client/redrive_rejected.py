"""Redrive of rejected records: a new job over exactly the records a finished job's files rejected, once their
cause is fixed (``s3batch redrive --rejected JOB``; the job option ``rejected_of``).

The new job has the finished job's input with ``rejected_of`` (that job's report, where its workers find the
files with rejects; each file's rejected lines they read from that job's rejects files) and an output prefix of
its own: ``{that job's output prefix}_rejected/`` by default, the same for every run of the same redrive, so a
second run finds what the first wrote and writes nothing; never the finished job's own (whose rejects and report
it reads). Into a table, the rows go beside the rows accepted before (the redrive's checkpoints are its own). What
it still rejects is in its own rejects files: the same command on its ID redrives those.
"""

from __future__ import annotations

import uuid

from temporalio.client import Client, WorkflowExecutionStatus

from s3batch import layout
from s3batch.client.errors import NothingToRedrive
from s3batch.client.jobs import describe_run
from s3batch.client.redrive import check_new_id
from s3batch.client.reports import find_report, job_input
from s3batch.client.views import RedrivePlan, StoredReport
from s3batch.incremental import run_output_prefix
from s3batch.models import S3BatchInput
from s3batch.report import ReportFile

REJECTED_FOLDER = "_rejected/"
"""Where a redrive of rejected records writes by default, under the output prefix of the job it redrives."""


async def prepare_rejected_redrive(
    client: Client,
    workflow_id: str,
    new_id: str | None = None,
    task_queue: str | None = None,
    output_prefix: str | None = None,
) -> RedrivePlan:
    """Check that the finished job ``workflow_id`` rejected records, and return the new job that redrives them
    (:func:`s3batch.client.start` with the plan's ``job``, ``workflow_id`` and ``task_queue``).

    Args:
        new_id: ID of the new job (default: ``ID-rejected-<random>``).
        task_queue: Default: the finished job's.
        output_prefix: The new job's (default: ``_rejected/`` under the finished job's output prefix).

    Raises:
        JobNotFound: No job has this ID.
        NothingToRedrive: The job is still running, has no report of its own, or rejected no record.
        JobIdUsed: ``new_id`` already ran and finished.
    """
    wid = workflow_id
    _, desc = await describe_run(client, wid)
    if desc.status == WorkflowExecutionStatus.RUNNING:
        raise NothingToRedrive(
            f"job {wid!r} is still running: a redrive of its rejected records reads the report written when it "
            f"ends. Wait for it (`s3batch watch {wid}`); nothing was started."
        )
    job = await job_input(client, wid)
    if job.manifest is not None:
        raise NothingToRedrive(f"job {wid!r} read a manifest: its rejected records cannot be redriven (not yet)")
    prefix = run_output_prefix(job.output_prefix, wid) if job.incremental is not None else job.output_prefix
    stored = await find_report(job.model_copy(update={"output_prefix": prefix}))
    files = _files_with_rejects(wid, job, prefix, stored)
    assert stored is not None
    new_id = new_id or f"{wid}-rejected-{uuid.uuid4().hex[:8]}"
    await check_new_id(client, new_id)
    # Its files were processed (and archived, deleted or tagged) by that job: after_success is not done twice.
    given = job.model_dump(exclude={"only_failed_of", "incremental", "overwrite_output", "after_success"})
    new_prefix = prefix + REJECTED_FOLDER if output_prefix is None else output_prefix
    redrive = S3BatchInput.model_validate({**given, "rejected_of": stored.uri, "output_prefix": new_prefix})
    return RedrivePlan(
        of=wid,
        workflow_id=new_id,
        job=redrive,
        task_queue=task_queue or desc.task_queue,
        files=files,
        unlisted=False,
        report=f"s3://{redrive.output_bucket}/{layout.report_key(new_prefix)}",
        original_report=stored.uri,
        rejected=sum(f.rejected for f in files),
    )


def _files_with_rejects(wid: str, job: S3BatchInput, prefix: str, stored: StoredReport | None) -> list[ReportFile]:
    """The report's files with rejected records.

    Raises:
        NothingToRedrive: There is no report of ``wid``'s, or it lists no rejected record.
    """
    uri = f"s3://{job.output_bucket}/{layout.report_key(prefix)}"
    if stored is None:
        raise NothingToRedrive(f"job {wid!r} ended without a report at {uri}: nothing to redrive")
    owner = stored.report.job_id
    if owner != wid:
        raise NothingToRedrive(
            f"the report at {uri} belongs to job {owner!r}, not to {wid!r}: a later job wrote into the same output "
            f"(a redrive does). Redrive that one's rejected records instead: `s3batch redrive --rejected {owner}`"
        )
    files = stored.report.redrive_files(job.prefix, rejected=True)
    if not files:
        raise NothingToRedrive(f"job {wid!r} rejected no record (its report {uri}): nothing to redrive")
    return files

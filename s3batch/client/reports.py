"""A job's input and its report on S3.

The S3 client (boto3) and :mod:`s3batch.report_store` are imported by the functions that read or copy a report,
not with this module: they cost about a quarter of a second to import, and most commands read no report
(``s3batch status`` of a running or succeeded job, ``list``, ``pause``...).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from temporalio.client import Client

from s3batch import layout
from s3batch.client.errors import ClientError, ReportNotFound
from s3batch.client.jobs import describe_run
from s3batch.client.views import StoredReport
from s3batch.errors import S3BatchError
from s3batch.models import S3BatchInput

if TYPE_CHECKING:
    from s3batch.s3io import S3Client


async def job_input(client: Client, workflow_id: str) -> S3BatchInput:
    """The job's input, from the start event of its first run (every run has the same job).

    Raises:
        JobNotFound: No job has this ID.
    """
    _, desc = await describe_run(client, workflow_id)
    first_run = desc.raw_description.workflow_execution_info.first_run_id or desc.run_id
    async for event in client.get_workflow_handle(workflow_id, run_id=first_run).fetch_history_events():
        if event.HasField("workflow_execution_started_event_attributes"):
            payloads = event.workflow_execution_started_event_attributes.input.payloads
            [value] = await client.data_converter.decode(payloads[:1])
            return S3BatchInput.model_validate(value)
    raise ClientError(f"the history of job {workflow_id!r} has no start event")


def _s3() -> S3Client:
    from s3batch.s3io import make_client  # see the module's docstring

    return make_client()


def _read_report(bucket: str, key: str) -> StoredReport | None:
    from s3batch.report_store import find_report  # see the module's docstring

    found = find_report(_s3(), bucket, key)
    return None if found is None else StoredReport(bucket, key, *found)


def copy_report(report: StoredReport, copy_key: str) -> None:
    """Copy ``report`` to ``copy_key`` next to it, if it is still the version read."""
    # Conditional on the ETag read: the copy is the very report whose failed files were counted.
    _s3().copy_object(
        Bucket=report.bucket,
        Key=copy_key,
        CopySource={"Bucket": report.bucket, "Key": report.key},
        CopySourceIfMatch=report.etag,
    )


async def find_report(job: S3BatchInput) -> StoredReport | None:
    """The report in ``job``'s output layout, or None before a job writing there ended.

    Raises:
        S3BatchError: S3 refused the read, or the object there is not a job report
            (see :func:`s3batch.report_store.find_report`).
    """
    return await asyncio.to_thread(_read_report, job.output_bucket, layout.report_key(job.output_prefix))


async def report(client: Client, workflow_id: str) -> StoredReport:
    """The report of a finished job, as written to S3.

    Raises:
        JobNotFound: No job has this ID.
        ReportNotFound: The job has not ended yet (the report is written when it does).
    """
    job = await job_input(client, workflow_id)
    found = await find_report(job)
    if found is None:
        raise ReportNotFound(
            f"no report at s3://{job.output_bucket}/{layout.report_key(job.output_prefix)} yet: the report is "
            f"written when the job ends (see `s3batch status {workflow_id}`)"
        )
    return found


async def ended_report(client: Client, workflow_id: str) -> StoredReport | None:
    """The report of a job that ended, for its counts in a summary (a failed job's result has none); None when
    there is none (a job refused at its start writes none) or it cannot be read now: never an error of its own."""
    try:
        return await report(client, workflow_id)
    except S3BatchError:  # ClientError included: no such job, no report, Temporal or S3 unreachable
        return None

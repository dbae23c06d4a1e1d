"""Whose output an output prefix holds: a job refuses to start over another job's output.

Two jobs writing under one output prefix replace each other's report and parts silently. Every job
records its ID on the write-check object it writes at start (``{output_prefix}_s3batch/write-check``,
metadata ``s3batch-job``); a job's report names it too (``job_id``, for jobs of releases that wrote no
such metadata). A new job whose output prefix names another job is refused with ``InvalidInput``,
unless it passes ``overwrite_output`` on purpose or is a redrive (``only_failed_of``: it finishes that
job's files in the same output). The same job's own retries and continue-as-new runs pass (same ID).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from botocore.exceptions import BotoCoreError, ClientError

from s3batch import layout
from s3batch.errors import InvalidInput
from s3batch.models import JobSpec
from s3batch.report import find_report
from s3batch.s3io import is_missing_object, raise_s3_error

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

JOB_METADATA = "s3batch-job"
"""User metadata of the write-check object: the ID of the job that wrote it."""


def output_owner(s3: S3Client, bucket: str, output_prefix: str) -> str | None:
    """The ID of the job whose output is under ``output_prefix``, or None when none is."""
    probe = layout.write_check_key(output_prefix)
    try:
        owner = s3.head_object(Bucket=bucket, Key=probe).get("Metadata", {}).get(JOB_METADATA)
        if owner:
            return owner
    except ClientError as err:
        if not is_missing_object(err):
            raise_s3_error(err, "reading", bucket, probe)
    except BotoCoreError as err:
        raise_s3_error(err, "reading", bucket, probe)
    found = find_report(s3, bucket, layout.report_key(output_prefix))
    return found[0].job_id if found is not None else None


def check_output_free(s3: S3Client, job: JobSpec, job_id: str) -> None:
    """Refuse a job whose output prefix holds another job's output.

    Raises:
        InvalidInput: Naming the other job and the options to pass.
    """
    if job.overwrite_output or job.only_failed_of:
        return
    owner = output_owner(s3, job.output_bucket, job.output_prefix)
    if owner is None or owner == job_id:
        return
    raise InvalidInput(
        f"output_prefix: s3://{job.output_bucket}/{job.output_prefix} holds the output of job {owner!r}; this job "
        "would replace its report and parts. Pass another output_prefix, or \"overwrite_output\": true "
        f"(s3batch start --overwrite-output) to replace it on purpose (`s3batch redrive {owner}` finishes that "
        "job's failed or cancelled files in place)"
    )


def write_check_metadata(job_id: str) -> dict[str, str]:
    """The metadata of the write-check object a job writes at start."""
    return {JOB_METADATA: job_id}

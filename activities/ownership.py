"""Whose output an output prefix holds: a job refuses to start over another job's output.

Two jobs writing under one output prefix replace each other's report and parts silently. Every job
records its ID on the write-check object it writes at start (``{output_prefix}_s3batch/write-check``,
metadata ``s3batch-job``); a job's report names it too (``job_id``, for jobs of releases that wrote no
such metadata). A new job whose output prefix names another job is refused with ``InvalidInput``,
unless it passes ``overwrite_output`` on purpose or is a redrive (``only_failed_of``: it finishes that
job's files in the same output). The same job's own retries and continue-as-new runs pass (same ID),
and so does a rerun of the very same job under a new ID (the same input, recorded as a digest next
to the ID): it reuses the committed output instead of replacing someone else's.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from s3batch import layout
from s3batch.errors import InvalidInput
from s3batch.models import JobSpec
from s3batch.report_store import find_report
from s3batch.s3io import is_missing_object, raise_s3_error

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

JOB_METADATA = "s3batch-job"
"""User metadata of the write-check object: the ID of the job that wrote it."""
INPUT_METADATA = "s3batch-job-input"
"""User metadata of the write-check object: :func:`input_digest` of that job's input."""


def input_digest(job_input: dict[str, Any]) -> str:
    """A short digest of a job's input as written (``overwrite_output`` aside): equal for a rerun."""
    fields = {name: value for name, value in job_input.items() if name != "overwrite_output"}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:32]


def output_owner(s3: S3Client, bucket: str, output_prefix: str) -> tuple[str, str] | None:
    """``(job ID, input digest)`` of the job whose output is under ``output_prefix``, or None."""
    probe = layout.write_check_key(output_prefix)
    try:
        metadata = s3.head_object(Bucket=bucket, Key=probe).get("Metadata", {})
        if metadata.get(JOB_METADATA):
            return metadata[JOB_METADATA], metadata.get(INPUT_METADATA, "")
    except ClientError as err:
        if not is_missing_object(err):
            raise_s3_error(err, "reading", bucket, probe)
    except BotoCoreError as err:
        raise_s3_error(err, "reading", bucket, probe)
    found = find_report(s3, bucket, layout.report_key(output_prefix))
    if found is None or not found[0].job_id:
        return None
    return found[0].job_id, input_digest(found[0].input)


def check_output_free(s3: S3Client, job: JobSpec, job_id: str) -> None:
    """Refuse a job whose output prefix holds another job's output.

    Raises:
        InvalidInput: Naming the other job and the options to pass.
    """
    if job.overwrite_output or job.only_failed_of:
        return
    found = output_owner(s3, job.output_bucket, job.output_prefix)
    if found is None:
        return
    owner, digest = found
    if owner == job_id or digest == input_digest(job.model_dump(mode="json")):
        return  # this job's own output, or a rerun of the same job (same input)
    raise InvalidInput(
        f"output_prefix: s3://{job.output_bucket}/{job.output_prefix} holds the output of job {owner!r}, which "
        "had another input; this job would replace its report and parts. Pass another output_prefix, or "
        '"overwrite_output": true (s3batch start --overwrite-output) to replace it on purpose '
        f"(`s3batch redrive {owner}` finishes that job's failed or cancelled files in place)"
    )


def write_check_metadata(job_id: str, job: JobSpec) -> dict[str, str]:
    """The metadata of the write-check object a job writes at start."""
    return {JOB_METADATA: job_id, INPUT_METADATA: input_digest(job.model_dump(mode="json"))}

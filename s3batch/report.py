"""The job report: its model, how it is assembled and written, read back, and what a redrive takes from it.

A job writes ``{output_prefix}_report.json`` when it ends (``layout.report_key``): every file of the
job with its outcome, the totals and where the listing stopped. Runs before a continue-as-new flush
their files' results as report segments (JSON lines under ``{output_prefix}_s3batch/``), which the
final report gathers. Everything that writes or reads a report goes through this module: the
``write_report`` activity, a redrive's listing (``only_failed_of``) and the client.

The JSON is ``json.dumps(report, indent=1)`` of :class:`JobReport`, with its keys in the order of its
fields; ``accounting_errors`` appears only when the books do not add up.
"""

from __future__ import annotations

import datetime
import json
from typing import TYPE_CHECKING, Any

import orjson
from botocore.exceptions import BotoCoreError, ClientError
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from s3batch.accounting import combine, key_digest, report_problems
from s3batch.errors import AccountingError, InvalidInput
from s3batch.messages import FileResult, FinalReportInput, Totals
from s3batch.models import REDRIVE_STATUSES
from s3batch.s3io import error_code, raise_s3_error

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


class ReportFile(FileResult):
    """One file of a report: a :class:`FileResult`, read tolerantly (a report lists at least each
    file's key and status)."""

    etag: str = ""


class ReportListing(BaseModel):
    """Where the job's listing stopped."""

    model_config = ConfigDict(extra="allow")

    done: bool = True
    """False for a job cancelled before its listing ended: a redrive goes on from ``continuation_token``."""
    continuation_token: str | None = None
    """Where the rest of the listing starts (a redrive's own token, see ``redrive_plan``)."""
    last_listed_key: str | None = None
    """The last key listed (for people reading the report)."""


class JobReport(BaseModel):
    """The report of a finished job, as stored on S3. Unknown fields are kept (``extra="allow"``):
    a report written by another version of s3batch is read, and written back, whole."""

    model_config = ConfigDict(extra="allow")

    job_id: str | None = None
    status: str = "failed"
    """``succeeded``, ``failed`` or ``cancelled``."""
    finished_at: str | None = None
    """When the report was written (ISO 8601, UTC)."""
    source: str | None = None
    """``s3://bucket/prefix`` the job read."""
    output: str | None = None
    """``s3://bucket/prefix`` the job wrote."""
    input: dict[str, Any] = Field(default_factory=dict)
    """The job's input, as given (``S3BatchInput``)."""
    totals: Totals = Field(default_factory=Totals)
    listing: ReportListing = Field(default_factory=ReportListing)
    files: list[ReportFile]
    """Every file the job listed (or had to redrive), once."""
    accounting_errors: list[str] | None = None
    """What does not add up in the job's books (present only then; the status is then ``failed``)."""

    def to_json(self) -> bytes:
        """The report as written to S3 (only the fields it was built or read with)."""
        return json.dumps(self.model_dump(mode="json", exclude_unset=True), indent=1).encode()

    def redrive_files(self, prefix: str) -> list[ReportFile]:
        """The files a redrive processes again: failed, cancelled or never started, under ``prefix``."""
        return [f for f in self.files if f.status in REDRIVE_STATUSES and f.key.startswith(prefix)]


def redrive_plan(report: JobReport, prefix: str) -> tuple[list[str], str | None]:
    """What a redrive of ``report`` processes: the keys of its failed, cancelled and never-started
    files under ``prefix``, and where the rest of its listing starts (None when its listing ended,
    ``""`` when it never listed a page)."""
    keys = [f.key for f in report.redrive_files(prefix)]
    if report.listing.done:
        return keys, None
    return keys, report.listing.continuation_token or ""


def parse_report(body: bytes, uri: str) -> JobReport:
    """``body`` read as a job report.

    Raises:
        InvalidInput: It is not one (not JSON, or without a ``files`` list of keys).
    """
    try:
        return JobReport.model_validate_json(body)
    except ValidationError:
        raise InvalidInput(f"{uri} is not an s3batch job report (no 'files' list)") from None


def read_report(s3: S3Client, bucket: str, key: str, *, action: str = "reading the job report") -> JobReport:
    """The job report at ``s3://bucket/key``.

    Raises:
        NotFound: There is none (and the other errors of ``s3batch.s3io.raise_s3_error``).
        InvalidInput: The object is not a job report.
    """
    return fetch_report(s3, bucket, key, action=action)[0]


def fetch_report(
    s3: S3Client, bucket: str, key: str, *, action: str = "reading the job report"
) -> tuple[JobReport, str]:
    """The job report at ``s3://bucket/key`` and its ETag (for a copy conditional on it), raising
    like :func:`read_report`."""
    found = _get(s3, bucket, key, action, missing_ok=False)
    assert found is not None
    return found


def find_report(s3: S3Client, bucket: str, key: str) -> tuple[JobReport, str] | None:
    """Like :func:`fetch_report`, but None where there is no such object (yet): the job has not ended."""
    return _get(s3, bucket, key, "reading the job report", missing_ok=True)


def _get(s3: S3Client, bucket: str, key: str, action: str, *, missing_ok: bool) -> tuple[JobReport, str] | None:
    try:
        response = s3.get_object(Bucket=bucket, Key=key)
        body = response["Body"].read()
    except ClientError as err:
        if missing_ok and error_code(err) == "NoSuchKey":
            return None
        raise_s3_error(err, action, bucket, key)
    except BotoCoreError as err:
        raise_s3_error(err, action, bucket, key)
    return parse_report(body, f"s3://{bucket}/{key}"), response["ETag"]


def segment_body(files: list[FileResult]) -> bytes:
    """A report segment: the results of one workflow run, one JSON line each."""
    return b"".join(orjson.dumps(f.model_dump(mode="json")) + b"\n" for f in files)


def read_segment(s3: S3Client, bucket: str, key: str) -> list[dict[str, Any]]:
    """The file results of the report segment at ``s3://bucket/key``."""
    try:
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    except (ClientError, BotoCoreError) as err:
        raise_s3_error(err, "reading report segment", bucket, key)
    return [orjson.loads(line) for line in body.splitlines() if line]


def assemble_report(
    req: FinalReportInput, segment_files: list[dict[str, Any]], redriven: JobReport | None = None
) -> JobReport:
    """The final report of the job of ``req``: the files of its segments, then those of its last run.

    Args:
        req: What the workflow knows at the end.
        segment_files: The file results flushed by earlier runs, in order.
        redriven: The report this job redrives (``only_failed_of``), needed only when the job was
            cancelled before its listing ended.
    """
    job = req.job
    files = [*segment_files, *(f.model_dump(mode="json") for f in req.files)]
    totals = req.totals.model_dump(mode="json")
    digest = req.listed_digest
    listing: dict[str, Any] = {
        "done": req.listing_done,
        "continuation_token": req.continuation_token,
        "last_listed_key": req.last_listed_key,
    }
    if redriven is not None and not req.listing_done:
        # A redrive cancelled before it listed all it had to redrive: the rest of the redriven
        # report becomes this report's never-started files, and its listing goes on where that
        # report's did, so a redrive of this job picks up exactly what is left.
        keys, rest = redrive_plan(redriven, job.prefix)
        token = req.continuation_token or "0"
        unlisted, rest = ([], token[3:]) if token.startswith("s3:") else (keys[int(token) :], rest)
        files.extend(FileResult.not_started(key).model_dump(mode="json") for key in unlisted)
        totals["files_listed"] += len(unlisted)
        totals["files_not_started"] += len(unlisted)
        if digest is not None:
            digest = combine(digest, key_digest(unlisted))
        listing = {"done": rest is None, "continuation_token": rest, "last_listed_key": req.last_listed_key}
    report: dict[str, Any] = {
        "job_id": req.job_id,
        "status": req.status,
        "finished_at": datetime.datetime.now(datetime.UTC).isoformat(),
        "source": f"s3://{job.bucket}/{job.prefix}",
        "output": f"s3://{job.output_bucket}/{job.output_prefix}",
        "input": job.model_dump(mode="json"),
        "totals": totals,
        "listing": listing,
        "files": files,
    }
    if not totals["files_listed"] and listing["done"]:
        # A prefix that matches nothing is most often a typo: said in the report, not only by the CLI.
        report["warnings"] = [f"no file matched {report['source']}: nothing was processed (check the prefix)"]
    problems = report_problems(files, totals, digest)
    if problems:
        report["status"] = "failed"
        report["accounting_errors"] = problems
    return JobReport.model_validate(report)


def books_error(report: JobReport, bucket: str, key: str) -> AccountingError | None:
    """The error to fail the job with when ``report`` (written at ``s3://bucket/key``) says its books
    do not add up, else None."""
    if not report.accounting_errors:
        return None
    return AccountingError(
        f"accounting error: the job's books do not add up: {'; '.join(report.accounting_errors)}. The report at "
        f"s3://{bucket}/{key} says so; this is a bug in s3batch, please report it."
    )

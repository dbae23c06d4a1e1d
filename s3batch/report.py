"""The job report: what it holds (:class:`JobReport`), how it is parsed, and what a redrive takes from it.

A job writes ``{output_prefix}_report.json`` when it ends (``layout.report_key``): every file of the
job with its outcome, the totals and where the listing stopped. The JSON is ``json.dumps(report,
indent=1)`` of :class:`JobReport`, with its keys in the order of its fields; ``accounting_errors``
appears only when the books do not add up.

How it is assembled from the runs' segments, written to S3 and read back: :mod:`s3batch.report_store`.
The model needs no S3 client: the client's views and the command line's tables import it alone.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from s3batch.errors import AccountingError, InvalidInput
from s3batch.messages import FileResult, Totals
from s3batch.models import REDRIVE_STATUSES


class ReportFile(FileResult):
    """One file of a report: a :class:`FileResult`, read tolerantly (a report lists at least each
    file's key and status)."""

    etag: str = ""
    rejects_prefix: str | None = None
    """A file with rejects: the ``s3://`` prefix of its rejects files (``layout.rejects_uri``; older reports: none)."""


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

    def redrive_files(self, prefix: str, *, rejected: bool = False) -> list[ReportFile]:
        """The files a redrive processes again: failed, cancelled or never started, under ``prefix`` (``rejected``:
        those with rejected records, whatever their status)."""
        return [f for f in self.files if (f.rejected if rejected else f.status in REDRIVE_STATUSES)
                and f.key.startswith(prefix)]  # fmt: skip


def redrive_plan(report: JobReport, prefix: str, *, rejected: bool = False) -> tuple[list[str], str | None]:
    """What a redrive of ``report`` processes: the keys of its failed, cancelled and never-started
    files under ``prefix``, and where the rest of its listing starts (None when its listing ended,
    ``""`` when it never listed a page); ``rejected``: the keys of its files with rejects (and None)."""
    keys = [f.key for f in report.redrive_files(prefix, rejected=rejected)]
    if report.listing.done or rejected:
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


def books_error(report: JobReport, bucket: str, key: str) -> AccountingError | None:
    """The error to fail the job with when ``report`` (written at ``s3://bucket/key``) says its books
    do not add up, else None."""
    if not report.accounting_errors:
        return None
    return AccountingError(
        f"accounting error: the job's books do not add up: {'; '.join(report.accounting_errors)}. The report at "
        f"s3://{bucket}/{key} says so; this is a bug in s3batch, please report it."
    )

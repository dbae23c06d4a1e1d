"""The S3 side of incremental jobs (see :mod:`s3batch.incremental`): a listing page cut by the ledger,
and the ledger advanced after the run's report."""

from __future__ import annotations

import datetime
import email.utils
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError
from pydantic import ValidationError

from s3batch.errors import InvalidInput, SourceChanged
from s3batch.incremental import (
    Ledger,
    ListIncrementalInput,
    PageRecord,
    WriteLedgerInput,
    advance,
    iso,
    ledger_location,
    page_key,
    pages_dir,
)
from s3batch.messages import ListObjectsResult, ObjectRef
from s3batch.report import read_report
from s3batch.s3io import error_code, is_missing_object, raise_s3_error, strip_etag

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


def read_ledger(s3: S3Client, uri: str) -> tuple[Ledger, str | None]:
    """The ledger under ``uri`` and its ETag (an empty ledger and None when there is none yet)."""
    bucket, key = ledger_location(uri)
    try:
        response = s3.get_object(Bucket=bucket, Key=key)
        body = response["Body"].read()
    except ClientError as err:
        if is_missing_object(err) and error_code(err) != "NoSuchBucket":
            return Ledger(), None
        raise_s3_error(err, "reading the ledger", bucket, key)
    except BotoCoreError as err:
        raise_s3_error(err, "reading the ledger", bucket, key)
    try:
        return Ledger.model_validate_json(body), strip_etag(response["ETag"])
    except ValidationError:
        raise InvalidInput(
            f"s3://{bucket}/{key} is not an s3batch ledger; give incremental.ledger a prefix of its own"
        ) from None


def list_incremental_page(s3: S3Client, req: ListIncrementalInput, put: Any) -> ListObjectsResult:
    """One page of ListObjectsV2 under the prefix, keeping the objects the ledger does not know in their
    current version; what the page took is recorded under the run's output (``put(bucket, key, body)``)."""
    ledger, etag = read_ledger(s3, req.ledger)
    if req.job_id is not None:
        _refuse_a_second_start(ledger, req.ledger, req.job_id, req.execution)
    kwargs: dict[str, Any] = {"Bucket": req.bucket, "Prefix": req.prefix, "MaxKeys": req.page_size}
    if req.continuation_token:
        kwargs["ContinuationToken"] = req.continuation_token
    try:
        response = s3.list_objects_v2(**kwargs)
    except (ClientError, BotoCoreError) as err:
        raise_s3_error(err, "listing", req.bucket, req.prefix or None)
    record = PageRecord(ledger_etag=etag)
    if req.continuation_token is None:
        record.listed_at = iso(_server_time(response))
    objects = []
    for item in response.get("Contents", []):
        key, modified = item["Key"], item["LastModified"]
        if key.endswith("/") and item["Size"] == 0:
            continue
        if req.selection is not None and not req.selection.takes(key, modified):
            continue
        obj = ObjectRef(key=key, etag=strip_etag(item["ETag"]), size=item["Size"])
        kind = ledger.kind(key, obj.etag, modified)
        if kind is None:
            record.skipped += 1
            continue
        record.taken.append((key, obj.etag, iso(modified), kind))
        objects.append(obj)
    put(req.output_bucket, page_key(req.output_prefix, req.continuation_token), record.model_dump_json().encode())
    token = response.get("NextContinuationToken") if response.get("IsTruncated") else None
    return ListObjectsResult(objects=objects, next_token=token)


def _refuse_a_second_start(ledger: Ledger, uri: str, job_id: str, execution: str | None) -> None:
    """Raise ``InvalidInput`` when a job of the same workflow ID, but another workflow, already ran on the
    ledger: its output prefix (``runs/{job-id}/``) and its name in the ledger are that job's, so this one
    would overwrite its report and record nothing (the ledger takes it for that job's retry): every file it
    processed would be taken again by the next run."""
    earlier = ledger.ran_before(job_id, execution)
    if earlier is None:
        return
    report = earlier.get("report") or "its report"
    raise InvalidInput(
        f"job {job_id!r} already ran on the ledger {uri}ledger.json (another workflow of the same ID: {report}); "
        "a job ID runs once on a ledger, its output folder and its name in the ledger are that run's. Nothing "
        "was listed or processed: start the job under a new workflow ID (a schedule's past tick that already "
        "ran is not run again: `s3batch backfill` refuses it)"
    )


def _server_time(response: Any) -> datetime.datetime:
    """The S3 server's clock at the response (its ``Date``), else this worker's."""
    date = response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
    try:
        return email.utils.parsedate_to_datetime(date)
    except (TypeError, ValueError):
        return datetime.datetime.now(datetime.UTC)


def write_ledger(s3: S3Client, req: WriteLedgerInput, put_ledger: Any) -> str:
    """Advance the ledger over the run's files that succeeded (idempotent: a retry after the ledger
    was written by this run changes nothing). ``put_ledger(bucket, key, body, if_match)`` writes it.

    Raises:
        SourceChanged: Another run advanced the ledger while this one ran (its pages were cut with
            another ledger): this run's files are not recorded, and the next run takes them again.
    """
    old, etag = read_ledger(s3, req.ledger)
    bucket, key = ledger_location(req.ledger)
    if old.last_run == req.run_id and old.last_execution in (None, req.execution):
        return key  # this job's retry (or an earlier version's record of it)
    _refuse_a_second_start(old, req.ledger, req.run_id, req.execution)
    pages = [PageRecord.model_validate_json(body) for body in _page_bodies(s3, req.output_bucket, req.output_prefix)]
    if any(page.ledger_etag != etag for page in pages):
        raise SourceChanged(
            f"the ledger s3://{bucket}/{key} changed while job {req.run_id!r} ran (two runs of one ledger at "
            "once?): its files are not recorded there, and the next run takes them again"
        )
    report = read_report(s3, req.output_bucket, req.report_key)
    statuses = {f.key: (f.status, f.etag) for f in report.files}
    new = advance(old, req, pages, statuses)
    put_ledger(bucket, key, new.to_json(), etag)
    return key


def _page_bodies(s3: S3Client, bucket: str, output_prefix: str) -> list[bytes]:
    folder = pages_dir(output_prefix)
    bodies = []
    try:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=folder):
            for item in page.get("Contents", []):
                bodies.append(s3.get_object(Bucket=bucket, Key=item["Key"])["Body"].read())
    except (ClientError, BotoCoreError) as err:
        raise_s3_error(err, "reading the listing's records", bucket, folder)
    return bodies

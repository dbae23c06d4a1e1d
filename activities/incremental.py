"""The S3 side of incremental jobs (see :mod:`s3batch.incremental`): a listing page cut by the ledger,
and the ledger advanced after the run's report."""

from __future__ import annotations

import contextlib
import datetime
import email.utils
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError
from pydantic import ValidationError

from s3batch.errors import InvalidInput, SourceChanged
from s3batch.incremental import (
    DEFAULT_MAX_LEDGER_BYTES,
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
from s3batch.report_store import read_report
from s3batch.s3io import STREAM_ERRORS, error_code, is_missing_object, raise_s3_error, strip_etag

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


class Ledgers:
    """The ledgers a worker process lists with, each kept at its last version read (ETag), bounded in size.

    Every page of an incremental job's listing cuts its objects with the ledger. Read whole and parsed for
    every page, a ledger of a big window (1 MB for 10,000 objects) cost each page that much reading and
    parsing. A page now asks for the ledger with ``IfNoneMatch`` the version known here: the server
    answers 304 without a body while it is unchanged. A new version's size (its ``ContentLength``) is
    checked before its body is read: a ledger over ``max_bytes`` (``S3BATCH_MAX_LEDGER_BYTES``) is
    refused unread, so a ledger grown without bound (or a huge object put in its place) cannot exhaust
    the worker's memory.

    Args:
        max_bytes: The largest ledger read.
        keep: Ledgers kept (the least recently used is dropped).
    """

    def __init__(self, max_bytes: int = DEFAULT_MAX_LEDGER_BYTES, keep: int = 4) -> None:
        self.max_bytes = max_bytes
        self._known: OrderedDict[tuple[str, str], tuple[Ledger, str]] = OrderedDict()
        self._keep = keep
        self._lock = threading.Lock()  # activities run in a thread pool

    def read(self, s3: S3Client, uri: str) -> tuple[Ledger, str | None]:
        """The ledger under ``uri`` and its ETag (an empty ledger and None when there is none yet).

        The ledger returned may be shared with other pages: it is not to be changed.

        Raises:
            InvalidInput: It is over ``max_bytes``, or not an s3batch ledger.
        """
        bucket, key = ledger_location(uri)
        with self._lock:
            known = self._known.get((bucket, key))
        condition: dict[str, Any] = {"IfNoneMatch": f'"{known[1]}"'} if known is not None else {}
        try:
            response = s3.get_object(Bucket=bucket, Key=key, **condition)
        except ClientError as err:
            if known is not None and error_code(err) in ("304", "NotModified"):
                with self._lock:
                    self._known[(bucket, key)] = known
                    self._known.move_to_end((bucket, key))
                return known
            if is_missing_object(err) and error_code(err) != "NoSuchBucket":
                with self._lock:
                    self._known.pop((bucket, key), None)
                return Ledger(), None
            raise_s3_error(err, "reading the ledger", bucket, key)
        except BotoCoreError as err:
            raise_s3_error(err, "reading the ledger", bucket, key)
        with contextlib.closing(response["Body"]) as stream:
            size = response["ContentLength"]
            if size > self.max_bytes:
                raise _over_bound(f"s3://{bucket}/{key}", size, self.max_bytes)
            try:
                body = stream.read()
            except STREAM_ERRORS as err:
                raise_s3_error(err, "reading the ledger", bucket, key)
        try:
            ledger = Ledger.model_validate_json(body)
        except ValidationError:
            raise InvalidInput(
                f"s3://{bucket}/{key} is not an s3batch ledger; give incremental.ledger a prefix of its own"
            ) from None
        found = ledger, strip_etag(response["ETag"])
        with self._lock:
            self._known[(bucket, key)] = found
            self._known.move_to_end((bucket, key))
            while len(self._known) > self._keep:
                self._known.popitem(last=False)
        return found


def _over_bound(where: str, size: int, bound: int) -> InvalidInput:
    return InvalidInput(
        f"the ledger {where} is {size:,} bytes, over this worker's bound of {bound:,} (S3BATCH_MAX_LEDGER_BYTES); "
        "it was not read. A ledger holds about 100 bytes per object uploaded within "
        "incremental.window_seconds before its last listing: raise S3BATCH_MAX_LEDGER_BYTES on the workers, or "
        "give the job a new ledger (its first run processes every object again)"
    )


def list_incremental_page(s3: S3Client, req: ListIncrementalInput, put: Any, ledgers: Ledgers) -> ListObjectsResult:
    """One page of ListObjectsV2 under the prefix, keeping the objects the ledger does not know in their
    current version; what the page took is recorded under the run's output (``put(bucket, key, body)``).
    The ledger is read through ``ledgers`` (bounded, and read again only when it changed)."""
    ledger, etag = ledgers.read(s3, req.ledger)
    _refuse_another_source(ledger, req.ledger, f"s3://{req.bucket}/{req.prefix}")
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
        kind = ledger.kind(req.bucket, key, obj.etag, modified)
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


def _refuse_another_source(ledger: Ledger, uri: str, source: str) -> None:
    """Raise ``InvalidInput`` when the ledger records another source than the job's ``source``: its watermark,
    objects and retries are that source's, which this job would take over (its run would rewrite them, and
    the next run of the ledger's own source would report objects it never processed as unchanged)."""
    if not ledger.source or ledger.source == source:
        return
    raise InvalidInput(
        f"the ledger {uri}ledger.json is the ledger of the source {ledger.source}, not of this job's source "
        f"{source}: a ledger records the objects of one source. Nothing was listed or processed: give this job "
        "a ledger of its own (incremental.ledger, or another output_prefix), or correct its bucket and prefix"
    )


def _server_time(response: Any) -> datetime.datetime:
    """The S3 server's clock at the response (its ``Date``), else this worker's."""
    date = response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
    try:
        return email.utils.parsedate_to_datetime(date)
    except (TypeError, ValueError):
        return datetime.datetime.now(datetime.UTC)


def write_ledger(s3: S3Client, req: WriteLedgerInput, put_ledger: Any, ledgers: Ledgers) -> str:
    """Advance the ledger over the run's files that succeeded (idempotent: a retry after the ledger
    was written by this run changes nothing). ``put_ledger(bucket, key, body, if_match)`` writes it.

    Raises:
        SourceChanged: Another run advanced the ledger while this one ran (its pages were cut with
            another ledger): this run's files are not recorded, and the next run takes them again.
        InvalidInput: The ledger records another source, or is over the bound of ``ledgers``.
    """
    old, etag = ledgers.read(s3, req.ledger)
    bucket, key = ledger_location(req.ledger)
    if old.last_run == req.run_id and old.last_execution in (None, req.execution):
        return key  # this job's retry (or an earlier version's record of it)
    _refuse_another_source(old, req.ledger, req.source)
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
    try:
        put_ledger(bucket, key, new.to_json(), etag)
    except SourceChanged:
        # The PUT may have landed and its answer been lost (a connection reset): botocore sends it again, and the
        # condition then fails on the ledger this very write made. That ledger is this run's: done.
        now, _ = ledgers.read(s3, req.ledger)
        if now.last_run == req.run_id and now.last_execution in (None, req.execution):
            return key
        raise
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

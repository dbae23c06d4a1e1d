"""The activities of s3batch: list a prefix, process one file resumably, write the report.

All of them are synchronous (boto3 blocks) and run in the worker's thread pool. One S3 client is
built by the worker and shared: boto3 clients are thread-safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import io
import os
import time
import zlib
from collections.abc import Iterable, Iterator, Sequence
from itertools import islice
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError
from pydantic import ValidationError
from s3batch.activities.boundary import boundary, unexpected
from temporalio import activity
from temporalio.exceptions import CancelledError

from s3batch import layout
from s3batch import search_attributes as sa
from s3batch.config import Settings
from s3batch.errors import (
    AccountingError,
    BadFile,
    HandlerError,
    OutputKeyTooLong,
    S3BatchError,
    WorkerShutdown,
)
from s3batch.handlers import HandlerResult, Reject, get_handler
from s3batch.jsonvalues import encode_json
from s3batch.models import (
    Checkpoint,
    FileResult,
    FinalReportInput,
    JobCheck,
    JobSpec,
    ListObjectsInput,
    ListObjectsResult,
    ObjectRef,
    ProcessFileInput,
    ProcessGroupInput,
    ReportSegmentInput,
    describe_validation_error,
)
from s3batch.records import Record, make_parser, read_csv_header, resolve_format
from s3batch.report import (
    JobReport,
    assemble_report,
    books_error,
    read_report,
    read_segment,
    redrive_plan,
    segment_body,
)
from s3batch.s3io import (
    S3Client,
    check_allowed,
    check_ceilings,
    delete_keys,
    head_pinned,
    is_missing_object,
    open_object,
    raise_s3_error,
    sse_params,
)

_BEAT_INTERVAL = 1.0
"""Seconds between two heartbeat calls of one file (see ``_FileJob._beat``)."""

# Records handed to the handler at once. Between two of these the activity heartbeats (liveness)
# and checks for cancellation, so a big chunk is never mistaken for a dead worker.
_SUB_BATCH = 1_000


class _Metrics:
    """The project's own metrics, next to the SDK's (exported by the worker's Prometheus endpoint)."""

    def __init__(self, handler: str) -> None:
        meter = activity.metric_meter().with_additional_attributes({"handler": handler})
        self.records = meter.create_counter("s3batch_records_processed", "Records read and handled", "records")
        self.rejected = meter.create_counter("s3batch_records_rejected", "Records sent to rejects", "records")
        self.bytes_read = meter.create_counter("s3batch_bytes_read", "Source bytes consumed", "bytes")
        self.chunks = meter.create_counter("s3batch_chunks_committed", "Parts written with their checkpoint")
        self.resumes = meter.create_counter("s3batch_resumes", "File attempts that resumed from a checkpoint")
        self.checkpoint_age = meter.create_histogram_float(
            "s3batch_checkpoint_age_seconds",
            "Age of a file's previous checkpoint when the next one is committed",
            "s",
        )


def _any_object(s3: S3Client, bucket: str, prefix: str) -> bool:
    """Whether any object exists under ``prefix`` (one LIST of at most one key)."""
    try:
        listed = s3.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1)
    except (ClientError, BotoCoreError) as err:
        raise_s3_error(err, "listing", bucket, prefix)
    return bool(listed.get("KeyCount") or listed.get("Contents"))


def _strip_etag(etag: str) -> str:
    return etag.strip('"')


def _list_outputs(s3: S3Client, bucket: str, folder: str) -> dict[str, str]:
    """The objects directly in the output folder ``folder``, as ``{name: etag}`` (paginated LIST)."""
    found: dict[str, str] = {}
    try:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=folder):
            for item in page.get("Contents", []):
                name = item["Key"][len(folder) :]
                if "/" not in name:
                    found[name] = _strip_etag(item["ETag"])
    except (ClientError, BotoCoreError) as err:
        raise_s3_error(err, "listing output under", bucket, folder)
    return found


def _list_group_outputs(s3: S3Client, bucket: str, folders: list[str]) -> dict[str, dict[str, str]]:
    """The objects directly in each of ``folders`` (the output folders of a group's files), as
    ``{folder: {name: etag}}``, with one paginated LIST over the key range they span.

    The range starts after the first folder and ends after the last one in S3's key order (UTF-8
    bytes, which is Python's ``str`` order). A server that lists in another order (SeaweedFS lists
    by path segment) may leave folders out; ``_FileJob.verify`` lists such a folder again on its own
    before it reports anything missing.
    """
    found: dict[str, dict[str, str]] = {f: {} for f in folders}
    if not folders:
        return found
    low, high = min(folders), max(folders)
    outer = min((f for f in folders if high.startswith(f)), key=len)  # the folders enclosing the last
    common = os.path.commonprefix(folders)  # noqa: RUF071 - S3 prefixes are strings
    kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": common}
    if low != common:
        kwargs["StartAfter"] = low  # a folder is not an object: its keys all sort after it
    try:
        for page in s3.get_paginator("list_objects_v2").paginate(**kwargs):
            for item in page.get("Contents", []):
                key = item["Key"]
                if key > high and not key.startswith(outer):
                    return found  # past the last folder
                slash = key.rfind("/") + 1
                names = found.get(key[:slash])
                if names is not None:
                    names[key[slash:]] = _strip_etag(item["ETag"])
    except (ClientError, BotoCoreError) as err:
        raise_s3_error(err, "listing output under", bucket, common)
    return found


def _job_cancelled() -> bool:
    """The activity is being cancelled because the job was (not a worker shutdown, a timeout, ...)."""
    details = activity.cancellation_details()
    if details is None:
        return False
    other = details.worker_shutdown or details.timed_out or details.paused or details.reset or details.not_found
    return details.cancel_requested and not other


_JSON_TYPE_ERRORS = ("Type is not JSON serializable: ", "Dict key must be str", "Integer exceeds", "Recursion limit")
"""Beginnings of the TypeErrors of ``encode_json`` that name a type or a limit, never a value."""


def _take(records: Iterator[Record], parser: Any, want: int, until: int) -> list[Record]:
    """Up to ``want`` records (at least one, if any is left), fewer once the parser's offset reaches ``until``."""
    batch: list[Record] = []
    for record in records:
        batch.append(record)
        if len(batch) >= want or parser.offset >= until:
            break
    return batch


def _failed(item: ProcessFileInput, err: S3BatchError, attempt: int) -> FileResult:
    return FileResult(
        key=item.obj.key,
        etag=item.obj.etag,
        status="failed",
        attempts=attempt,
        error=f"{err.type}: {err.message}",
    )


def _cancelled(item: ProcessFileInput, cp: Checkpoint | None, attempt: int) -> FileResult:
    """A file of a cancelled group that had not finished, with the counts of its last checkpoint."""
    cp = cp if cp is not None and cp.etag == item.obj.etag else None
    return FileResult(
        key=item.obj.key,
        etag=item.obj.etag,
        status="cancelled",
        records=cp.next_record if cp else 0,
        records_written=cp.records_written if cp else 0,
        rejected=cp.rejected if cp else 0,
        dropped=cp.dropped if cp else 0,
        chunks=cp.chunk if cp else 0,
        attempts=attempt,
        error="job cancelled: stopped at a chunk boundary after its last checkpoint",
    )


class S3Activities:
    """Activities bound to one S3 client.

    Args:
        s3: A boto3 S3 client (``s3batch.s3io.make_client()`` builds one from the environment).
        settings: The worker's settings (default: from the environment, ``S3BATCH_*``).
    """

    def __init__(self, s3: S3Client, settings: Settings | None = None) -> None:
        self.s3 = s3
        self.settings = settings if settings is not None else Settings()
        """The worker's data-path settings: allow-lists, ceilings, output encryption, checkpoint secret."""
        self.search_attributes_registered = False
        """Set by the worker once s3batch's search attributes are known to exist."""
        self.source_keys: list[bytes] = []
        """The encryption keyring (first = current), set by the plugin: ``S3BatchSource`` is then an
        HMAC of the source, never its name."""

    # ------------------------------------------------------------------ job checks and listing

    @activity.defn(name="s3batch.check_job")
    @boundary()
    def check_job(self, job: JobSpec) -> JobCheck:
        """Fail fast, before any file runs, on a job that cannot work: unknown handler or format,
        buckets or prefixes this worker may not use, limits over its ceilings, missing or unreadable
        buckets."""
        get_handler(job.handler)
        check_allowed(self.settings, "sources", job.bucket, job.prefix)
        check_allowed(self.settings, "outputs", job.output_bucket, job.output_prefix)
        if job.only_failed_of:
            self._report_location(job.only_failed_of)
        check_ceilings(self.settings, job.chunk_records, job.max_record_bytes, "the job")
        try:
            self.s3.list_objects_v2(Bucket=job.bucket, Prefix=job.prefix, MaxKeys=1)
        except (ClientError, BotoCoreError) as err:
            raise_s3_error(err, "listing", job.bucket, job.prefix or None)
        # The bucket must exist (some S3 servers create it on the first PUT), and a tiny write proves
        # it is writable before any file is read (a read-only bucket would otherwise fail every
        # file, and then the report).
        probe = layout.write_check_key(job.output_prefix)
        try:
            # A LIST of the output prefix, not a HEAD of the bucket: a policy scoped to the prefix
            # (deploy/iam) allows it, and a missing bucket still answers NoSuchBucket.
            self.s3.list_objects_v2(Bucket=job.output_bucket, Prefix=job.output_prefix, MaxKeys=1)
        except (ClientError, BotoCoreError) as err:
            raise_s3_error(err, "checking the output bucket", job.output_bucket)
        try:
            self.s3.put_object(
                Bucket=job.output_bucket, Key=probe, Body=b"", ContentType="text/plain", **sse_params(self.settings)
            )
        except (ClientError, BotoCoreError) as err:
            raise_s3_error(err, "writing", job.output_bucket, probe)
        if job.only_failed_of:
            self._read_report(job.only_failed_of)
        return JobCheck(
            search_attributes=self.search_attributes_registered,
            source=sa.source_value(job.bucket, job.prefix, self.source_keys),
        )

    @activity.defn(name="s3batch.list_objects")
    @boundary()
    def list_objects(self, req: ListObjectsInput) -> ListObjectsResult:
        """One page of ListObjectsV2. Folder markers (``key/`` of size 0) are skipped."""
        check_allowed(self.settings, "sources", req.bucket, req.prefix)
        if req.report:
            return self._list_failed(req)
        return self._list_page(req.bucket, req.prefix, req.page_size, req.continuation_token)

    def _list_page(self, bucket: str, prefix: str, page_size: int, continuation_token: str | None) -> ListObjectsResult:
        kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix, "MaxKeys": page_size}
        if continuation_token:
            kwargs["ContinuationToken"] = continuation_token
        try:
            response = self.s3.list_objects_v2(**kwargs)
        except (ClientError, BotoCoreError) as err:
            raise_s3_error(err, "listing", bucket, prefix or None)
        objects = [
            ObjectRef(key=item["Key"], etag=_strip_etag(item["ETag"]), size=item["Size"])
            for item in response.get("Contents", [])
            if not (item["Key"].endswith("/") and item["Size"] == 0)
        ]
        token = response.get("NextContinuationToken") if response.get("IsTruncated") else None
        return ListObjectsResult(objects=objects, next_token=token)

    def _report_location(self, uri: str) -> tuple[str, str]:
        """Bucket and key of the report ``uri`` to redrive, when the worker may read it (a report
        lies in an output, or was copied into a source)."""
        bucket, _, key = uri.removeprefix("s3://").partition("/")
        check_allowed(self.settings, "outputs", bucket, key, also="sources")
        return bucket, key

    def _read_report(self, uri: str) -> JobReport:
        bucket, key = self._report_location(uri)
        return read_report(self.s3, bucket, key, action="reading the job report to redrive")

    def _list_failed(self, req: ListObjectsInput) -> ListObjectsResult:
        """A page of the files to redrive from an earlier job's report, pinned to their current version:
        those that failed, were cancelled or never started, then, when that job was cancelled before
        its listing ended, the rest of its listing (from where it stopped).

        Continuation tokens: ``"<n>"`` is the n-th file of the report to redrive, ``"s3:<token>"`` a
        position in the rest of the listing (``"s3:"`` its start).
        """
        assert req.report is not None
        report = self._read_report(req.report)
        keys, rest = redrive_plan(report, req.prefix)
        token = req.continuation_token or "0"
        if token.startswith("s3:"):
            page = self._list_page(req.bucket, req.prefix, req.page_size, token[3:] or None)
            return page.model_copy(update={"next_token": None if page.next_token is None else f"s3:{page.next_token}"})
        start = int(token)
        objects = []
        for key in keys[start : start + req.page_size]:
            try:
                head = self.s3.head_object(Bucket=req.bucket, Key=key)
                objects.append(ObjectRef(key=key, etag=_strip_etag(head["ETag"]), size=head["ContentLength"]))
            except ClientError as err:
                if not is_missing_object(err):
                    raise_s3_error(err, "reading", req.bucket, key)
                # Gone since: the file activity reports it as NotFound, like any deleted source.
                objects.append(ObjectRef(key=key, etag="deleted", size=0))
        end = start + req.page_size
        if end < len(keys):
            next_token: str | None = str(end)
        else:
            next_token = None if rest is None else f"s3:{rest}"
        return ListObjectsResult(objects=objects, next_token=next_token)

    # ------------------------------------------------------------------ one file

    @activity.defn(name="s3batch.process_file")
    @boundary(attempt_details=True)
    def process_file(self, req: ProcessFileInput) -> FileResult:
        """Process one object chunk by chunk, resuming from the furthest committed checkpoint.

        Failures carry ``{"attempt": n}`` as details so the job report can say how many attempts
        a failed file had.
        """
        details = activity.info().heartbeat_details
        attempt = {"attempt": activity.info().attempt}
        job: _FileJob | None = None
        try:
            job = _FileJob(self.s3, self.settings, req, details[0] if details else None)
            return job.verify(job.run())
        except (CancelledError, asyncio.CancelledError):
            if not _job_cancelled():
                raise  # worker shutdown, heartbeat timeout, activity paused or reset: Temporal retries
            # The job was cancelled: the file's result says how far it got (the workflow records it).
            cp = job.checkpoint if job is not None else None
            if job is not None and cp is not None and cp.done:
                return job.verify(job.result(cp))
            return _cancelled(req, cp, attempt["attempt"])
        except S3BatchError:
            raise
        except Exception as err:  # noqa: BLE001 - its text may quote record contents
            raise unexpected(err, f"s3://{req.bucket}/{req.obj.key}") from None

    @activity.defn(name="s3batch.process_group")
    @boundary()
    def process_group(self, req: ProcessGroupInput) -> list[FileResult]:
        """Process small objects one after the other. A file that fails for good (changed, missing,
        bad format) is reported failed without failing the group; a transient error fails the
        attempt, and the retry skips the files already done (their final parts are committed).

        The group's output is checked with one LIST at the end (see ``_FileJob.verify``). When the
        job is cancelled meanwhile, the group returns instead of raising: the files it finished as
        ``succeeded``, the others as ``cancelled`` (with their checkpoint's counts, where they have one).
        """
        info = activity.info()
        details = info.heartbeat_details
        resume_index = details[1] if len(details) >= 2 and isinstance(details[1], int) else -1
        items = req.items()
        results: list[FileResult | None] = [None] * len(items)
        jobs: list[_FileJob | None] = [None] * len(items)
        try:
            # One LIST for the whole group: on a first run nothing exists under the files' common
            # output prefix, and no file needs to look for committed parts of its own.
            check_allowed(self.settings, "outputs", req.file.output_bucket, req.file.output_prefix)
            common = os.path.commonprefix([layout.file_dir(i.output_prefix, i.obj.key) for i in items])  # noqa: RUF071 - S3 prefixes are strings
            fresh = not details and not _any_object(self.s3, req.file.output_bucket, common)
            for index, item in enumerate(items):
                hint = details[0] if index == resume_index else None
                try:
                    jobs[index] = job = _FileJob(self.s3, self.settings, item, hint, index, fresh=fresh)
                    results[index] = job.run()
                except S3BatchError as err:
                    if err.retryable:
                        raise
                    results[index] = _failed(item, err, info.attempt)
            return self._verify_group(items, jobs, results, info.attempt)
        except (CancelledError, asyncio.CancelledError):
            if not _job_cancelled():
                raise  # worker shutdown, heartbeat timeout, activity paused or reset: Temporal retries
            return self._cancelled_group(items, jobs, results, info.attempt, details, resume_index)
        except S3BatchError:
            raise
        except Exception as err:  # noqa: BLE001 - its text may quote record contents
            where = f"a group of {len(items)} files from s3://{req.file.bucket}/{req.file.obj.key}"
            raise unexpected(err, where) from None

    def _verify_group(
        self,
        items: list[ProcessFileInput],
        jobs: list[_FileJob | None],
        results: list[FileResult | None],
        attempt: int,
    ) -> list[FileResult]:
        """Check the output of the group's succeeded files with one LIST (see ``_FileJob.verify``)."""
        done = [job.dir for job, r in zip(jobs, results, strict=True) if job and r and r.status == "succeeded"]
        listings = _list_group_outputs(self.s3, items[0].output_bucket, done)
        final: list[FileResult] = []
        for index, result in enumerate(results):
            assert result is not None
            job = jobs[index]
            if job is not None:
                try:
                    result = job.verify(result, listings.get(job.dir))
                except S3BatchError as err:
                    if err.retryable:
                        raise
                    result = _failed(items[index], err, attempt)
            final.append(result)
        return final

    def _cancelled_group(
        self,
        items: list[ProcessFileInput],
        jobs: list[_FileJob | None],
        results: list[FileResult | None],
        attempt: int,
        details: Any,
        resume_index: int,
    ) -> list[FileResult]:
        """The group's results when the job is cancelled: the files it finished (checked like any
        group), and the others ``cancelled`` with the counts of their last checkpoint."""
        for index, item in enumerate(items):
            if results[index] is not None:
                continue
            job = jobs[index]
            cp = job.checkpoint if job is not None else None
            if cp is None and index == resume_index:
                with contextlib.suppress(ValidationError):
                    cp = Checkpoint.model_validate(details[0])
            if job is not None and cp is not None and cp.done:
                # The cancellation arrived just after the file's final part was committed.
                results[index] = job.result(cp)
            else:
                results[index] = _cancelled(item, cp, attempt)
        activity.logger.info(
            "job cancelled: group of %d files stops (%d finished)",
            len(items),
            sum(1 for r in results if r is not None and r.status != "cancelled"),
        )
        # The cancellation has been delivered; nothing more is raised into this thread.
        return self._verify_group(items, jobs, results, attempt)

    # ------------------------------------------------------------------ report

    @activity.defn(name="s3batch.write_report_segment")
    @boundary()
    def write_report_segment(self, req: ReportSegmentInput) -> str:
        """Flush the per-file results of one workflow run (before continue-as-new)."""
        check_allowed(self.settings, "outputs", req.output_bucket, req.output_prefix)
        key = layout.segment_key(req.output_prefix, req.segment)
        self._put(req.output_bucket, key, segment_body(req.files), "application/x-ndjson")
        return key

    @activity.defn(name="s3batch.write_report")
    @boundary()
    def write_report(self, req: FinalReportInput) -> str:
        """Write ``{output_prefix}_report.json``: every file of the job and the totals."""
        job = req.job
        check_allowed(self.settings, "outputs", job.output_bucket, job.output_prefix)
        files: list[dict[str, Any]] = []
        for segment in range(req.segments):
            files.extend(read_segment(self.s3, job.output_bucket, layout.segment_key(job.output_prefix, segment)))
        redriven = None
        if not req.listing_done and job.only_failed_of:
            redriven = self._read_report(job.only_failed_of)
        report = assemble_report(req, files, redriven)
        key = layout.report_key(job.output_prefix)
        self._put(job.output_bucket, key, report.to_json(), "application/json")
        error = books_error(report, job.output_bucket, key)
        if error is not None:
            raise error
        return key

    def _put(self, bucket: str, key: str, body: bytes, content_type: str) -> None:
        try:
            self.s3.put_object(Bucket=bucket, Key=key, Body=body, ContentType=content_type, **sse_params(self.settings))
        except (ClientError, BotoCoreError) as err:
            raise_s3_error(err, "writing", bucket, key)


class _FileJob:
    """One attempt at one file. Write-then-checkpoint: a chunk's part (data + checkpoint metadata)
    is written in one PUT, and only then heartbeated."""

    def __init__(
        self,
        s3: S3Client,
        settings: Settings,
        req: ProcessFileInput,
        heartbeat: Any = None,
        index: int | None = None,
        *,
        fresh: bool = False,
    ) -> None:
        """Args:
        s3: The S3 client.
        settings: The worker's settings (allow-lists, ceilings, output encryption, checkpoint secret).
        req: The file and the job options.
        fresh: Known to have no output yet (its group's output prefix is empty).
        heartbeat: The checkpoint found in the last heartbeat details for this file, if any.
        index: Position of the file in its group; sent along with each heartbeat.
        """
        self.s3 = s3
        self.settings = settings
        self.req = req
        # A workflow input reaches this activity even when check_job was skipped: check again.
        check_allowed(settings, "sources", req.bucket, req.obj.key)
        check_allowed(settings, "outputs", req.output_bucket, req.output_prefix)
        check_ceilings(settings, req.chunk_records, req.max_record_bytes, f"s3://{req.bucket}/{req.obj.key}")
        self._sse = sse_params(settings)
        self._secret = settings.checkpoint_secret.get_secret_value().encode() or None
        self._heartbeat_hint = heartbeat
        self._fresh = fresh
        self._extra = () if index is None else (index,)
        self._beat_at = -_BEAT_INTERVAL
        self._last_commit = time.monotonic()
        self.obj = req.obj
        self.where = f"s3://{req.bucket}/{req.obj.key}"
        self.log_extra = {"s3_key": req.obj.key}
        self.info = activity.info()
        self.handler = get_handler(req.handler)
        # Only a registered handler's name becomes a metrics label.
        self.metrics = _Metrics(req.handler)
        self.fmt, self.gz = resolve_format(req.obj.key, req.format)
        self.fingerprint = layout.fingerprint(
            fmt=self.fmt,
            gzip=self.gz,
            handler=req.handler,
            chunk_records=req.chunk_records,
            max_record_bytes=req.max_record_bytes,
        )
        self.dir = layout.file_dir(req.output_prefix, req.obj.key)
        self._check_key_length()
        self.checkpoint: Checkpoint | None = None
        """The last checkpoint this attempt committed or found committed."""
        self._known: dict[str, tuple[str, Checkpoint]] = {}
        """Output objects of this file known to be ours: name -> (ETag, the checkpoint stored on it)."""
        self._source: Any = None
        self._source_checked = False
        self._one_to_one: bool | None = None
        """Every chunk of this attempt came from a handler that accounts for each record it was
        given (None: no chunk processed)."""
        self._handed = self._handler_rejects = self._dropped = 0
        self._free_form = False
        self.resumed_from = 0
        """``next_record`` this attempt started from."""

    def _check_key_length(self) -> None:
        """Fail at once when the longest key this file can write is over S3's limit (1,024 bytes):
        otherwise it would fail at the first chunk with rejects, after writing parts."""
        # Records are at least one byte each, and deflate expands at most ~1,032 times.
        max_records = self.obj.size * (1032 if self.gz else 1) + 1
        # A chunk holds at least one record and may end before chunk_records at the byte budget
        # (S3BATCH_MAX_CHUNK_BYTES): only the number of records bounds the number of chunks.
        max_chunks = max_records
        longest = layout.longest_output_key(self.req.output_prefix, self.obj.key, max_chunks)
        size = len(longest.encode())
        if size > layout.MAX_KEY_BYTES:
            raise OutputKeyTooLong(
                f"the output keys of {self.where} would be up to {size} bytes, over S3's limit of "
                f"{layout.MAX_KEY_BYTES} bytes (output_prefix: {len(self.req.output_prefix.encode())} bytes, "
                f"the source key: {len(layout.encode_key(self.obj.key).encode())} bytes as written, then "
                f"'/{layout.rejects_name(0)}'); use a shorter output_prefix or a shorter source key. "
                "Nothing was written for this file."
            )

    # ---------------------------------------------------------------- resume

    def _heartbeat_checkpoint(self) -> Checkpoint | None:
        if self._heartbeat_hint is None:
            return None
        try:
            cp = Checkpoint.model_validate(self._heartbeat_hint)
        except ValidationError:
            activity.logger.warning("ignoring unreadable heartbeat details of %s", self.where, extra=self.log_extra)
            return None
        if cp.etag != self.obj.etag or cp.fingerprint != self.fingerprint:
            return None
        return cp

    def _committed(self, chunk: int, kind: str = "part") -> Checkpoint | bool | None:
        """The checkpoint stored on output ``chunk`` (its part, or its rejects): a Checkpoint, None
        if absent, False if it was written for another source version or other options, or, with a
        checkpoint secret (``S3BATCH_CHECKPOINT_SECRET``), when its HMAC is missing or wrong."""
        key = (layout.part_key if kind == "part" else layout.rejects_key)(self.req.output_prefix, self.obj.key, chunk)
        try:
            head = self.s3.head_object(Bucket=self.req.output_bucket, Key=key)
        except ClientError as err:
            if is_missing_object(err):
                return None
            raise_s3_error(err, "reading", self.req.output_bucket, key)
        except BotoCoreError as err:
            raise_s3_error(err, "reading", self.req.output_bucket, key)
        metadata = head.get("Metadata", {})
        raw = metadata.get(layout.CHECKPOINT_METADATA)
        if (
            raw
            and self._secret is not None
            and not layout.checkpoint_mac_ok(
                self._secret, self.req.output_bucket, key, raw, metadata.get(layout.CHECKPOINT_MAC_METADATA)
            )
        ):
            # Written without the workers' secret (by an older release, a worker without the secret,
            # or whoever else can write the output prefix): never trusted, the chunk is processed
            # again and the object replaced.
            activity.logger.warning(
                "%s carries a checkpoint without a valid HMAC (S3BATCH_CHECKPOINT_SECRET): not reused",
                f"s3://{self.req.output_bucket}/{key}",
                extra=self.log_extra,
            )
            return False
        try:
            cp = Checkpoint.model_validate_json(raw) if raw else None
        except ValidationError:
            cp = None
        if cp is None or cp.etag != self.obj.etag or cp.fingerprint != self.fingerprint or cp.chunk != chunk + 1:
            return False
        self._known[key[len(self.dir) :]] = (_strip_etag(head.get("ETag", "")), cp)
        return cp

    def _resume_point(self) -> Checkpoint:
        """The furthest of the heartbeat checkpoint and the last contiguous committed part.

        The heartbeat is throttled, so after a crash the parts written since the last heartbeat
        that reached the server are found by probing part ``n``, ``n+1``... until one is missing or
        was written for another source version or other options. Nothing is deleted here: output
        that is not this version's is overwritten or removed by ``verify`` once the file is done
        (and the source confirmed), so a deleted or changed source never costs committed output.
        """
        cp = self._heartbeat_checkpoint()
        if cp is None:
            cp = Checkpoint(
                etag=self.obj.etag,
                version_id=self.obj.version_id,
                fingerprint=self.fingerprint,
                byte_offset=None if self.gz else 0,
            )
            if self._fresh or not _any_object(self.s3, self.req.output_bucket, self.dir):
                return cp  # a fresh file: nothing to probe (the common case, one request)
        while not cp.done:
            found = self._committed(cp.chunk)
            if not isinstance(found, Checkpoint):
                break
            cp = found.model_copy(update={"version_id": cp.version_id or found.version_id})
        return cp

    def _confirm_source(self) -> None:
        """Make sure the source still is the listed version (one pinned HEAD, unless a pinned read
        already succeeded). Raises ``NotFound`` / ``SourceChanged``."""
        if self._source_checked or (self._source is not None and self._source.checked):
            return
        version = self.checkpoint.version_id if self.checkpoint else self.obj.version_id
        head_pinned(self.s3, self.req.bucket, self.obj.key, etag=self.obj.etag, version_id=version)
        self._source_checked = True

    def verify(self, result: FileResult, listed: dict[str, str] | None = None) -> FileResult:
        """Check that the file's output folder holds exactly its parts ``0..n-1`` and the rejects of
        the chunks that had rejects, all of this source version and these options; remove anything
        else (left by another version or options, or by an interrupted cleanup).

        ``listed`` is the folder's listing (name -> ETag) from the group's LIST; without it, or when
        something seems missing from it, the folder is listed on its own. An object is this
        version's when its ETag is the one this attempt wrote or read it with, else when the
        checkpoint stored on it says so (one HEAD each: parts written by an earlier attempt). A
        missing or foreign part or rejects object is an ``AccountingError``.
        """
        cp = self.checkpoint
        if result.status != "succeeded" or cp is None:
            return result
        if listed is not None and not all(layout.part_name(c) in listed for c in range(cp.chunk)):
            listed = None  # the group's LIST did not cover this folder (another key order)
        if listed is None:
            listed = _list_outputs(self.s3, self.req.output_bucket, self.dir)
        n = cp.chunk
        expected: set[str] = set()
        previous_rejected = 0
        problems: list[str] = []
        for chunk in range(n):
            name = layout.part_name(chunk)
            expected.add(name)
            part_cp = self._ours(name, chunk, "part", listed.get(name))
            if part_cp is None:
                problems.append(f"{name} is {'missing' if name not in listed else 'not of this version'}")
                continue
            if part_cp.rejected > previous_rejected:
                rejects = layout.rejects_name(chunk)
                expected.add(rejects)
                if self._ours(rejects, chunk, "rejects", listed.get(rejects)) is None:
                    problems.append(f"{rejects} is {'missing' if rejects not in listed else 'not of this version'}")
            previous_rejected = part_cp.rejected
        if problems:
            raise AccountingError(
                f"accounting error in the output of {self.where} under s3://{self.req.output_bucket}/{self.dir}: "
                f"{'; '.join(problems)} (expected parts 0-{n - 1} of this version). The output was changed "
                "while the file was processed, or this is a bug in s3batch; process the file again "
                "(a redrive) and report it if it repeats."
            )
        stale = sorted(name for name in listed if layout.output_index(name) is not None and name not in expected)
        if stale:
            self._confirm_source()
            delete_keys(self.s3, self.req.output_bucket, [self.dir + name for name in stale])
            activity.logger.info(
                "removed %d output objects of %s that were not of this version (e.g. %s)",
                len(stale),
                self.where,
                stale[0],
                extra=self.log_extra,
            )
        return result

    def _ours(self, name: str, chunk: int, kind: str, etag: str | None) -> Checkpoint | None:
        """The checkpoint of output ``name`` when it is this version's (see ``verify``), else None."""
        if etag is None:
            return None
        known = self._known.get(name)
        if known is not None and known[0] == etag:
            return known[1]
        found = self._committed(chunk, kind)
        return found if isinstance(found, Checkpoint) else None

    # ---------------------------------------------------------------- processing

    def run(self) -> FileResult:
        cp = self._resume_point()
        self.checkpoint = cp
        self.resumed_from = resumed_from = cp.next_record
        if resumed_from:
            self.metrics.resumes.add(1)
            activity.logger.info(
                "resuming %s at record %d (chunk %d)", self.where, cp.next_record, cp.chunk, extra=self.log_extra
            )
        if cp.done:
            self._confirm_source()  # found complete: still one request pinned to the listed version
        else:
            cp = self._process_from(cp)
        self._check_records(cp)
        activity.logger.info(
            "finished %s: %d records written, %d rejected, %d dropped, %d chunks",
            self.where,
            cp.records_written,
            cp.rejected,
            cp.dropped,
            cp.chunk,
            extra=self.log_extra,
        )
        return self.result(cp)

    def result(self, cp: Checkpoint) -> FileResult:
        """The result of the file, complete at ``cp``."""
        return FileResult(
            key=self.obj.key,
            etag=self.obj.etag,
            status="succeeded",
            records=cp.next_record,
            records_written=cp.records_written,
            rejected=cp.rejected,
            dropped=cp.dropped,
            bytes_read=self.obj.size,
            chunks=cp.chunk,
            attempts=self.info.attempt,
            resumed_from_record=self.resumed_from,
        )

    def _check_records(self, cp: Checkpoint) -> None:
        """Records read = written + rejected + dropped, for handlers that account for each record."""
        if self._one_to_one and cp.next_record != cp.records_written + cp.rejected + cp.dropped:
            raise self._accounting_error(
                f"{cp.next_record} records read, but {cp.records_written} written + {cp.rejected} rejected + "
                f"{cp.dropped} dropped = {cp.records_written + cp.rejected + cp.dropped}"
            )

    def _accounting_error(self, what: str) -> AccountingError:
        return AccountingError(
            f"accounting error in {self.where} (handler {self.req.handler!r}): {what}. A handler returning "
            "HandlerResult(..., dropped=n) must account for every record it is given (outputs + rejects + "
            "dropped); otherwise this is a bug in s3batch, please report it."
        )

    def _open(self, start: int, window: int = 16 * 1024 * 1024) -> io.BufferedReader:
        return open_object(
            self.s3,
            self.req.bucket,
            self.obj.key,
            etag=self.obj.etag,
            size=self.obj.size,
            version_id=self._version_id,
            start=start,
            window=window,
        )

    def _records(self, cp: Checkpoint, stack: contextlib.ExitStack) -> tuple[Iterator[Record], Any]:
        """An iterator of the records from ``cp`` on, and the parser (for offsets and lines)."""
        max_bytes = self.req.max_record_bytes
        if self.gz:
            raw = stack.enter_context(self._open(0))
            self._source = raw.raw
            stream: Any = stack.enter_context(gzip.GzipFile(fileobj=raw, mode="rb"))
            parser = make_parser(self.fmt, stream, max_line_bytes=max_bytes)
            records = iter(parser)
            # A gzip stream cannot be entered mid-way: decompress and skip what is already written.
            skipped = sum(1 for _ in islice(records, cp.next_record))
            if skipped != cp.next_record:
                raise BadFile(
                    f"{self.where} has fewer records ({skipped}) than its checkpoint ({cp.next_record})"
                )
            return records, parser
        offset = cp.byte_offset or 0
        header = None
        if self.fmt == "csv" and offset > 0:
            with self._open(0, window=64 * 1024) as head_stream:
                header = read_csv_header(head_stream, max_bytes)
        stream = stack.enter_context(self._open(offset))
        self._source = stream.raw
        parser = make_parser(self.fmt, stream, offset=offset, line=cp.line, header=header, max_line_bytes=max_bytes)
        return iter(parser), parser

    def _process_from(self, cp: Checkpoint) -> Checkpoint:
        if not self.gz:
            return self._chunks_from(cp)
        try:
            return self._chunks_from(cp)
        except (gzip.BadGzipFile, EOFError, zlib.error) as err:
            raise self._bad_gzip(err) from None

    def _bad_gzip(self, err: Exception) -> BadFile:
        """A corrupt or truncated ``.gz``: a bad file, not worth retrying. Never quotes its bytes."""
        at = self._source.position if self._source is not None else 0
        cp = self.checkpoint
        records = cp.next_record if cp else 0
        if isinstance(err, EOFError):
            what = "is truncated: its gzip stream ends before the end-of-stream marker"
        elif isinstance(err, zlib.error):
            what = f"holds corrupt compressed data ({str(err).split(':')[-1].strip()})"
        elif str(err).startswith("Not a gzipped file"):
            what = "is not gzip data (it does not start with the gzip signature 1f 8b)"
        else:
            what = f"is corrupt gzip ({str(err).split('(')[0].strip()})"
        return BadFile(
            f"{self.where} {what}, near compressed byte {at} ({records} records committed before). "
            "Upload it again, or give it a name without '.gz' if it is not compressed; retrying cannot fix it."
        )

    def _chunks_from(self, cp: Checkpoint) -> Checkpoint:
        self._version_id = cp.version_id
        req = self.req
        handler = self._counted
        sub_batch = min(req.chunk_records, _SUB_BATCH)
        budget = self.settings.max_chunk_bytes
        self._beat(cp)
        with contextlib.ExitStack() as stack:
            try:
                records, parser = self._records(cp, stack)
            except ValueError as err:  # an unreadable CSV header
                raise BadFile(f"{self.where}: {err}") from None
            lookahead: list[Record] = []
            chunk_start = parser.offset  # bytes of the (decompressed) source read before this chunk
            while True:
                self._stop_if_asked(cp)
                # Cancellation is delivered at the end of this block: after the part is written and
                # checkpointed, never in the middle of a chunk's PUT.
                with activity.shield_thread_cancel_exception():
                    output: list[bytes] = []
                    rejects: list[tuple[int, bytes]] = []
                    taken = buffered = 0
                    # A chunk ends after chunk_records records, or once its source bytes or its
                    # buffered output reach the worker's byte budget (S3BATCH_MAX_CHUNK_BYTES): its
                    # checkpoint is exact either way, and memory stays about the budget.
                    while taken < req.chunk_records and buffered < budget and parser.offset - chunk_start < budget:
                        want = min(sub_batch, req.chunk_records - taken) - len(lookahead)
                        # A sub-batch reads at most 1/16 of the budget, so the output check between
                        # two of them bounds what a handler's outputs can add.
                        until = min(chunk_start + budget, parser.offset + max(budget // 16, 1))
                        batch = lookahead + (_take(records, parser, want, until) if want > 0 else [])
                        lookahead = []
                        if not batch:
                            break
                        taken += len(batch)
                        buffered += self._handle(handler, batch, output, rejects)
                        self._beat(cp)  # liveness; the SDK throttles what reaches the server
                    end_offset = None if self.gz else parser.offset
                    end_line = parser.line
                    chunk_start = parser.offset
                    lookahead = list(islice(records, 1))
                    done = not lookahead
                    cp = self._commit(cp, taken, output, rejects, end_offset, end_line, done)
                    self._beat(cp, force=True)  # every committed checkpoint
                if done:
                    return cp

    def _handle(
        self, handler: Any, batch: list[Record], output: list[bytes], rejects: list[tuple[int, bytes]]
    ) -> int:
        """Run the handler on the parsed records of ``batch``; append JSON-encoded outputs and rejects
        (as ``(line, JSON line)``). Returns the bytes appended."""
        good = batch
        before = len(rejects)
        if any(r.error is not None for r in batch):
            good = []
            parser_rejects = []
            for r in batch:
                if r.error is None:
                    good.append(r)
                else:
                    parser_rejects.append(Reject(r.line, r.error))
            self._add_rejects(parser_rejects, rejects)
        if not good:
            return sum(len(b) for _, b in rejects[before:])
        try:
            result: HandlerResult = handler(good)
        except Exception as err:  # noqa: BLE001 - any handler error fails the attempt, without its text
            # The message reaches workflow history and the report: name the error, never its text,
            # which may quote record contents (pydantic errors are listed by field, without input).
            reason = describe_validation_error(err) if isinstance(err, ValidationError) else type(err).__name__
            raise HandlerError(
                f"handler {self.req.handler!r} raised {reason} on {self.where} lines "
                f"{good[0].line}-{good[-1].line}; the whole chunk is retried. Reproduce it locally on "
                "those lines to see the record."
            ) from None
        encoded = result.output if result.encoded else self._encoded(result.output, "returned a value")
        output.extend(encoded)
        self._add_rejects(result.rejects, rejects)
        return sum(len(b) for b in encoded) + sum(len(b) for _, b in rejects[before:])

    def _add_rejects(self, found: list[Reject], rejects: list[tuple[int, bytes]]) -> None:
        documents = ({"line": r.line, "reason": r.reason, "record": r.value} for r in found)
        lines = self._encoded(documents, "rejected a record")
        rejects.extend(zip((r.line for r in found), lines, strict=True))

    def _encoded(self, values: Iterable[Any], what: str) -> list[bytes]:
        """``values`` as JSON documents; a value that is not JSON fails the file (``BadFile``), naming
        its type, never the value."""
        try:
            return [encode_json(v) for v in values]
        except TypeError as err:
            text = str(err)
            reason = text if text.startswith(_JSON_TYPE_ERRORS) else type(err).__name__
            raise BadFile(
                f"handler {self.req.handler!r} {what} that is not JSON-serialisable for {self.where} ({reason})"
            ) from None

    def _commit(
        self,
        cp: Checkpoint,
        taken: int,
        output: list[bytes],
        rejects: list[tuple[int, bytes]],
        end_offset: int | None,
        end_line: int,
        done: bool,
    ) -> Checkpoint:
        """Write the chunk's rejects, then its part carrying the new checkpoint (the commit point)."""
        req = self.req
        new = cp.model_copy(
            update={
                "next_record": cp.next_record + taken,
                "byte_offset": end_offset,
                "line": end_line,
                "chunk": cp.chunk + 1,
                # Pinned by the first read on a versioned bucket; later attempts read that version.
                "version_id": cp.version_id or self._source.version_id,
                "records_written": cp.records_written + len(output),
                "rejected": cp.rejected + len(rejects),
                "dropped": cp.dropped + self._dropped,
                "done": done,
            }
        )
        self._check_chunk(cp, taken, len(output), len(rejects))
        if rejects:
            rejects.sort(key=lambda r: r[0])  # parser and handler rejects, in file order
            body = b"".join(line + b"\n" for _, line in rejects)
            self._put(layout.rejects_key(req.output_prefix, self.obj.key, cp.chunk), body, new)
        body = b"\n".join(output) + b"\n" if output else b""
        self._put(layout.part_key(req.output_prefix, self.obj.key, cp.chunk), body, new)
        self.checkpoint = new
        now = time.monotonic()
        metrics = self.metrics
        metrics.records.add(taken)
        if rejects:
            metrics.rejected.add(len(rejects))
        if new.byte_offset is not None and cp.byte_offset is not None:
            metrics.bytes_read.add(new.byte_offset - cp.byte_offset)
        metrics.chunks.add(1)
        metrics.checkpoint_age.record(now - self._last_commit)
        self._last_commit = now
        return new

    def _put(self, key: str, body: bytes, cp: Checkpoint) -> None:
        kwargs: dict[str, Any] = {
            "Bucket": self.req.output_bucket,
            "Key": key,
            "Body": body,
            "ContentType": "application/x-ndjson",
            **self._sse,
        }
        raw = cp.model_dump_json()
        kwargs["Metadata"] = {layout.CHECKPOINT_METADATA: raw}
        if self._secret is not None:
            mac = layout.checkpoint_mac(self._secret, self.req.output_bucket, key, raw)
            kwargs["Metadata"][layout.CHECKPOINT_MAC_METADATA] = mac
        try:
            response = self.s3.put_object(**kwargs)
        except (ClientError, BotoCoreError) as err:
            raise_s3_error(err, "writing", self.req.output_bucket, key)
        self._known[key[len(self.dir) :]] = (_strip_etag(response.get("ETag", "")), cp)

    def _counted(self, records: Sequence[Record]) -> HandlerResult:
        """The job's handler, counting what it was given, rejected and dropped (for ``_check_chunk``).

        Its outputs and rejects are read here, inside ``_handle``'s guard: a lazy iterator that
        raises while it is consumed fails like a handler that raised (its error never quoted)."""
        result = self.handler(records)
        result = HandlerResult(
            list(result.output),
            list(result.rejects),
            getattr(result, "encoded", False),
            getattr(result, "dropped", None),
        )
        self._handed += len(records)
        self._handler_rejects += len(result.rejects)
        dropped = getattr(result, "dropped", None)
        if dropped is None:
            self._free_form = True
        else:
            self._dropped += dropped
        return result

    def _check_chunk(self, cp: Checkpoint, taken: int, outputs: int, rejects: int) -> None:
        """Before a chunk is committed: every record read is accounted for.

        Records read = parser rejects + records given to the handler. A handler that reports its
        ``dropped`` count (record handlers, ``passthrough``, ``customers``) must account for each
        record it was given: outputs + its rejects + dropped = given. A chunk handler that does not
        (``dropped`` None: fan-out, aggregation) may emit any number of outputs; only its rejects are
        checked, at most one per record given.
        """
        handed, handler_rejects, dropped, free = self._handed, self._handler_rejects, self._dropped, self._free_form
        self._handed = self._handler_rejects = self._dropped = 0
        self._free_form = False
        parser_rejects = rejects - handler_rejects
        problem = None
        if parser_rejects < 0 or parser_rejects + handed != taken:
            problem = f"{taken} records read, {parser_rejects} rejected by the parser, {handed} given to the handler"
        elif free:
            if handler_rejects > handed:
                problem = f"the handler rejected {handler_rejects} of the {handed} records it was given"
        elif outputs + handler_rejects + dropped != handed:
            problem = (
                f"the handler was given {handed} records but returned {outputs} outputs + {handler_rejects} "
                f"rejects + {dropped} dropped"
            )
        if problem:
            raise self._accounting_error(f"chunk {cp.chunk} (lines from {cp.line}): {problem}")
        self._one_to_one = not free and self._one_to_one is not False

    def _beat(self, cp: Checkpoint, *, force: bool = False) -> None:
        """Heartbeat ``cp``: always when forced (a committed checkpoint), else at most every
        ``_BEAT_INTERVAL`` seconds (liveness within a chunk, the start of a file).

        Each call costs about 0.2 ms (a hand-over to the event loop) and the SDK sends at most one
        per 0.8 x heartbeat timeout anyway.
        """
        now = time.monotonic()
        if force or now - self._beat_at >= _BEAT_INTERVAL:
            self._beat_at = now
            activity.heartbeat(cp, *self._extra)

    def _stop_if_asked(self, cp: Checkpoint) -> None:
        """At a chunk boundary: hand the file over when the worker is shutting down."""
        if activity.is_worker_shutdown():
            self._beat(cp, force=True)
            activity.logger.info(
                "worker shutting down: %s stops at record %d", self.where, cp.next_record, extra=self.log_extra
            )
            raise WorkerShutdown(f"worker shutting down; {self.where} continues elsewhere from record {cp.next_record}")

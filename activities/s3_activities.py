"""The activities of s3batch: list a prefix, process one file resumably, write the report.

All of them are synchronous (boto3 blocks) and run in the worker's thread pool. One S3 client is
built by the worker and shared: boto3 clients are thread-safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import gzip
import io
import json
import os
import time
from collections.abc import Iterator
from itertools import islice
from typing import Any

import orjson
from botocore.exceptions import BotoCoreError, ClientError
from pydantic import ValidationError
from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory, CancelledError

from s3batch import layout
from s3batch.handlers import HandlerResult, Reject, UnknownHandlerError, get_handler
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
from s3batch.records import Record, UnknownFormatError, make_parser, read_csv_header, resolve_format
from s3batch.s3io import (
    BAD_FILE,
    INVALID_INPUT,
    NON_RETRYABLE_TYPES,
    UNKNOWN_HANDLER,
    WORKER_SHUTDOWN,
    S3Client,
    is_missing_object,
    open_object,
    raise_s3_error,
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


class S3Activities:
    """Activities bound to one S3 client.

    Args:
        s3: A boto3 S3 client (``s3batch.s3io.make_client()`` builds one from the environment).
    """

    def __init__(self, s3: S3Client) -> None:
        self.s3 = s3
        self.search_attributes_registered = False
        """Set by the worker once s3batch's search attributes are known to exist."""

    # ------------------------------------------------------------------ job checks and listing

    @activity.defn(name="s3batch.check_job")
    def check_job(self, job: JobSpec) -> JobCheck:
        """Fail fast, before any file runs, on a job that cannot work: unknown handler or format,
        missing or unreadable buckets."""
        try:
            get_handler(job.handler)
        except UnknownHandlerError as err:
            raise ApplicationError(str(err.args[0]), type=UNKNOWN_HANDLER, non_retryable=True) from None
        try:
            self.s3.list_objects_v2(Bucket=job.bucket, Prefix=job.prefix, MaxKeys=1)
        except (ClientError, BotoCoreError) as err:
            raise_s3_error(err, "listing", job.bucket, job.prefix or None)
        # The bucket must exist (some S3 servers create it on the first PUT), and a tiny write proves
        # it is writable before any file is read (a read-only bucket would otherwise fail every
        # file, and then the report).
        probe = layout.write_check_key(job.output_prefix)
        try:
            self.s3.head_bucket(Bucket=job.output_bucket)
        except (ClientError, BotoCoreError) as err:
            raise_s3_error(err, "checking the output bucket", job.output_bucket)
        try:
            self.s3.put_object(Bucket=job.output_bucket, Key=probe, Body=b"", ContentType="text/plain")
        except (ClientError, BotoCoreError) as err:
            raise_s3_error(err, "writing", job.output_bucket, probe)
        if job.only_failed_of:
            self._read_report(job.only_failed_of)
        return JobCheck(search_attributes=self.search_attributes_registered)

    @activity.defn(name="s3batch.list_objects")
    def list_objects(self, req: ListObjectsInput) -> ListObjectsResult:
        """One page of ListObjectsV2. Folder markers (``key/`` of size 0) are skipped."""
        if req.report:
            return self._list_failed(req)
        kwargs: dict[str, Any] = {"Bucket": req.bucket, "Prefix": req.prefix, "MaxKeys": req.page_size}
        if req.continuation_token:
            kwargs["ContinuationToken"] = req.continuation_token
        try:
            response = self.s3.list_objects_v2(**kwargs)
        except (ClientError, BotoCoreError) as err:
            raise_s3_error(err, "listing", req.bucket, req.prefix or None)
        objects = [
            ObjectRef(key=item["Key"], etag=_strip_etag(item["ETag"]), size=item["Size"])
            for item in response.get("Contents", [])
            if not (item["Key"].endswith("/") and item["Size"] == 0)
        ]
        token = response.get("NextContinuationToken") if response.get("IsTruncated") else None
        return ListObjectsResult(objects=objects, next_token=token)

    def _read_report(self, uri: str) -> dict[str, Any]:
        bucket, _, key = uri.removeprefix("s3://").partition("/")
        try:
            body = self.s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        except (ClientError, BotoCoreError) as err:
            raise_s3_error(err, "reading the job report to redrive", bucket, key)
        try:
            report = json.loads(body)
        except ValueError:
            report = None
        if not isinstance(report, dict) or not isinstance(report.get("files"), list):
            raise ApplicationError(
                f"{uri} is not an s3batch job report (no 'files' list)", type=INVALID_INPUT, non_retryable=True
            )
        return report

    def _list_failed(self, req: ListObjectsInput) -> ListObjectsResult:
        """A page of the files that failed in an earlier job, pinned to their current version."""
        assert req.report is not None
        keys = [
            f["key"]
            for f in self._read_report(req.report)["files"]
            if f.get("status") in ("failed", "cancelled") and f["key"].startswith(req.prefix)
        ]
        start = int(req.continuation_token or 0)
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
        return ListObjectsResult(objects=objects, next_token=str(end) if end < len(keys) else None)

    # ------------------------------------------------------------------ one file

    @activity.defn(name="s3batch.process_file")
    def process_file(self, req: ProcessFileInput) -> FileResult:
        """Process one object chunk by chunk, resuming from the furthest committed checkpoint.

        Failures carry ``{"attempt": n}`` as details so the job report can say how many attempts
        a failed file had.
        """
        details = activity.info().heartbeat_details
        attempt = {"attempt": activity.info().attempt}
        try:
            return _FileJob(self.s3, req, details[0] if details else None).run()
        except ApplicationError as err:
            raise ApplicationError(
                err.message,
                attempt,
                type=err.type,
                non_retryable=err.non_retryable,
                next_retry_delay=err.next_retry_delay,
                category=err.category,
            ) from err
        except (CancelledError, asyncio.CancelledError):
            raise
        except Exception as err:
            raise ApplicationError(
                f"unexpected error processing s3://{req.bucket}/{req.obj.key}: {type(err).__name__}: {err}",
                attempt,
                type=type(err).__name__,
            ) from err

    @activity.defn(name="s3batch.process_group")
    def process_group(self, req: ProcessGroupInput) -> list[FileResult]:
        """Process small objects one after the other. A file that fails for good (changed, missing,
        bad format) is reported failed without failing the group; a transient error fails the
        attempt, and the retry skips the files already done (their final parts are committed)."""
        info = activity.info()
        details = info.heartbeat_details
        resume_index = details[1] if len(details) >= 2 and isinstance(details[1], int) else -1
        items = req.items()
        # One LIST for the whole group: on a first run nothing exists under the files' common output
        # prefix, and no file needs to look for committed parts of its own.
        common = os.path.commonprefix([layout.file_dir(i.output_prefix, i.obj.key) for i in items])  # noqa: RUF071 - S3 prefixes are strings
        fresh = not details and not _any_object(self.s3, req.file.output_bucket, common)
        results: list[FileResult] = []
        for index, item in enumerate(items):
            hint = details[0] if index == resume_index else None
            try:
                results.append(_FileJob(self.s3, item, hint, index, fresh=fresh).run())
            except ApplicationError as err:
                if not (err.non_retryable or err.type in NON_RETRYABLE_TYPES):
                    raise
                results.append(
                    FileResult(
                        key=item.obj.key,
                        etag=item.obj.etag,
                        status="failed",
                        attempts=info.attempt,
                        error=f"{err.type}: {err.message}",
                    )
                )
        return results

    # ------------------------------------------------------------------ report

    @activity.defn(name="s3batch.write_report_segment")
    def write_report_segment(self, req: ReportSegmentInput) -> str:
        """Flush the per-file results of one workflow run (before continue-as-new)."""
        key = layout.segment_key(req.output_prefix, req.segment)
        body = b"".join(orjson.dumps(f.model_dump(mode="json")) + b"\n" for f in req.files)
        self._put(req.output_bucket, key, body, "application/x-ndjson")
        return key

    @activity.defn(name="s3batch.write_report")
    def write_report(self, req: FinalReportInput) -> str:
        """Write ``{output_prefix}_report.json``: every file of the job and the totals."""
        job = req.job
        files: list[Any] = []
        for segment in range(req.segments):
            key = layout.segment_key(job.output_prefix, segment)
            try:
                body = self.s3.get_object(Bucket=job.output_bucket, Key=key)["Body"].read()
            except (ClientError, BotoCoreError) as err:
                raise_s3_error(err, "reading report segment", job.output_bucket, key)
            files.extend(orjson.loads(line) for line in body.splitlines() if line)
        files.extend(f.model_dump(mode="json") for f in req.files)
        report = {
            "job_id": req.job_id,
            "status": req.status,
            "finished_at": datetime.datetime.now(datetime.UTC).isoformat(),
            "source": f"s3://{job.bucket}/{job.prefix}",
            "output": f"s3://{job.output_bucket}/{job.output_prefix}",
            "input": job.model_dump(mode="json"),
            "totals": req.totals.model_dump(mode="json"),
            "files": files,
        }
        key = layout.report_key(job.output_prefix)
        self._put(job.output_bucket, key, json.dumps(report, indent=1).encode(), "application/json")
        return key

    def _put(self, bucket: str, key: str, body: bytes, content_type: str) -> None:
        try:
            self.s3.put_object(Bucket=bucket, Key=key, Body=body, ContentType=content_type)
        except (ClientError, BotoCoreError) as err:
            raise_s3_error(err, "writing", bucket, key)


class _FileJob:
    """One attempt at one file. Write-then-checkpoint: a chunk's part (data + checkpoint metadata)
    is written in one PUT, and only then heartbeated."""

    def __init__(
        self,
        s3: S3Client,
        req: ProcessFileInput,
        heartbeat: Any = None,
        index: int | None = None,
        *,
        fresh: bool = False,
    ) -> None:
        """Args:
        s3: The S3 client.
        req: The file and the job options.
        fresh: Known to have no output yet (its group's output prefix is empty).
        heartbeat: The checkpoint found in the last heartbeat details for this file, if any.
        index: Position of the file in its group; sent along with each heartbeat.
        """
        self.s3 = s3
        self.req = req
        self._heartbeat_hint = heartbeat
        self._fresh = fresh
        self._extra = () if index is None else (index,)
        self._beat_at = -_BEAT_INTERVAL
        self.metrics = _Metrics(req.handler)
        self._last_commit = time.monotonic()
        self.obj = req.obj
        self.where = f"s3://{req.bucket}/{req.obj.key}"
        self.log_extra = {"s3_key": req.obj.key}
        self.info = activity.info()
        try:
            self.handler = get_handler(req.handler)
        except UnknownHandlerError as err:
            raise ApplicationError(str(err.args[0]), type=UNKNOWN_HANDLER, non_retryable=True) from None
        try:
            self.fmt, self.gz = resolve_format(req.obj.key, req.format)
        except UnknownFormatError as err:
            raise ApplicationError(str(err), type=BAD_FILE, non_retryable=True) from None
        self.fingerprint = layout.fingerprint(
            fmt=self.fmt,
            gzip=self.gz,
            handler=req.handler,
            chunk_records=req.chunk_records,
            max_record_bytes=req.max_record_bytes,
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
        if absent, False if it was written for another source version or other options."""
        key = (layout.part_key if kind == "part" else layout.rejects_key)(self.req.output_prefix, self.obj.key, chunk)
        try:
            head = self.s3.head_object(Bucket=self.req.output_bucket, Key=key)
        except ClientError as err:
            if is_missing_object(err):
                return None
            raise_s3_error(err, "reading", self.req.output_bucket, key)
        except BotoCoreError as err:
            raise_s3_error(err, "reading", self.req.output_bucket, key)
        raw = head.get("Metadata", {}).get(layout.CHECKPOINT_METADATA)
        try:
            cp = Checkpoint.model_validate_json(raw) if raw else None
        except ValidationError:
            cp = None
        if cp is None or cp.etag != self.obj.etag or cp.fingerprint != self.fingerprint or cp.chunk != chunk + 1:
            return False
        return cp

    def _resume_point(self) -> Checkpoint:
        """The furthest of the heartbeat checkpoint and the last contiguous committed part.

        The heartbeat is throttled, so after a crash the parts written since the last heartbeat
        that reached the server are found by probing part ``n``, ``n+1``... until one is missing.
        """
        cp = self._heartbeat_checkpoint()
        if cp is None:
            cp = Checkpoint(
                etag=self.obj.etag,
                version_id=self.obj.version_id,
                fingerprint=self.fingerprint,
                byte_offset=None if self.gz else 0,
            )
            if self._fresh or not _any_object(
                self.s3, self.req.output_bucket, layout.file_dir(self.req.output_prefix, self.obj.key)
            ):
                return cp  # a fresh file: nothing to probe (the common case, one request)
        while not cp.done:
            found = self._committed(cp.chunk)
            if found is None:
                # Rejects are written just before their part: a crash between the two PUTs of a run
                # on another source version leaves rejects that this run must not keep.
                if self._committed(cp.chunk, "rejects") is False:
                    self._delete_outputs_from(cp.chunk)
                break
            if found is False:
                # Output left by a run with another source version or options: not ours to keep.
                self._delete_outputs_from(cp.chunk)
                break
            assert isinstance(found, Checkpoint)
            cp = found.model_copy(update={"version_id": cp.version_id or found.version_id})
        return cp

    def _delete_outputs_from(self, chunk: int) -> None:
        prefix = layout.file_dir(self.req.output_prefix, self.obj.key)
        stale: list[dict[str, str]] = []
        try:
            for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.req.output_bucket, Prefix=prefix):
                for item in page.get("Contents", []):
                    name = item["Key"][len(prefix) :]
                    index = layout.output_index(name)
                    if "/" not in name and index is not None and index >= chunk:
                        stale.append({"Key": item["Key"]})
            for start in range(0, len(stale), 1000):
                self.s3.delete_objects(Bucket=self.req.output_bucket, Delete={"Objects": stale[start : start + 1000]})
        except (ClientError, BotoCoreError) as err:
            raise_s3_error(err, "deleting stale output under", self.req.output_bucket, prefix)
        activity.logger.info(
            "removed %d stale output objects of %s from chunk %d", len(stale), self.where, chunk, extra=self.log_extra
        )

    # ---------------------------------------------------------------- processing

    def run(self) -> FileResult:
        cp = self._resume_point()
        resumed_from = cp.next_record
        if resumed_from:
            self.metrics.resumes.add(1)
            activity.logger.info(
                "resuming %s at record %d (chunk %d)", self.where, cp.next_record, cp.chunk, extra=self.log_extra
            )
        if not cp.done:
            cp = self._process_from(cp)
        activity.logger.info(
            "finished %s: %d records written, %d rejected, %d chunks",
            self.where,
            cp.records_written,
            cp.rejected,
            cp.chunk,
            extra=self.log_extra,
        )
        return FileResult(
            key=self.obj.key,
            etag=self.obj.etag,
            status="succeeded",
            records=cp.records_written + cp.rejected,
            records_written=cp.records_written,
            rejected=cp.rejected,
            bytes_read=self.obj.size,
            chunks=cp.chunk,
            attempts=self.info.attempt,
            resumed_from_record=resumed_from,
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
                raise ApplicationError(
                    f"{self.where} has fewer records ({skipped}) than its checkpoint ({cp.next_record})",
                    type=BAD_FILE,
                    non_retryable=True,
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
        self._version_id = cp.version_id
        req = self.req
        handler = self.handler
        sub_batch = min(req.chunk_records, _SUB_BATCH)
        self._beat(cp)
        with contextlib.ExitStack() as stack:
            try:
                records, parser = self._records(cp, stack)
            except ValueError as err:  # an unreadable CSV header
                raise ApplicationError(f"{self.where}: {err}", type=BAD_FILE, non_retryable=True) from None
            lookahead: list[Record] = []
            while True:
                self._stop_if_asked(cp)
                # Cancellation is delivered at the end of this block: after the part is written and
                # checkpointed, never in the middle of a chunk's PUT.
                with activity.shield_thread_cancel_exception():
                    output: list[bytes] = []
                    rejects: list[Reject] = []
                    taken = 0
                    while taken < req.chunk_records:
                        want = min(sub_batch, req.chunk_records - taken) - len(lookahead)
                        batch = lookahead + list(islice(records, want))
                        lookahead = []
                        if not batch:
                            break
                        taken += len(batch)
                        self._handle(handler, batch, output, rejects)
                        self._beat(cp)  # liveness; the SDK throttles what reaches the server
                    end_offset = None if self.gz else parser.offset
                    end_line = parser.line
                    lookahead = list(islice(records, 1))
                    done = not lookahead
                    cp = self._commit(cp, taken, output, rejects, end_offset, end_line, done)
                    self._beat(cp, force=True)  # every committed checkpoint
                if done:
                    return cp

    def _handle(self, handler: Any, batch: list[Record], output: list[bytes], rejects: list[Reject]) -> None:
        """Run the handler on the parsed records of ``batch``; append JSON-encoded outputs and rejects."""
        good = batch
        if any(r.error is not None for r in batch):
            good = []
            for r in batch:
                if r.error is None:
                    good.append(r)
                else:
                    rejects.append(Reject(r.line, r.error))
        if not good:
            return
        try:
            result: HandlerResult = handler(good)
        except Exception as err:  # noqa: BLE001 - any handler error fails the attempt, without its text
            # The message reaches workflow history and the report: name the error, never its text,
            # which may quote record contents (pydantic errors are listed by field, without input).
            reason = describe_validation_error(err) if isinstance(err, ValidationError) else type(err).__name__
            raise ApplicationError(
                f"handler {self.req.handler!r} raised {reason} on {self.where} lines "
                f"{good[0].line}-{good[-1].line}; the whole chunk is retried. Reproduce it locally on "
                "those lines to see the record.",
                type="HandlerError",
            ) from None
        if result.encoded:
            output.extend(result.output)
        else:
            try:
                output.extend(map(orjson.dumps, result.output))
            except TypeError as err:
                raise ApplicationError(
                    f"handler {self.req.handler!r} returned a value that is not JSON-serialisable for "
                    f"{self.where}: {err}",
                    type=BAD_FILE,
                    non_retryable=True,
                ) from None
        rejects.extend(result.rejects)

    def _commit(
        self,
        cp: Checkpoint,
        taken: int,
        output: list[bytes],
        rejects: list[Reject],
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
                "done": done,
            }
        )
        if rejects:
            rejects.sort(key=lambda r: r.line)  # parser and handler rejects, in file order
            body = b"".join(
                orjson.dumps({"line": r.line, "reason": r.reason, "record": r.value}) + b"\n" for r in rejects
            )
            self._put(layout.rejects_key(req.output_prefix, self.obj.key, cp.chunk), body, new)
        body = b"\n".join(output) + b"\n" if output else b""
        self._put(layout.part_key(req.output_prefix, self.obj.key, cp.chunk), body, new)
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
        }
        kwargs["Metadata"] = {layout.CHECKPOINT_METADATA: cp.model_dump_json()}
        try:
            self.s3.put_object(**kwargs)
        except (ClientError, BotoCoreError) as err:
            raise_s3_error(err, "writing", self.req.output_bucket, key)

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
            raise ApplicationError(
                f"worker shutting down; {self.where} continues elsewhere from record {cp.next_record}",
                type=WORKER_SHUTDOWN,
                category=ApplicationErrorCategory.BENIGN,
                next_retry_delay=datetime.timedelta(milliseconds=100),
            )

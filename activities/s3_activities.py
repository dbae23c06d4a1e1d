"""The activities of s3batch: check a job, list a prefix, process files resumably, write the report.

All of them are synchronous (boto3 blocks) and run in the worker's thread pool. One S3 client is
built by the worker and shared: boto3 clients are thread-safe. Each activity is wrapped by
``boundary``: the s3batch errors it raises leave it as Temporal ``ApplicationError`` s.

Where the work is done: listing in ``listing``, files in ``files`` and ``file_job`` (the chunk loop),
the handler in ``handling``; checkpoints in :mod:`s3batch.checkpoint`, the report in
:mod:`s3batch.report_store`, reading records in :mod:`s3batch.formats`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError
from s3batch.activities import after_success, files
from s3batch.activities.boundary import boundary
from s3batch.activities.committed import fill_cancelled
from s3batch.activities.incremental import Ledgers, list_incremental_page, write_ledger
from s3batch.activities.listing import RedrivePlans, list_page, list_redrive_page
from s3batch.activities.manifest_rows import ManifestPositions
from s3batch.activities.manifests import check_manifest, list_manifest_page
from s3batch.activities.ownership import check_output_free, write_check_metadata
from temporalio import activity

from s3batch import layout
from s3batch import search_attributes as sa
from s3batch.after_success import Archive, Outcome
from s3batch.config import Settings
from s3batch.handlers import get_handler
from s3batch.incremental import ListIncrementalInput, WriteLedgerInput, ledger_location
from s3batch.limits import check_allowed, check_ceilings, sse_params
from s3batch.messages import (
    AfterSuccessInput,
    FileResult,
    FinalReportInput,
    JobCheck,
    ListObjectsInput,
    ListObjectsResult,
    ProcessFileInput,
    ProcessGroupInput,
    ReportSegmentInput,
    Totals,
)
from s3batch.models import JobSpec
from s3batch.report import JobReport, books_error
from s3batch.report_store import final_report, put_report, read_report, read_segment, segment_body
from s3batch.s3io import raise_s3_error
from s3batch.selection import split_s3_uri
from s3batch.sinks.spec import PostgresSink

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

    from s3batch.sinks.postgres_pools import PostgresPools


def at_once(*calls: Callable[[], Any]) -> list[Any]:
    """The results of ``calls``, run at once (the first in this thread). All end before any error is raised, and
    the first call to fail, in their order, raises it: as if they had run one by one."""
    with ThreadPoolExecutor(max(1, len(calls) - 1), thread_name_prefix="s3batch-check") as pool:
        later = [pool.submit(call) for call in calls[1:]]
        first = calls[0]()  # leaving the block waits for the others, whether or not this raised
    return [first, *(f.result() for f in later)]


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
        self._pools: PostgresPools | None = None
        self.redrive_plans = RedrivePlans()
        """What a redrive lists, read once per report (not once per listing page)."""
        self.manifest_positions = ManifestPositions()
        """Where the pages of manifests' data files ended (the next page starts there, see ManifestPositions)."""
        self.ledgers = Ledgers(self.settings.max_ledger_bytes)
        """The incremental jobs' ledgers, read again only when they changed (and bounded, see Ledgers)."""

    @property
    def pools(self) -> PostgresPools:
        """The worker's PostgreSQL pools, one per connection name (``postgres`` sinks; built on first use)."""
        if self._pools is None:
            from s3batch.sinks.postgres_pools import PostgresPools

            # Two connections a file: a big file's chunks are written two at once (PostgresOutput.writes_at_once).
            self._pools = PostgresPools(self.settings, max_size=2 * self.settings.max_concurrent_files)
        return self._pools

    def close(self) -> None:
        """Close the PostgreSQL pools (when the worker stops)."""
        if self._pools is not None:
            self._pools.close()

    # ------------------------------------------------------------------ job checks and listing

    @activity.defn(name="s3batch.check_job")
    @boundary(keepalive=True)
    def check_job(self, job: JobSpec) -> JobCheck:
        """Fail fast, before any file runs, on a job that cannot work: unknown handler or format,
        buckets or prefixes this worker may not use, limits over its ceilings, missing or unreadable
        buckets."""
        get_handler(job.handler)
        if job.manifest:
            check_allowed(self.settings, "sources", *split_s3_uri(job.manifest))
        else:
            check_allowed(self.settings, "sources", job.bucket, job.prefix)
        check_allowed(self.settings, "outputs", job.output_bucket, job.output_prefix)
        for report in (job.only_failed_of, job.rejected_of):
            if report:
                self._report_location(report)
        check_ceilings(self.settings, job.chunk_records, job.max_record_bytes, "the job")
        archive = job.after_success
        if isinstance(archive, Archive) and (archive.bucket or job.bucket):  # where the copies go: written
            check_allowed(self.settings, "outputs", archive.bucket or job.bucket, archive.prefix)
        if isinstance(job.sink, PostgresSink):
            from s3batch.sinks.postgres_pools import check_sink

            check_sink(job.sink, self.pools)  # a connection this worker lacks, a missing table: fail at start
        job_id = activity.info().workflow_id or ""  # None only for a standalone activity
        # The reads are independent: they are asked at once (a job's start waits for the slowest, not for their
        # sum), and a failure is raised in this order, as if they had run one by one.
        manifest_version, _, _ = at_once(
            lambda: self._check_source(job),
            lambda: self._check_output_bucket(job),
            lambda: check_output_free(self.s3, job, job_id),  # before the probe, which names this job the owner
        )
        # The bucket must exist (some S3 servers create it on the first PUT), and a tiny write proves
        # it is writable before any file is read (a read-only bucket would otherwise fail every
        # file, and then the report).
        probe = layout.write_check_key(job.output_prefix)
        try:
            self.s3.put_object(
                Bucket=job.output_bucket,
                Key=probe,
                Body=b"",
                ContentType="text/plain",
                Metadata=write_check_metadata(job_id, job),
                **sse_params(self.settings),
            )
        except (ClientError, BotoCoreError) as err:
            raise_s3_error(err, "writing", job.output_bucket, probe)
        for report in (job.only_failed_of, job.rejected_of):
            if report:
                self._read_report(report)
        return JobCheck(
            search_attributes=self.search_attributes_registered,
            source=sa.source_value(job.bucket, job.prefix, self.source_keys),
            manifest_version=manifest_version,
        )

    def _check_source(self, job: JobSpec) -> str | None:
        """The source can be listed (a manifest: read whole, see ``check_manifest``); the manifest's version."""
        try:
            if job.manifest:
                return check_manifest(self.s3, job.manifest, self.settings)
            self.s3.list_objects_v2(Bucket=job.bucket, Prefix=job.prefix, MaxKeys=1)
        except (ClientError, BotoCoreError) as err:
            raise_s3_error(err, "listing", job.bucket, job.prefix or None)
        return None

    def _check_output_bucket(self, job: JobSpec) -> None:
        """The output bucket exists and the output prefix can be listed."""
        try:
            # A LIST of the output prefix, not a HEAD of the bucket: a policy scoped to the prefix
            # (deploy/iam) allows it, and a missing bucket still answers NoSuchBucket.
            self.s3.list_objects_v2(Bucket=job.output_bucket, Prefix=job.output_prefix, MaxKeys=1)
        except (ClientError, BotoCoreError) as err:
            raise_s3_error(err, "checking the output bucket", job.output_bucket)

    @activity.defn(name="s3batch.list_objects")
    @boundary(keepalive=True)
    def list_objects(self, req: ListObjectsInput) -> ListObjectsResult:
        """One page of ListObjectsV2. Folder markers (``key/`` of size 0) are skipped."""
        if req.manifest:
            check_allowed(self.settings, "sources", *split_s3_uri(req.manifest))
            return list_manifest_page(self.s3, req, self.manifest_positions, self.settings)
        check_allowed(self.settings, "sources", req.bucket, req.prefix)
        if req.report:
            location = self._report_location(req.report)
            plan = self.redrive_plans.plan(self.s3, *location, req.prefix, rejected=bool(req.rejected))
            return list_redrive_page(self.s3, req, plan, self.settings)
        return list_page(self.s3, req.bucket, req.prefix, req.page_size, req.continuation_token, req.selection)

    def _report_location(self, uri: str) -> tuple[str, str]:
        """Bucket and key of the report ``uri`` to redrive, when the worker may read it (a report
        lies in an output, or was copied into a source)."""
        bucket, _, key = uri.removeprefix("s3://").partition("/")
        check_allowed(self.settings, "outputs", bucket, key, also="sources")
        return bucket, key

    def _read_report(self, uri: str) -> JobReport:
        bucket, key = self._report_location(uri)
        return read_report(self.s3, bucket, key, action="reading the job report to redrive")

    # ------------------------------------------------------------------ files

    @activity.defn(name="s3batch.process_file")
    @boundary(attempt_details=True)
    def process_file(self, req: ProcessFileInput) -> FileResult:
        """Process one object chunk by chunk, resuming from the furthest committed checkpoint.

        Failures carry ``{"attempt": n}`` as details so the job report can say how many attempts
        a failed file had.
        """
        return files.process_file(self.s3, self.settings, req, self._pools_for(req.sink))

    @activity.defn(name="s3batch.process_group")
    @boundary()
    def process_group(self, req: ProcessGroupInput) -> list[FileResult]:
        """Process small objects one after the other. A file that fails for good (changed, missing,
        bad format) is reported failed without failing the group; a transient error fails the
        attempt, and the retry skips the files already done (their final parts are committed).

        The group's output is checked with one LIST at the end (see ``FileJob.verify``). When the
        job is cancelled meanwhile, the group returns instead of raising: the files it finished as
        ``succeeded``, the others as ``cancelled`` (with their checkpoint's counts, where they have one).
        """
        return files.process_group(self.s3, self.settings, req, self._pools_for(req.file.sink))

    def _pools_for(self, sink: object) -> PostgresPools | None:
        return self.pools if isinstance(sink, PostgresSink) else None

    @activity.defn(name="s3batch.after_success")
    @boundary()
    def after_success(self, req: AfterSuccessInput) -> list[Outcome]:
        """Archive, delete or tag the files that succeeded, exactly the version processed; what became of each
        (see ``s3batch.activities.after_success``)."""
        return after_success.act(self.s3, self.settings, req)

    # ------------------------------------------------------------------ report

    @activity.defn(name="s3batch.write_report_segment")
    @boundary(keepalive=True)
    def write_report_segment(self, req: ReportSegmentInput) -> str:
        """Flush the per-file results of one workflow run (before continue-as-new)."""
        check_allowed(self.settings, "outputs", req.output_bucket, req.output_prefix)
        key = layout.segment_key(req.output_prefix, req.segment)
        self._put(req.output_bucket, key, segment_body(req.files), "application/x-ndjson")
        return key

    @activity.defn(name="s3batch.write_report")
    @boundary(keepalive=True)
    def write_report(self, req: FinalReportInput) -> str:
        """Write ``{output_prefix}_report.json``: every file of the job and the totals, streamed from the
        segments of the earlier runs (memory bounded by one segment and one upload part, whatever the
        number of files; see ``s3batch.report_store``)."""
        job = req.job
        check_allowed(self.settings, "outputs", job.output_bucket, job.output_prefix)

        filled: dict[tuple[str, str], dict[str, Any]] = {}

        def segments() -> Iterator[dict[str, Any]]:
            for segment in range(req.segments):
                for entry in read_segment(self.s3, job.output_bucket, layout.segment_key(job.output_prefix, segment)):
                    yield filled.get((entry["key"], entry["etag"]), entry)

        redriven = None
        if not req.listing_done and (job.only_failed_of or job.rejected_of):
            redriven = self._read_report(job.only_failed_of or job.rejected_of or "")
        # Files a cancel (or max_rejected_total) found between attempts report nothing, nor do most failed files:
        # their committed parts (or checkpoint rows) say how far they got. Those of earlier runs are in segments.
        if req.totals.files_failed > sum(1 for f in req.files if f.status == "failed"):
            earlier = [FileResult.model_validate(e) for e in segments() if e["status"] == "failed"]
            done, totals = self._fill(job, earlier, req.totals)
            filled = {(f.key, f.etag): f.model_dump(mode="json") for f in done}
            req = req.model_copy(update={"totals": totals})
        if any(f.status in ("cancelled", "failed") for f in req.files):
            done, totals = self._fill(job, req.files, req.totals)
            req = req.model_copy(update={"files": done, "totals": totals})
        report = final_report(req, segments, redriven)
        key = layout.report_key(job.output_prefix)
        put_report(self.s3, job.output_bucket, key, report.chunks(), sse_params(self.settings))
        error = books_error(report.head, job.output_bucket, key)
        if error is not None:
            raise error
        return key

    def _fill(self, job: JobSpec, files: list[FileResult], totals: Totals) -> tuple[list[FileResult], Totals]:
        """``files`` and ``totals`` with the committed counts of the cancelled and failed files that said nothing."""
        secret = self.settings.checkpoint_secret.get_secret_value().encode() or None
        return fill_cancelled(
            self.s3, job.output_bucket, job.output_prefix, files, totals, secret, sink=job.sink,
            pools=self._pools_for(job.sink), source_bucket=job.bucket, rejected_of=job.rejected_of,
        )

    # ------------------------------------------------------------------ incremental jobs

    @activity.defn(name="s3batch.list_incremental")
    @boundary(keepalive=True)
    def list_incremental(self, req: ListIncrementalInput) -> ListObjectsResult:
        """One page of an incremental job's listing: the objects its ledger does not know in their
        current version (see ``s3batch.incremental``)."""
        check_allowed(self.settings, "sources", req.bucket, req.prefix)
        check_allowed(self.settings, "outputs", *ledger_location(req.ledger), also="sources")
        check_allowed(self.settings, "outputs", req.output_bucket, req.output_prefix)
        return list_incremental_page(
            self.s3, req, lambda b, k, body: self._put(b, k, body, "application/json"), self.ledgers
        )

    @activity.defn(name="s3batch.write_ledger")
    @boundary(keepalive=True)
    def write_ledger(self, req: WriteLedgerInput) -> str:
        """After the report: advance the ledger over the run's files that succeeded (idempotent)."""
        check_allowed(self.settings, "outputs", *ledger_location(req.ledger))
        check_allowed(self.settings, "outputs", req.output_bucket, req.output_prefix)  # the run's report and pages
        return write_ledger(self.s3, req, self._put_ledger, self.ledgers)

    def _put_ledger(self, bucket: str, key: str, body: bytes, etag: str | None) -> None:
        # Conditional: a ledger advanced by another run meanwhile is not overwritten (412).
        condition: dict[str, Any] = {"IfMatch": f'"{etag}"'} if etag else {"IfNoneMatch": "*"}
        try:
            self.s3.put_object(
                Bucket=bucket,
                Key=key,
                Body=body,
                ContentType="application/json",
                **condition,
                **sse_params(self.settings),
            )
        except (ClientError, BotoCoreError) as err:
            raise_s3_error(err, "writing the ledger", bucket, key)

    def _put(self, bucket: str, key: str, body: bytes, content_type: str) -> None:
        try:
            self.s3.put_object(Bucket=bucket, Key=key, Body=body, ContentType=content_type, **sse_params(self.settings))
        except (ClientError, BotoCoreError) as err:
            raise_s3_error(err, "writing", bucket, key)

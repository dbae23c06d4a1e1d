"""Internal state and messages: what the workflow, its activities and the clients exchange (activity
inputs and results, the job's totals and continue-as-new state, query answers, the workflow result).

Tolerant of unknown fields (``extra="allow"``), unlike the job input in :mod:`s3batch.models`:
during a rolling upgrade workers of two versions share a running job, and each must read what the
other wrote.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

from s3batch.after_success import AfterSuccess, Outcome
from s3batch.fielddocs import Documented
from s3batch.models import FileStatus, Format, JobSpec, JobStatus, without_nones
from s3batch.reading import READ_OPTIONS, HeaderOption
from s3batch.selection import KeyFilter
from s3batch.sinks.spec import Sink


class _Model(Documented, BaseModel):
    """Internal state and messages: checkpoints, heartbeat details, continue-as-new state, activity
    inputs and results, query answers.

    Unknown fields are kept (``extra="allow"``), not refused: during a rolling upgrade workers of two
    versions share a running job, and each must read what the other wrote (a field added by the newer
    version survives a round trip through the older one).
    """

    model_config = ConfigDict(extra="allow", frozen=False)


class ObjectRef(_Model):
    """One source object, pinned to the version seen when it was listed."""

    key: str
    etag: str
    """ETag at listing time (quotes stripped); every read is conditional on it."""
    size: int
    version_id: str | None = None
    """Version pinned at the first read, where the bucket is versioned (or the one a manifest names)."""
    bucket: str | None = None
    """Its bucket when it is not the job's ``bucket`` (a manifest's objects; None: left out of payloads)."""

    @model_serializer(mode="wrap")
    def _omit_job_bucket(self, handler: SerializerFunctionWrapHandler) -> Any:
        return without_nones(handler(self), _OBJECT_BUCKET)


_OBJECT_BUCKET = frozenset({"bucket"})


class Totals(_Model):
    """Job-wide counters, carried across continue-as-new."""

    files_listed: int = 0
    files_succeeded: int = 0
    files_failed: int = 0
    files_cancelled: int = 0
    """Files in flight when the job was cancelled (stopped at a chunk boundary)."""
    files_not_started: int = 0
    """Files listed but never started because the job was cancelled."""
    records: int = 0
    """Records read from the sources (written + rejected + dropped, for handlers that account for each)."""
    records_written: int = 0
    rejected: int = 0
    dropped: int = 0
    """Records the handlers dropped (neither written nor rejected)."""
    bytes_read: int = 0
    already_written: int | None = None
    """Records of files an earlier job had written whole with the same options (found done: this job wrote
    none of them, and ``records_written`` does not count them); None: none (and left out)."""
    after_success: dict[str, int] | None = None
    """Files by what the job's ``after_success`` did to them: ``archived``, ``deleted``, ``tagged``, ``skipped``
    (see each file's ``after_success`` for why); None: a job without the option (and left out)."""

    @model_serializer(mode="wrap")
    def _omit_none_already(self, handler: SerializerFunctionWrapHandler) -> Any:
        return without_nones(handler(self), _ALREADY)


_ALREADY = frozenset({"already_written", "after_success"})


class JobState(_Model):
    """Workflow state handed from one run to the next by continue-as-new. Small by design."""

    indexed: bool = False
    """s3batch's search attributes exist in the namespace (learnt by the first run's check)."""
    run: int = 0
    continuation_token: str | None = None
    listing_done: bool = False
    pending: list[ObjectRef] = Field(default_factory=list)
    """Objects of the current listing page that no run has started yet."""
    totals: Totals = Field(default_factory=Totals)
    report_segments: int = 0
    """Per-file results of earlier runs, flushed to ``{output_prefix}_s3batch/report-NNNNN.jsonl``."""
    files_per_run: int = Field(500, ge=1, le=2_000)
    """Files one run starts before it continues as new."""
    solo: list[str] = Field(default_factory=list)
    """Keys of pending objects whose group failed: they are retried one per activity."""
    paused: bool = False
    """Set by the ``pause`` update: no new file starts until ``resume``."""
    max_concurrent_files: int | None = Field(None, ge=1, le=1_000)
    """Set by the ``set_concurrency`` update; overrides the input's ``max_concurrent_files``."""
    listed_digest: int | None = None
    """Order-independent digest of every key listed so far (see ``s3batch.accounting``); None for a
    job started by a release that did not keep it (its books are then checked by counts only)."""
    done_digest: int | None = None
    """The same digest over the keys of every file result recorded so far."""
    last_listed_key: str | None = None
    """The last key the listing handed out: a redrive of a cancelled job lists on after it."""
    manifest_version: str | None = None
    """The manifest's ETag when the job started (``JobCheck.manifest_version``): the listing reads that
    version or fails. None: no manifest, or a job started by an earlier release (and left out of the state)."""
    warnings: list[str] | None = None
    """The first warnings of the job's files (a high reject ratio, a CSV delimiter hint), each with
    its key (bounded: see ``s3batch.rejects.MAX_JOB_WARNINGS``); None: none (and left out of the state)."""
    handed_over: dict[str, int] | None = None
    """Files a run stopped at a chunk boundary and handed to the next run (so that run's slots stay
    busy), by key: the chunks each had committed then. A file leaves it when its result is recorded;
    None: none (and left out of the state)."""
    hand_over: bool | None = None
    """False: a full run waits for every file in flight before it continues as new (no hand-over, as
    v0.1 did; a tuning knob a job may give at its start, for comparisons). None: hand over."""
    kept: list[str] | None = None
    """Handed-over files whose last leg committed no chunk: they are not handed over again, but run
    to their end in their run. None: none (and left out of the state)."""
    whole: list[str] | None = None
    """Files over ``split_bytes`` that could not be split (a quoted CSV line break where a split began):
    processed whole instead. A file leaves it when its result is recorded; None: none (and left out)."""
    split_counts: dict[str, int] | None = None
    """Handed-over files that ran in byte-range splits, by key: how many (the next run starts the same
    splits, each resuming from its own checkpoint). A file leaves it when its result is recorded; None:
    none (and left out of the state)."""

    @model_serializer(mode="wrap")
    def _omit_no_warnings(self, handler: SerializerFunctionWrapHandler) -> Any:
        return without_nones(handler(self), _OPTIONAL_STATE)


_OPTIONAL_STATE = frozenset(
    {"warnings", "handed_over", "hand_over", "kept", "whole", "split_counts", "manifest_version"}
)


class JobCheck(_Model):
    """Result of the job's pre-flight check."""

    search_attributes: bool = False
    """The worker registered (or found) s3batch's search attributes: the workflow may upsert them."""
    source: str | None = None
    """The job's ``S3BatchSource`` value (an HMAC when the worker has an encryption key), for a job
    started without one; None: leave it out."""
    manifest_version: str | None = None
    """The ETag of the job's manifest when it was checked (a job without one: None): every listing page
    checks the manifest is still that version."""


class ListObjectsInput(_Model):
    bucket: str
    prefix: str
    continuation_token: str | None = None
    report: str | None = None
    """List the failed files of this report (``s3://bucket/key``) instead of the bucket."""
    page_size: int = Field(500, ge=1, le=1_000)
    manifest: str | None = None
    """List the objects this manifest names (``s3://bucket/key``) instead of the bucket."""
    manifest_version: str | None = None
    """The manifest's ETag when the job started (``JobCheck.manifest_version``); None: not checked (a
    job started by an earlier release)."""
    selection: KeyFilter | None = None
    """The job's filters (None: none)."""
    rejected: bool | None = None
    """True: list the files of ``report`` that had rejects (a redrive of rejected records), not its failed ones."""

    @model_serializer(mode="wrap")
    def _omit_unused(self, handler: SerializerFunctionWrapHandler) -> Any:
        return without_nones(handler(self), _LISTING_OPTIONS)


_LISTING_OPTIONS = frozenset({"manifest", "manifest_version", "selection", "rejected"})


class ListObjectsResult(_Model):
    objects: list[ObjectRef]
    next_token: str | None
    """None once the listing is complete."""


class SplitRange(_Model):
    """One byte-range split of a big file (``S3BatchInput.split_bytes``): the records that start in the
    nominal range ``[start, end)``, moved to record boundaries by the activity (``s3batch.activities.splits``)."""

    index: int
    count: int
    start: int
    end: int


class ProcessFileInput(_Model):
    """Input of the per-file activity."""

    job_id: str
    bucket: str
    obj: ObjectRef
    output_bucket: str
    output_prefix: str
    format: Format
    handler: str
    chunk_records: int
    max_record_bytes: int
    max_rejected_records: int | None = None
    max_rejected_ratio: float | None = None
    sink: Sink | None = None
    """The job's sink; None (left out of the payload): JSONL parts, as before sinks existed."""
    delimiter: str | None = None
    quotechar: str | None = None
    escapechar: str | None = None
    header: HeaderOption | None = None
    encoding: str | None = None
    """The job's reading options (``s3batch.reading``); None (left out of the payload): the default."""
    split: SplitRange | None = None
    """The part of the file this activity processes; None (left out of the payload): the whole file."""
    rejected_of: str | None = None
    """The job's ``rejected_of``: only the records that job's rejects files name are processed (None, left out of
    the payload: every record)."""

    @model_serializer(mode="wrap")
    def _omit_default_sink(self, handler: SerializerFunctionWrapHandler) -> Any:
        return without_nones(handler(self), _SINK)


_SINK = READ_OPTIONS | {"sink", "split", "rejected_of"}


class ProcessGroupInput(_Model):
    """Input of the group activity: small objects processed one after the other in one activity, so
    per-activity overhead does not dominate (like Step Functions' ItemBatcher)."""

    file: ProcessFileInput
    """Options shared by the group; its ``obj`` is the group's first object."""
    more: list[ObjectRef]
    """The group's other objects."""

    def items(self) -> list[ProcessFileInput]:
        first = self.file
        # A manifest's objects carry their bucket.
        return [first, *(first.model_copy(update={"obj": o, "bucket": o.bucket or first.bucket}) for o in self.more)]


class ReasonCount(_Model):
    """A reject reason (never record contents) and how many of a file's rejects gave it."""

    reason: str
    count: int


_REJECT_FIELDS = frozenset(
    {
        "reject_ratio", "reject_reasons", "warnings", "splits", "already_written", "version_id", "after_success",
        "split_void",
    }
)


class FileResult(_Model):
    """Outcome of one file, as listed in the job report."""

    key: str
    etag: str
    status: FileStatus
    records: int = 0
    """Records read (written + rejected + dropped, for handlers that account for each record)."""
    records_written: int = 0
    rejected: int = 0
    dropped: int = 0
    """Records the handler dropped (a record handler returning None)."""
    bytes_read: int = 0
    chunks: int = 0
    attempts: int = 1
    resumed_from_record: int = 0
    """``next_record`` the final attempt started from; 0 when it started fresh."""
    error: str | None = None
    reject_ratio: float | None = None
    """Rejected / records read, for a file with rejects (None: none, and absent from the report)."""
    reject_reasons: list[ReasonCount] | None = None
    """The most common reasons of its rejects, with their counts (at most 5; see ``s3batch.rejects``)."""
    warnings: list[str] | None = None
    """What a person should look at (a high reject ratio, a CSV that looks like another delimiter)."""
    splits: int | None = None
    """How many byte-range splits the file was processed in (None: one, the whole file)."""
    already_written: int | None = None
    """The file was found done, written whole by an earlier job with the same options (its table or output
    folder held it): the records that job wrote, of which this job wrote none (``records_written`` is 0;
    ``records``, ``rejected`` and ``dropped`` are the file's, as that job counted them). None: this job (its
    earlier attempts included) wrote what ``records_written`` says; a worker older than the field says so too."""
    version_id: str | None = None
    """The version processed, on a versioned bucket (pinned by the first read; None: unversioned, or a worker
    older than the field)."""
    after_success: Outcome | None = None
    """What the job's ``after_success`` did to the file (None: nothing was to be done: no such option, or the
    file did not succeed)."""
    split_void: bool | None = None
    """What the file's splits wrote is void, removed when the report is written; only what it wrote whole counts
    (None: not so). Either it could not be split (a quoted line break at a split boundary: a split began inside a
    record) and its job stopped before it was processed whole (a redrive processes it whole), or it is a CSV whose
    splits stopped (``cancelled``, ``failed``) before each but the last reached its end, where it checks that the
    next began at a record (a redrive processes it from its start)."""

    @model_serializer(mode="wrap")
    def _omit_unset_rejects(self, handler: SerializerFunctionWrapHandler) -> Any:
        return without_nones(handler(self), _REJECT_FIELDS)

    @classmethod
    def not_started(cls, key: str, etag: str = "") -> FileResult:
        """A file listed (or due to be redriven) that a cancelled job never started."""
        return cls(key=key, etag=etag, status="not_started", attempts=0, error="job cancelled before this file started")


class AfterSuccessInput(_Model):
    """Input of the ``after_success`` activity: the files of one file activity that succeeded."""

    bucket: str
    """The job's source bucket (an object may carry its own: a manifest's)."""
    prefix: str
    """The job's prefix (an archived copy keeps the key's path below it)."""
    action: AfterSuccess
    files: list[ObjectRef]
    """Each file as processed: its listed ETag and the version its reads were pinned to (``version_id``)."""


class ReportSegmentInput(_Model):
    output_bucket: str
    output_prefix: str
    segment: int
    files: list[FileResult]


class FinalReportInput(_Model):
    job_id: str
    job: JobSpec
    status: JobStatus
    totals: Totals
    segments: int
    """Number of segments flushed by earlier runs."""
    files: list[FileResult]
    """Results of the final run, not yet flushed."""
    listed_digest: int | None = None
    """Digest of every key the job listed: the report must hold each of them exactly once."""
    listing_done: bool = True
    """False for a job cancelled before its listing ended."""
    last_listed_key: str | None = None
    """The last key listed (for people reading the report)."""
    continuation_token: str | None = None
    """Where the listing stopped when ``listing_done`` is False: a redrive goes on from there."""


class Progress(_Model):
    """Answer of the ``progress`` query."""

    files_listed: int
    files_succeeded: int
    files_failed: int
    files_in_flight: int
    records: int
    records_written: int
    rejected: int
    bytes_read: int
    listing_done: bool
    run: int
    already_written: int = 0
    """Records of files found already written by an earlier job (``Totals.already_written``)."""
    in_flight: list[str] = Field(default_factory=list)
    """Keys of the files being processed now."""
    paused: bool = False
    """Paused by the ``pause`` update: no new file starts; files in flight run to their end."""
    max_concurrent_files: int | None = None
    """Current limit of files in flight (the input's, or the last ``set_concurrency``)."""
    cancelling: bool = False
    """The job was cancelled: files in flight are stopping at a chunk boundary."""
    files_cancelled: int = 0
    warnings: list[str] = Field(default_factory=list)
    """The first warnings of the job's files, each with its key (see ``JobState.warnings``)."""
    destination: str | None = None
    """Where the job's records go (``s3batch.sinks.spec.destination``): the output folder and the parts'
    format, or the PostgreSQL table. None from a worker older than the field."""


class S3BatchResult(_Model):
    """Result of ``S3BatchWorkflow``: job totals and where the full report is."""

    status: Literal["succeeded", "failed"]
    totals: Totals
    report_bucket: str
    report_key: str
    warnings: list[str] = Field(default_factory=list)
    """The first warnings of the job's files, each with its key (the report has every file's)."""

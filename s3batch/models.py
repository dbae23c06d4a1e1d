"""The job input: the data contract a user writes (:class:`S3BatchInput`, strict), and the types the
other models share. What the workflow, its activities and the clients exchange internally (tolerant
of unknown fields) is in :mod:`s3batch.messages`.

Every model is plain JSON on the wire (Temporal's pydantic data converter), so a job can be started
with ``temporal workflow start --input '{...}'`` as well as from Python. Models that cross the
workflow boundary never carry record contents or credentials: only keys, versions, offsets and
counters.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    StringConstraints,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

from s3batch import layout
from s3batch.after_success import AfterSuccess, Archive, archive_clash
from s3batch.fielddocs import Documented
from s3batch.incremental import Incremental, ledger_location, ledger_uri
from s3batch.reading import (
    READ_OPTIONS,
    HeaderOption,
    Reading,
    check_dialect,
    check_header,
    normalize_encoding,
)
from s3batch.selection import KeyFilter, parse_time
from s3batch.sinks.spec import Sink
from s3batch.validation import INPUT_ERROR

BucketName = Annotated[str, StringConstraints(min_length=3, max_length=63, pattern=r"^[a-z0-9][a-z0-9.\-]*[a-z0-9]$")]
_BUCKET_PATTERN = re.compile(r"[a-z0-9][a-z0-9.\-]*[a-z0-9]")
"""An S3 bucket name: 3-63 lower-case letters, digits, dots and hyphens."""

Format = Literal["auto", "csv", "jsonl", "json", "parquet"]

FileStatus = Literal["succeeded", "failed", "cancelled", "not_started"]
"""``cancelled``: the job was cancelled while the file was in flight; it stopped at a chunk boundary
with its checkpoint, so a later job over the same output resumes it. ``not_started``: the job was
cancelled before the file started (a redrive of the job processes it)."""

REDRIVE_STATUSES = ("failed", "cancelled", "not_started")
"""File statuses in a report that a redrive (``only_failed_of``) processes again."""

JobStatus = Literal["succeeded", "failed", "cancelled"]




def without_nones(data: Any, names: frozenset[str]) -> Any:
    """``data`` (a model dumped) without the fields of ``names`` that are None: fields added later
    appear only where they are set, so what older releases wrote (reports, job inputs) stays the same."""
    if isinstance(data, dict):
        for name in names:
            if data.get(name, 0) is None:
                del data[name]
    return data


REJECT_LIMITS = frozenset({"max_rejected_records", "max_rejected_ratio", "max_rejected_total"})
"""The job options on rejects (see ``s3batch.rejects``); None: no limit."""

_UNSET_OMITTED = READ_OPTIONS | (
    REJECT_LIMITS | {"sink"} | {"manifest", "include", "exclude", "modified_after", "modified_before"} | {"incremental"}
    | {"rejected_of"} | {"after_success"}
)
"""Job options left out of the input as written when unset: a job without them is written as before."""


_OFF_OMITTED = frozenset({"fail_if_empty", "overwrite_output"})
"""Job switches left out of the input as written when off: a job without them is written as before."""

DEFAULT_SPLIT_BYTES = 1024 * 1024 * 1024
"""``split_bytes`` of a job that does not set it (left out of the input as written: see above)."""


class S3BatchInput(Documented, BaseModel):
    """Input of ``S3BatchWorkflow``: what to process, where to write it and how.

    Strict, unlike the internal models: an unknown field is refused (a typo must not be silently
    ignored) and values are never coerced (``"chunk_records": true`` or ``"10"`` is an error, not 1
    or 10).
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    bucket: str
    """Source bucket (unless ``manifest`` names the objects: then it is left out, and is "")."""
    prefix: str = ""
    """Only objects whose key starts with this prefix are processed ("" = the whole bucket)."""
    manifest: str | None = Field(None, pattern=r"^s3://[^/]+/.+")
    """Instead of ``bucket``/``prefix``: ``s3://bucket/key`` of an S3 Inventory ``manifest.json`` or of a
    plain CSV (``bucket,key[,version_id]``) or JSONL list of the objects to process (see
    ``s3batch.activities.manifests``)."""
    include: list[str] | None = None
    """Only keys matching one of these globs (whole key, ``*`` also matches ``/``; see ``s3batch.selection``)."""
    exclude: list[str] | None = None
    """Keys matching one of these globs are left out (exclude wins over include)."""
    modified_after: str | None = None
    """ISO 8601: only objects last modified at or after this time (UTC when it has no zone)."""
    modified_before: str | None = None
    """ISO 8601: only objects last modified before this time."""
    output_bucket: BucketName
    """Bucket that receives the parts, rejects and the job report."""
    output_prefix: str = ""
    """Prefix of every output key: ``{output_prefix}{key}/part-00000.jsonl``."""
    format: Format = "auto"
    """``csv`` (RFC 4180; the dialect, header and encoding options below), ``jsonl``, ``json`` (a
    document: an array of records, one object, or JSON Lines), ``parquet``, or ``auto`` to pick by
    extension (``.csv``/``.tsv``, ``.jsonl``/``.ndjson``, ``.json``, each optionally ``.gz``, ``.zst`` or
    ``.bz2``; ``.parquet``)."""
    delimiter: str | None = None
    """CSV field delimiter, any one character (``,`` ``;`` ``\\t`` ``|``...); None: ``,``, or a tab for
    ``.tsv`` keys (see ``s3batch.reading``)."""
    quotechar: str | None = None
    """CSV quote character (None: ``"``); a doubled quote inside quotes is one quote."""
    escapechar: str | None = None
    """CSV escape character: it takes the next character literally (None: none)."""
    header: HeaderOption | None = None
    """CSV header: ``first_row`` (None: the default), ``none`` (columns ``col_1``, ``col_2``...), or a
    list of column names (then every row is data)."""
    encoding: str | None = None
    """Text encoding of CSV files, a Python codec name: ``utf-8`` (None: the default, BOM skipped),
    ``utf-16`` (byte order from its BOM), ``latin-1``, ``cp1252``...; undecodable bytes make a reject."""
    handler: str = Field("passthrough", min_length=1)
    """Name of a registered handler (see ``s3batch.handlers``)."""
    chunk_records: int = Field(10_000, ge=1, le=1_000_000)
    """Records per chunk: one output part and one checkpoint per chunk."""
    max_concurrent_files: int = Field(8, ge=1, le=1_000)
    """Files processed at the same time by the whole job."""
    heartbeat_timeout_seconds: int = Field(30, ge=2, le=3_600)
    """A file whose worker is silent this long is retried on another worker, from its checkpoint."""
    max_attempts: int = Field(10, ge=1, le=100)
    """Attempts per file before it is reported as failed (10 rides out a few minutes of S3 outage:
    the retries back off 1, 2, 4 ... 60 s)."""
    max_failed_files: int = Field(0, ge=0)
    """The job fails when more files than this failed (after every other file was processed)."""
    max_rejected_records: int | None = Field(None, ge=0)
    """A file fails (``TooManyRejects``) once more of its records than this were rejected; checked at
    each chunk boundary, the committed output is kept (None: no limit, but a file whose every record was
    rejected fails unless this or max_rejected_ratio allows it)."""
    max_rejected_ratio: float | None = Field(None, ge=0.0, le=1.0)
    """A file fails (``TooManyRejects``) once this share of its records (0.0-1.0) was rejected;
    checked at each chunk boundary from 1,000 records read on, and at the end of the file (None: no limit,
    but a file whose every record was rejected fails; 1.0 accepts it)."""
    max_rejected_total: int | None = Field(None, ge=0)
    """The job fails (``TooManyRejects``) once more records than this were rejected over all its files;
    files in flight stop at a chunk boundary and the report is written (None: no limit)."""
    max_record_bytes: int = Field(8 * 1024 * 1024, ge=1_024, le=1024 * 1024 * 1024)
    """A longer line becomes a reject instead of being read into memory."""
    split_bytes: int | None = Field(DEFAULT_SPLIT_BYTES, ge=64 * 1024)
    """An uncompressed CSV or JSON Lines file larger than this (written to S3 parts) is processed as
    byte-range splits of about this size, each its own resumable activity, at most one per free slot of
    ``max_concurrent_files`` and at most 100 (None: never split). A CSV file whose quoted field holds a
    line break where a split begins is processed whole instead (never read wrong), with a warning."""
    group_max_files: int = Field(100, ge=1, le=1_000)
    """Small objects are processed several per activity, up to this many (1 disables grouping)."""
    group_max_bytes: int = Field(4 * 1024 * 1024, ge=0)
    """Objects smaller than this are grouped, up to this many bytes per group (0 disables grouping)."""
    only_failed_of: str | None = Field(None, pattern=r"^s3://[^/]+/.+")
    """Redrive: ``s3://bucket/key`` of an earlier job's report; only the files that failed (or
    were cancelled) there and lie under ``prefix`` are processed, at their current version."""
    rejected_of: str | None = Field(None, pattern=r"^s3://[^/]+/(.*/)?_report\.json$")
    """Redrive of rejected records: ``s3://bucket/{output_prefix}_report.json`` of an earlier job; only the records
    its files rejected (the lines in its rejects files) are processed again, from the same source version, and
    those now accepted are written once (into this job's own output_prefix, or the table beside the earlier
    rows; see ``s3batch.activities.rejected``). ``s3batch redrive --rejected JOB`` sets it."""
    fail_if_empty: bool = False
    """Fail the job (``EmptyPrefix``) when the prefix matches no file, instead of succeeding with 0 files."""
    overwrite_output: bool = False
    """Write into an output prefix that holds another job's output (its report and parts are replaced);
    without it such a job is refused at start, naming the other job."""
    sink: Sink | None = None
    """Where the records go (see ``s3batch.sinks.spec``): ``{"type": "s3"}`` (JSONL parts, the default),
    ``{"type": "s3", "format": "parquet"}``, or ``{"type": "postgres", "connection": ..., "table": ...}``."""

    incremental: Incremental | None = None
    """Process only objects new or changed since the last run of the same ledger, each run into
    ``{output_prefix}runs/{job-id}/`` (see ``s3batch.incremental``): ``{"ledger": "s3://bucket/prefix/"}``,
    or ``{}`` for ``{output_prefix}ledger/`` in the output bucket."""

    @model_validator(mode="after")
    def _incremental_source(self) -> S3BatchInput:
        if self.incremental is None:
            return self
        if self.manifest is not None or self.only_failed_of is not None or self.rejected_of is not None:
            raise PydanticCustomError(
                INPUT_ERROR, "incremental lists a prefix: give no manifest, only_failed_of or rejected_of"
            )
        bucket, key = ledger_location(ledger_uri(self.output_bucket, self.output_prefix, self.incremental))
        if bucket == self.bucket and key.startswith(self.prefix):
            raise PydanticCustomError(
                INPUT_ERROR, f"incremental.ledger s3://{bucket}/{key} lies under the source prefix: choose another"
            )
        return self

    after_success: AfterSuccess | None = None
    """What becomes of each file that succeeded, once its output is committed (see ``s3batch.after_success``):
    ``{"action": "archive", "prefix": "archive/"}`` (and ``"bucket"``: copy, then delete), ``{"action": "delete"}``
    or ``{"action": "tag", "tags": {"s3batch": "done"}}``; only the version processed, never a newer one (None:
    the files stay as they are)."""

    @model_validator(mode="after")
    def _archive_elsewhere(self) -> S3BatchInput:
        option = self.after_success
        if isinstance(option, Archive):
            clash = archive_clash(option, self.bucket, self.prefix, self.output_bucket, self.output_prefix)
            if clash is not None:
                raise PydanticCustomError(INPUT_ERROR, clash)
        return self

    @field_validator("output_prefix")
    @classmethod
    def _plain_output_prefix(cls, value: str) -> str:
        # Output keys are output_prefix + source key. "." and ".." segments are refused: S3 keeps
        # them as literal characters, but tools that map keys to paths (and some S3 servers) do
        # not, so outputs could land outside the prefix.
        segments = value.split("/")
        if any(seg in (".", "..") for seg in segments) or "//" in value or value.startswith("/"):
            raise PydanticCustomError(
                INPUT_ERROR,
                "must be a plain key prefix such as 'runs/2026-11-30/': no '.' or '..' segments, no "
                "empty segment ('//'), no leading '/'"
            )
        return value

    @field_validator("modified_after", "modified_before")
    @classmethod
    def _iso_time(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                parse_time(value)
            except ValueError:
                raise PydanticCustomError(
                    INPUT_ERROR, "must be an ISO 8601 date or time such as '2026-11-30' or '2026-11-30T08:00:00Z'"
                ) from None
        return value

    @field_validator("bucket")
    @classmethod
    def _bucket_name(cls, value: str) -> str:
        # BucketName's constraints, and "" (a manifest job's, checked by _one_source).
        if value and not (3 <= len(value) <= 63 and _BUCKET_PATTERN.fullmatch(value)):
            raise PydanticCustomError(
                INPUT_ERROR, "must be an S3 bucket name: 3-63 lower-case letters, digits, dots and hyphens"
            )
        return value

    @model_validator(mode="before")
    @classmethod
    def _no_bucket_with_manifest(cls, data: Any) -> Any:
        # A manifest names the objects (and their bucket): bucket is then not required, and is "".
        if isinstance(data, dict) and data.get("manifest") is not None and "bucket" not in data:
            return {**data, "bucket": ""}
        return data

    @model_validator(mode="after")
    def _one_source(self) -> S3BatchInput:
        if self.manifest is None and not self.bucket:
            raise PydanticCustomError(INPUT_ERROR, "bucket is required (or manifest instead of bucket and prefix)")
        if self.manifest is not None and (self.bucket or self.prefix or self.only_failed_of or self.rejected_of):
            raise PydanticCustomError(
                INPUT_ERROR,
                "manifest names the objects itself: give either manifest or bucket/prefix (and no only_failed_of "
                "or rejected_of)",
            )
        own = f"s3://{self.output_bucket}/{layout.report_key(self.output_prefix)}"
        if self.rejected_of == own:
            raise PydanticCustomError(
                INPUT_ERROR,
                "rejected_of is this job's own report: a redrive of rejected records writes into an output_prefix of "
                "its own (s3batch redrive --rejected: _rejected/ under that job's), never over the job it redrives",
            )
        after, before = self.modified_after, self.modified_before
        if after and before and parse_time(after) >= parse_time(before):
            raise PydanticCustomError(INPUT_ERROR, "modified_after must be earlier than modified_before")
        return self

    def selection(self) -> KeyFilter:
        """The job's filters."""
        include, exclude = tuple(self.include or ()), tuple(self.exclude or ())
        return KeyFilter(include, exclude, self.modified_after, self.modified_before)

    @field_validator("delimiter", "quotechar", "escapechar")
    @classmethod
    def _one_character(cls, value: str | None) -> str | None:
        if value is not None and (len(value) != 1 or value in "\r\n"):
            raise PydanticCustomError(INPUT_ERROR, "must be exactly one character, not a line break")
        return value

    @field_validator("header")
    @classmethod
    def _column_names(cls, value: HeaderOption | None) -> HeaderOption | None:
        if isinstance(value, list):
            try:
                check_header(value)
            except ValueError as err:
                raise PydanticCustomError(INPUT_ERROR, str(err).removeprefix("header: ")) from None
        return value

    @field_validator("encoding")
    @classmethod
    def _known_encoding(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                normalize_encoding(value)
            except ValueError as err:
                raise PydanticCustomError(INPUT_ERROR, str(err)) from None
        return value

    @model_validator(mode="after")
    def _csv_dialect(self) -> S3BatchInput:
        options = {name: getattr(self, name) for name in READ_OPTIONS}
        try:
            check_dialect(self.delimiter or ",", self.quotechar or '"', self.escapechar)
            Reading.of("x.csv", options).tokens()
        except ValueError as err:
            raise PydanticCustomError(INPUT_ERROR, str(err)) from None
        return self

    @model_validator(mode="after")
    def _output_outside_source(self) -> S3BatchInput:
        # Every key the job writes (parts, rejects, report, state, write check) must lie outside what
        # it lists, or the listing would hand the job its own output (or its own write check).
        if self.bucket != self.output_bucket:
            return self
        clashes = layout.keys_listed_by(self.prefix, self.output_prefix)
        if clashes:
            raise PydanticCustomError(
                INPUT_ERROR,
                f"output_prefix {self.output_prefix!r} writes under the source prefix {self.prefix!r} of "
                f"bucket {self.bucket!r} ({' and '.join(clashes)}), so the job would list what it writes; choose "
                "another output_bucket, or an output_prefix and prefix that do not overlap (e.g. "
                "prefix 'exports/' with output_prefix 'processed/')"
            )
        return self

    @model_serializer(mode="wrap")
    def _omit_unset_limits(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = without_nones(handler(self), _UNSET_OMITTED)
        if isinstance(data, dict):
            if data.get("bucket") == "":
                del data["bucket"]  # a manifest job's: "" is no bucket (and not a bucket name)
            if data.get("split_bytes", 0) == DEFAULT_SPLIT_BYTES:
                del data["split_bytes"]
            return {name: value for name, value in data.items() if not (name in _OFF_OMITTED and value is False)}
        return data


class JobSpec(S3BatchInput):
    """The job as the workflow hands it to its activities: the same fields, but unknown ones are
    ignored, so an activity worker of an older version still accepts a job from a newer workflow."""

    model_config = ConfigDict(extra="ignore", strict=True)

    @classmethod
    def of(cls, job: S3BatchInput) -> JobSpec:
        return job if isinstance(job, JobSpec) else cls.model_validate(job.model_dump())

"""What the client functions return: plain typed views of a job, serialisable with ``to_json``."""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from s3batch.checkpoint import Checkpoint
from s3batch.formats.keys import split_suffix
from s3batch.messages import Progress, S3BatchResult, SplitRange
from s3batch.models import REDRIVE_STATUSES, S3BatchInput
from s3batch.report import JobReport, ReportFile


@dataclass
class InFlightFile:
    """One file being processed: its pending activity and the last checkpoint it heartbeated."""

    key: str | None
    activity_id: str
    attempt: int
    state: str
    """``scheduled`` (waiting for a worker or a retry) or ``started``."""
    last_heartbeat: datetime.datetime | None
    checkpoint: Checkpoint | None
    """None until the attempt's first heartbeat reached the server."""
    last_failure: str | None
    group_files: int = 1
    """Files of the activity: more than one for a group of small files, processed in turn."""
    group_index: int = 0
    """Which of the group's files ``key`` and ``checkpoint`` are about."""
    sizes: list[int] = field(default_factory=list)
    """Object sizes of the activity's files, in order (from its input; empty if unknown)."""
    group_done: int | None = None
    """Source bytes of the group's files finished, in any order (``HeartbeatDetails.group_done``; None: a
    single file, or a worker of an earlier version: the files before ``group_index`` are taken as done)."""
    split: SplitRange | None = None
    """The byte range of a big file this activity processes (``S3BatchInput.split_bytes``); None: all of it."""

    @property
    def size(self) -> int | None:
        """Size of the object ``checkpoint`` is about."""
        return self.sizes[self.group_index] if self.group_index < len(self.sizes) else None

    @property
    def span(self) -> tuple[int, int] | None:
        """The bytes of the object this activity reads (all of it, or its split's nominal range)."""
        size = self.size
        if size is None:
            return None
        return (0, size) if self.split is None else (self.split.start, self.split.end)

    @property
    def done_in_span(self) -> int:
        """Bytes of :attr:`span` read up to the checkpoint (0 before one, or without a byte offset)."""
        cp, span = self.checkpoint, self.span
        if cp is None or cp.byte_offset is None or span is None:
            return 0
        return max(0, min(cp.byte_offset, span[1]) - span[0])

    @property
    def fraction(self) -> float | None:
        """How far through its object (or its split) the file is, 0..1; None where unknown (gzip: no byte offset)."""
        cp, span = self.checkpoint, self.span
        if cp is None or cp.byte_offset is None or span is None or span[1] <= span[0]:
            return None
        return min(1.0, self.done_in_span / (span[1] - span[0]))

    @property
    def offsetless(self) -> str:
        """Why the file has no byte offset to show: its compression (``gzip``, ``zstd``, ``bzip2``;
        a compressed stream is read from its start), ``parquet`` (read by row group), or
        ``compressed`` when the key does not say."""
        base, compression = split_suffix(self.key or "")
        if compression:
            return compression
        return "parquet" if base.endswith((".parquet", ".pq")) else "compressed"

    @property
    def bytes_done(self) -> int:
        """Source bytes of this activity already consumed: the group's finished files and the current file up
        to its checkpoint (0 for gzip, whose offset is unknown). A group's other files in flight are not
        counted: a few files at once, the heartbeat names one."""
        done = sum(self.sizes[: self.group_index]) if self.group_done is None else self.group_done
        return done + self.done_in_span

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "size": self.size,
            "activity_id": self.activity_id,
            "attempt": self.attempt,
            "state": self.state,
            "last_heartbeat": self.last_heartbeat.isoformat() if self.last_heartbeat else None,
            "checkpoint": self.checkpoint.model_dump(mode="json") if self.checkpoint else None,
            "last_failure": self.last_failure,
            "group_files": self.group_files,
            "group_index": self.group_index,
            **({} if self.split is None else {"split": self.split.index, "splits": self.split.count}),
        }


TASK_WAIT_SECONDS = 10.0
"""A workflow task scheduled this long ago and not picked up: no worker serves the job's task queue
(a stopped worker is still listed as a poller for a while)."""


@dataclass
class JobView:
    """One job as :func:`s3batch.client.describe` sees it: progress and in-flight files while it
    runs, its outcome once done."""

    workflow_id: str
    run_id: str | None
    status: str
    """``running``, ``succeeded``, ``failed``, ``cancelled``, ``terminated`` or ``timed_out`` (the words of
    the report; Temporal says completed and canceled)."""
    ui_url: str
    progress: Progress | None = None
    """The ``progress`` query's answer; None when no worker could answer (yet)."""
    in_flight: list[InFlightFile] = field(default_factory=list)
    result: S3BatchResult | None = None
    error: str | None = None
    """Why the job failed, once it has."""
    task_queue: str | None = None
    """The job's task queue (while it runs)."""
    workers: int | None = None
    """Workers polling that task queue now (while it runs): 0 means the job waits for one."""
    task_wait: float = 0.0
    """Seconds the job's workflow task has waited for a worker to pick it up (0: none waits)."""

    @property
    def waits_for_worker(self) -> bool:
        """The job runs but no worker serves its task queue (none polls it, or its task waits)."""
        return self.workers == 0 or self.task_wait >= TASK_WAIT_SECONDS

    def to_json(self) -> dict[str, Any]:
        return {
            "workflow_id": self.workflow_id,
            "run_id": self.run_id,
            "status": self.status,
            "ui_url": self.ui_url,
            "task_queue": self.task_queue,
            "workers": self.workers,
            "waits_for_worker": self.waits_for_worker,
            "progress": self.progress.model_dump(mode="json") if self.progress else None,
            "in_flight": [f.to_json() for f in self.in_flight],
            "result": self.result.model_dump(mode="json") if self.result else None,
            "error": self.error,
        }


class Outcome(NamedTuple):
    """How a job ended: its result, or why it failed."""

    result: S3BatchResult | None
    error: str | None


@dataclass
class StartedJob:
    """A job :func:`s3batch.client.start` started, or found already running under its ID."""

    workflow_id: str
    run_id: str | None
    namespace: str
    already_running: bool
    """The ID was running: that job is followed, with its own input, and nothing was started."""
    ui_url: str

    def to_json(self) -> dict[str, Any]:
        return {
            "workflow_id": self.workflow_id,
            "run_id": self.run_id,
            "namespace": self.namespace,
            "already_running": self.already_running,
            "ui_url": self.ui_url,
        }


@dataclass
class JobSummary:
    """One job of :func:`s3batch.client.list_jobs`, from the server's visibility store."""

    workflow_id: str
    run_id: str
    status: str
    start_time: datetime.datetime
    close_time: datetime.datetime | None
    task_queue: str
    source: str | None
    """``bucket/prefix`` (an HMAC of it with encryption), from the S3BatchSource search attribute."""
    search_status: str | None
    """The S3BatchStatus search attribute: what a running job is doing."""
    files_done: int | None
    files_failed: int | None

    def to_json(self) -> dict[str, Any]:
        return {
            "workflow_id": self.workflow_id,
            "run_id": self.run_id,
            "status": self.status,
            "start_time": self.start_time.isoformat(),
            "close_time": self.close_time.isoformat() if self.close_time else None,
            "task_queue": self.task_queue,
            "source": self.source,
            "search_status": self.search_status,
            "files_done": self.files_done,
            "files_failed": self.files_failed,
        }


@dataclass
class StoredReport:
    """A job report, where it is stored on S3 and the ETag it was read at."""

    bucket: str
    key: str
    report: JobReport
    etag: str

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.key}"


@dataclass
class RedrivePlan:
    """A redrive ready to start (:func:`s3batch.client.prepare_redrive`): the original report is
    already copied to ``original_report``, where the new job reads its files from."""

    of: str
    """The finished job redriven."""
    workflow_id: str
    """ID of the new job."""
    job: S3BatchInput
    """The original input plus ``only_failed_of``."""
    task_queue: str
    files: list[ReportFile]
    """The report's entries of the files processed again."""
    unlisted: bool
    """The original job was cancelled before its listing ended: the new one lists the rest."""
    report: str
    """``s3://`` URI of the layout's report, which the new job overwrites when it ends."""
    original_report: str
    """``s3://`` URI of the copy of the original report (of a redrive of rejected records: the report itself)."""
    rejected: int | None = None
    """A redrive of rejected records: how many records the files redriven had rejected (None: a redrive of files)."""

    def counts(self) -> dict[str, int]:
        """Files to process again, by status in the original report."""
        return {s: sum(1 for f in self.files if f.status == s) for s in REDRIVE_STATUSES}

    def to_json(self) -> dict[str, Any]:
        found = {
            "redrive_of": self.of,
            "files": len(self.files),
            "original_report": self.original_report,
            "report": self.report,
        }
        if self.rejected is not None:
            found.update(rejected=self.rejected, output_prefix=self.job.output_prefix)
        return found

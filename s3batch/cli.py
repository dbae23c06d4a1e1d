"""``s3batch``: start an S3 batch job and follow it from the command line.

    s3batch start --bucket incoming --prefix customers/ --output-bucket processed --wait
    s3batch status s3batch-incoming-1a2b3c4d [--json]
    s3batch pause ID / s3batch resume ID     # pause lets running files finish
    s3batch set-concurrency ID 16
    s3batch cancel ID                        # in-flight files stop at a chunk boundary
    s3batch watch ID [--interval 1] [--once]  # live view: a bar per file in flight, speed, ETA
    s3batch report ID [--json]
    s3batch redrive ID [--id NEW_ID] [--wait] # a new job over the files that failed in ID
    s3batch list [--running] [--source BUCKET/PREFIX] [--json]

``pause``, ``resume`` and ``set-concurrency`` are workflow updates, so
``temporal workflow update execute --name pause --workflow-id ID`` does the same (``set_concurrency``
takes ``--input N``).

The job flags are the fields of :class:`~s3batch.models.S3BatchInput` (``chunk_records`` is
``--chunk-records``), validated locally before anything is started. The Temporal connection comes
from Temporal's own environment (``TEMPORAL_ADDRESS``, ``TEMPORAL_NAMESPACE``, profiles; see
:mod:`s3batch.config`), the task queue from ``S3BATCH_TASK_QUEUE`` unless ``--task-queue`` is given.

Exit codes: 0 done; 1 the job failed, or Temporal could not be reached; 2 invalid input;
3 the command does not apply to the job in its state: the ID belongs to a job that already finished
(IDs are never reused; controls need a running job), or ``redrive`` was given a job that is still
running or has no failed or cancelled files.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import datetime
import inspect
import itertools
import json
import os
import sys
import textwrap
import time
import uuid
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel, ValidationError
from rich import filesize
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress import BarColumn, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as ProgressBar
from rich.progress_bar import ProgressBar as Bar
from rich.table import Table
from rich.text import Text
from temporalio.api.enums.v1 import PendingActivityState
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowQueryFailedError,
    WorkflowUpdateFailedError,
)
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import ActivityError, ApplicationError, WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from s3batch import WORKFLOW_TYPE, layout
from s3batch import search_attributes as sa
from s3batch.codec import KeyringError, keys_from_env
from s3batch.config import Settings, connect, connect_config, ui_base
from s3batch.logs import printable
from s3batch.models import (
    REDRIVE_STATUSES,
    Checkpoint,
    ObjectRef,
    ProcessFileInput,
    Progress,
    S3BatchInput,
    S3BatchResult,
    Totals,
    describe_validation_error,
)
from s3batch.plugin import S3BatchPlugin
from s3batch.s3io import make_client

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_ID_USED = 3

PROCESS_FILE_ACTIVITY = "s3batch.process_file"
PROCESS_GROUP_ACTIVITY = "s3batch.process_group"
FILE_ACTIVITIES = (PROCESS_FILE_ACTIVITY, PROCESS_GROUP_ACTIVITY)
"""Activity types that process files (one, or a group of small ones): their pending attempts are
the files in flight."""

_POLL_SECONDS = 0.5
_QUERY_TIMEOUT = timedelta(seconds=5)

# No emoji codes: ":name:" in an object key must print as typed.
out = Console(soft_wrap=True, highlight=False, emoji=False)
err_out = Console(stderr=True, soft_wrap=True, highlight=False, emoji=False)


def safe_line(*parts: object) -> Text:
    """One line of output that rich never reads as markup: ``[/bold]`` or ``[link=...]`` in a key is
    shown as typed, never applied, and cannot crash the command. Each part is a value (shown through
    :func:`printable`) or a ``(value, style)`` pair."""
    return Text.assemble(
        *((printable(part[0]), part[1]) if isinstance(part, tuple) else printable(part) for part in parts)
    )


def cell(value: object, style: str = "") -> Text:
    """A table cell showing ``value`` as typed (table cells given as ``str`` are read as markup)."""
    return Text(printable(value), style=style)


class CliError(Exception):
    """An error to print (without a traceback) and exit with ``code``."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


# ------------------------------------------------------------------------------ job flags


def _field_docs(model: type[BaseModel]) -> dict[str, str]:
    """The attribute docstrings of ``model``'s fields (the string right under each field)."""
    body = ast.parse(textwrap.dedent(inspect.getsource(model))).body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for node, after in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = " ".join(after.value.value.replace("``", "").split())
    return docs


def flag(name: str) -> str:
    """The command-line flag of an :class:`S3BatchInput` field: ``chunk_records`` -> ``--chunk-records``."""
    return "--" + name.replace("_", "-")


def _add_job_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per :class:`S3BatchInput` field, so the command cannot drift from the model.

    Flags are plain strings left out of the namespace unless given: the model converts and
    validates them, and supplies its own defaults.
    """
    docs = _field_docs(S3BatchInput)
    group = parser.add_argument_group("job input (the fields of S3BatchInput)")
    for name, info in S3BatchInput.model_fields.items():
        choices = get_args(info.annotation) if get_origin(info.annotation) is Literal else ()
        metavar = "{" + ",".join(choices) + "}" if choices else name.split("_")[-1].upper()
        default = "required" if info.is_required() else f"default: {info.default!r}"
        help_text = f"{docs.get(name, '')} ({default})".replace("%", "%%")
        group.add_argument(flag(name), dest=name, metavar=metavar, default=argparse.SUPPRESS, help=help_text)


def job_from_args(args: argparse.Namespace) -> S3BatchInput:
    """Validate the job flags into an :class:`S3BatchInput`.

    Raises:
        CliError: With ``EXIT_BAD_INPUT`` and a message naming each invalid field.
    """
    values = {name: getattr(args, name) for name in S3BatchInput.model_fields if hasattr(args, name)}
    try:
        # Flags are text: "--chunk-records 500" is read as a number here (JSON input stays strict).
        return S3BatchInput.model_validate(values, strict=False)
    except ValidationError as err:
        raise CliError(
            f"invalid job input: {describe_validation_error(err, what='input')}\n"
            "(nothing was started; see `s3batch start --help`)",
            EXIT_BAD_INPUT,
        ) from None


# ------------------------------------------------------------------------------ job state


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

    @property
    def size(self) -> int | None:
        """Size of the object ``checkpoint`` is about."""
        return self.sizes[self.group_index] if self.group_index < len(self.sizes) else None

    @property
    def fraction(self) -> float | None:
        """How far through its object the file is, 0..1; None where unknown (gzip: no byte offset)."""
        cp, size = self.checkpoint, self.size
        if cp is None or cp.byte_offset is None or not size:
            return None
        return min(1.0, cp.byte_offset / size)

    @property
    def bytes_done(self) -> int:
        """Source bytes of this activity already consumed: the group's earlier files (finished)
        and the current file up to its checkpoint (0 for gzip, whose offset is unknown)."""
        done = sum(self.sizes[: self.group_index])
        cp = self.checkpoint
        return done + ((cp.byte_offset or 0) if cp is not None else 0)

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
        }


@dataclass
class JobView:
    """What ``status`` reports about one job."""

    workflow_id: str
    run_id: str | None
    status: str
    """``running``, ``completed``, ``failed``, ``canceled``, ``terminated`` or ``timed_out``."""
    ui_url: str
    progress: Progress | None = None
    in_flight: list[InFlightFile] = field(default_factory=list)
    result: S3BatchResult | None = None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "workflow_id": self.workflow_id,
            "run_id": self.run_id,
            "status": self.status,
            "ui_url": self.ui_url,
            "progress": self.progress.model_dump(mode="json") if self.progress else None,
            "in_flight": [f.to_json() for f in self.in_flight],
            "result": self.result.model_dump(mode="json") if self.result else None,
            "error": self.error,
        }


def ui_link(client: Client, workflow_id: str) -> str:
    """The job's page in the Temporal Web UI."""
    return f"{ui_base(Settings())}/namespaces/{client.namespace}/workflows/{workflow_id}"


async def query_progress(handle: WorkflowHandle[Any, Any]) -> Progress | None:
    """The workflow's ``progress`` query, or None when it cannot answer now (no worker yet)."""
    try:
        return await handle.query("progress", result_type=Progress, rpc_timeout=_QUERY_TIMEOUT)
    except (WorkflowQueryFailedError, RPCError):
        return None


def failure_message(err: WorkflowFailureError) -> str:
    """The reason a job failed, from the workflow failure's cause."""
    cause = err.cause
    while isinstance(cause, ActivityError) and cause.cause is not None:
        cause = cause.cause  # the activity's own error says what went wrong
    if isinstance(cause, ApplicationError):
        return f"{cause.type or 'Error'}: {cause.message}"
    return f"{type(cause).__name__}: {cause}" if cause else str(err)


async def outcome(handle: WorkflowHandle[Any, S3BatchResult]) -> tuple[S3BatchResult | None, str | None]:
    """Wait for the job's end (following continue-as-new): ``(result, None)`` or ``(None, error)``."""
    try:
        return await handle.result(), None
    except WorkflowFailureError as err:
        return None, failure_message(err)


def _input_objects(activity_type: str, value: Any) -> list[ObjectRef]:
    """The objects of one file activity's input (a group activity processes several)."""
    if activity_type == PROCESS_GROUP_ACTIVITY:
        first = ProcessFileInput.model_validate(value["file"])
        return [first.obj, *(ObjectRef.model_validate(obj) for obj in value["more"])]
    return [ProcessFileInput.model_validate(value).obj]


async def in_flight_files(
    client: Client,
    workflow_id: str,
    run_id: str,
    raw: Any,
    objects_cache: dict[tuple[str, str], list[ObjectRef]] | None = None,
) -> list[InFlightFile]:
    """The files in flight, from the pending activities of a workflow description.

    The server lists pending activities without their input; the objects (keys and sizes) are read
    from the ``ActivityTaskScheduled`` events of the same run (a run holds at most a few thousand
    events). A group activity heartbeats ``(checkpoint, index)``: the checkpoint of its
    ``index``-th file. ``objects_cache`` (by run and activity ID) spares a caller that polls
    (``watch``) reading the history again while the same activities are pending.
    """
    pending = [p for p in raw.pending_activities if p.activity_type.name in FILE_ACTIVITIES]
    if not pending:
        return []
    converter = client.data_converter
    cache = objects_cache if objects_cache is not None else {}
    wanted = {p.activity_id for p in pending if (run_id, p.activity_id) not in cache}
    if wanted:
        async for event in client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history_events():
            if not event.HasField("activity_task_scheduled_event_attributes"):
                continue
            attrs = event.activity_task_scheduled_event_attributes
            if attrs.activity_id in wanted and attrs.input.payloads:
                [value] = await converter.decode(attrs.input.payloads[:1])
                cache[(run_id, attrs.activity_id)] = _input_objects(attrs.activity_type.name, value)
    files = []
    for p in pending:
        details = await converter.decode(p.heartbeat_details.payloads) if p.heartbeat_details.payloads else []
        checkpoint = Checkpoint.model_validate(details[0]) if details else None
        index = details[1] if len(details) > 1 and isinstance(details[1], int) else 0
        group = cache.get((run_id, p.activity_id), [])
        files.append(
            InFlightFile(
                key=group[index].key if index < len(group) else None,
                activity_id=p.activity_id,
                attempt=p.attempt,
                state=PendingActivityState.Name(p.state).removeprefix("PENDING_ACTIVITY_STATE_").lower(),
                last_heartbeat=(
                    p.last_heartbeat_time.ToDatetime(tzinfo=datetime.UTC) if p.HasField("last_heartbeat_time") else None
                ),
                checkpoint=checkpoint,
                last_failure=p.last_failure.message if p.HasField("last_failure") else None,
                group_files=len(group),
                group_index=index,
                sizes=[obj.size for obj in group],
            )
        )
    return sorted(files, key=lambda f: f.key or "")


async def load_job(
    client: Client, workflow_id: str, objects_cache: dict[tuple[str, str], list[ObjectRef]] | None = None
) -> JobView:
    """Describe a job: progress and in-flight checkpoints while it runs, its outcome once done.

    Raises:
        CliError: No job has this ID.
    """
    handle = client.get_workflow_handle(workflow_id, result_type=S3BatchResult)
    try:
        desc = await handle.describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise CliError(f"no job with ID {workflow_id!r} in namespace {client.namespace!r}") from None
        raise
    status = desc.status.name.lower() if desc.status else "unknown"
    view = JobView(workflow_id=workflow_id, run_id=desc.run_id, status=status, ui_url=ui_link(client, workflow_id))
    if desc.status == WorkflowExecutionStatus.RUNNING:
        view.progress = await query_progress(handle)
        view.in_flight = await in_flight_files(
            client, workflow_id, desc.run_id, desc.raw_description, objects_cache
        )
    else:
        view.result, view.error = await outcome(handle)
    return view


# ------------------------------------------------------------------------------ rendering


def totals_lines(t: Totals | Progress, *, listing_done: bool = True) -> list[str]:
    """Two human lines of job counters (``Totals`` and ``Progress`` share these fields)."""
    done = t.files_succeeded + t.files_failed
    listed = f"{t.files_listed}{'' if listing_done else '+'}"
    return [
        f"files    {done} done of {listed} listed ({t.files_succeeded} succeeded, {t.files_failed} failed)",
        f"records  {t.records:,} read: {t.records_written:,} written, {t.rejected:,} rejected; "
        f"{filesize.decimal(t.bytes_read)} read",
    ]


def print_outcome(result: S3BatchResult | None, error: str | None) -> None:
    if result is not None:
        out.print(safe_line((f"Job {result.status}", "bold green")))
        for line in totals_lines(result.totals):
            out.print(f"  {line}")
        out.print(safe_line(f"  report   s3://{result.report_bucket}/{result.report_key}"))
    else:
        err_out.print(safe_line(("Job failed:", "bold red"), f" {error}"))


def state_line(p: Progress) -> str:
    """What a running job is doing now: files in flight, pause, cancellation, concurrency, run."""
    if p.cancelling:
        doing = "cancelling: files in flight stop at their next chunk boundary"
    elif p.paused:
        doing = "paused: no new file starts; files in flight finish"
    else:
        doing = f"at most {p.max_concurrent_files or '?'} file(s) at once"
    return (
        f"running  {p.files_in_flight} file(s) in flight (counted above once finished); {doing}; "
        f"workflow run {p.run + 1}"
    )


def _file_label(f: InFlightFile) -> Text:
    """The file's key, as typed, and its place in a group."""
    group = f" (file {f.group_index + 1} of {f.group_files} in a group)" if f.group_files > 1 else ""
    return cell((f.key or f"activity {f.activity_id}") + group)


def _attempt(f: InFlightFile) -> str:
    return str(f.attempt) + ("" if f.state == "started" else f" ({f.state})")


def _percent(f: InFlightFile) -> str:
    """``42%`` of the object read, ``gzip`` where the offset is unknown, ``-`` before a checkpoint."""
    if f.fraction is not None:
        return f"{f.fraction:.0%}"
    return "-" if f.checkpoint is None or f.checkpoint.byte_offset is not None else "gzip"


def print_view(view: JobView) -> None:
    colour = {"running": "cyan", "completed": "green"}.get(view.status, "red")
    out.print(safe_line((view.workflow_id, "bold"), ": ", (view.status, f"bold {colour}")))
    out.print(safe_line(f"  Web UI   {view.ui_url}"))
    if view.status != "running":
        print_outcome(view.result, view.error)
        return
    if view.progress is None:
        out.print("  progress unavailable (no worker has picked the job up yet?)")
    else:
        p = view.progress
        for line in totals_lines(p, listing_done=p.listing_done):
            out.print(f"  {line}")
        out.print(f"  {state_line(p)}")
    if not view.in_flight:
        return
    table = Table(title="In-flight files: last checkpoint", title_justify="left", box=None, padding=(0, 1))
    table.add_column("file", overflow="fold")
    for column in ("attempt", "done", "next record", "byte offset", "chunk", "rejected", "heartbeat"):
        table.add_column(column, justify="right", no_wrap=True)
    now = datetime.datetime.now(datetime.UTC)
    for f in view.in_flight:
        cp = f.checkpoint
        table.add_row(
            _file_label(f),
            _attempt(f),
            _percent(f),
            f"{cp.next_record:,}" if cp else "-",
            "-" if cp is None or cp.byte_offset is None else f"{cp.byte_offset:,}",
            str(cp.chunk) if cp else "-",
            f"{cp.rejected:,}" if cp else "-",
            _age(f, now),
        )
    out.print(table)
    for f in view.in_flight:
        if f.last_failure:
            out.print(safe_line(f"  {f.key}: last attempt failed: {f.last_failure}"))


# ------------------------------------------------------------------------------ watch

WATCH_WINDOW_SECONDS = 10.0
"""Throughput is measured over the samples of this many seconds."""


@dataclass(frozen=True)
class Sample:
    """Job-wide amounts at one poll: finished files' totals plus the in-flight files' checkpoints."""

    t: float
    """Seconds on a monotonic clock."""
    records: int
    bytes: int


def sample_of(view: JobView, t: float) -> Sample | None:
    """The amounts processed so far, finished and in flight, or None without progress."""
    p = view.progress
    if p is None:
        return None
    records = p.records + sum(f.checkpoint.next_record for f in view.in_flight if f.checkpoint)
    return Sample(t, records, p.bytes_read + sum(f.bytes_done for f in view.in_flight))


def _window_start(samples: Sequence[Sample], window: float) -> Sample:
    """The oldest sample of the last ``window`` seconds."""
    return next(s for s in samples if s.t >= samples[-1].t - window)


def throughput(samples: Sequence[Sample], window: float = WATCH_WINDOW_SECONDS) -> tuple[float, float] | None:
    """``(records/s, bytes/s)`` between the oldest sample of the last ``window`` seconds and the
    newest, or None with less than two samples. Never negative (a retried file can step back)."""
    if len(samples) < 2:
        return None
    last, first = samples[-1], _window_start(samples, window)
    span = last.t - first.t
    if span <= 0:
        return None
    return max(0.0, (last.records - first.records) / span), max(0.0, (last.bytes - first.bytes) / span)


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m"
    return f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"


def eta(view: JobView, bytes_per_second: float | None) -> str:
    """Time left from the bytes remaining at the current speed (None: not measured yet), and how
    it is known.

    The ``progress`` query gives file counts, not the listed files' sizes: the bytes left are the
    in-flight files' (their sizes are in their activities' input) plus, for files not started
    yet, the average size of the files seen so far. Before the listing is complete the number of
    files is unknown, so there is no ETA.
    """
    p = view.progress
    if p is None:
        return "unknown (no progress yet)"
    if not p.listing_done:
        return f"after the listing completes ({p.files_listed} files listed so far, more to come)"
    seen_files = p.files_succeeded + p.files_failed + p.files_cancelled
    flight_sizes = [size for f in view.in_flight for size in f.sizes]
    seen_bytes = p.bytes_read + sum(flight_sizes)
    seen_count = seen_files + len(flight_sizes)
    not_started = max(0, p.files_listed - seen_files - p.files_in_flight)
    flight_left = sum(flight_sizes) - sum(f.bytes_done for f in view.in_flight)
    average = seen_bytes / seen_count if seen_count else 0.0
    left = flight_left + not_started * average
    estimated = " (files not started yet counted at the average size so far)" if not_started else ""
    if left <= 0:
        return "any moment (the last files are finishing)"
    if bytes_per_second is None:
        return "measuring..."
    if not bytes_per_second:
        return "unknown (no bytes read in the last few seconds)" + estimated
    return f"{_duration(left / bytes_per_second)}: {filesize.decimal(round(left))} left{estimated}"


_BAR_WIDTH = 30


def _age(f: InFlightFile, now: datetime.datetime) -> str:
    return f"{(now - f.last_heartbeat).total_seconds():.0f}s ago" if f.last_heartbeat else "none yet"


def in_flight_table(files: Sequence[InFlightFile], now: datetime.datetime) -> Table:
    """One row per file in flight: a bar of the object read up to its last checkpoint, or (gzip,
    whose byte offset is unknown) the records and chunks so far.

    Checkpoints reach the server as heartbeats, which the worker throttles to one per 0.8 x the
    job's ``heartbeat_timeout_seconds``: with the default 30 s a bar moves every 24 s or so; the
    ``checkpoint`` column says how old each one is."""
    table = Table(box=None, padding=(0, 1), title="In flight", title_justify="left")
    table.add_column("file", overflow="fold")
    table.add_column("read", no_wrap=True)
    table.add_column("done", justify="right", no_wrap=True)
    table.add_column("bytes", justify="right", no_wrap=True)
    for column in ("records", "chunk", "attempt", "checkpoint"):
        table.add_column(column, justify="right", no_wrap=True)
    for f in files:
        cp, size = f.checkpoint, f.size
        if f.fraction is not None and cp is not None and size:
            bar: RenderableType = Bar(total=size, completed=cp.byte_offset or 0, width=_BAR_WIDTH)
            amount = f"{filesize.decimal(cp.byte_offset or 0)} / {filesize.decimal(size)}"
        elif cp is None:
            bar, amount = Text("waiting for the first checkpoint", style="dim"), "-"
        else:
            bar = Text("gzip: no byte offset", style="dim")
            amount = f"? / {filesize.decimal(size)}" if size is not None else "-"
        table.add_row(
            _file_label(f),
            bar,
            _percent(f),
            amount,
            f"{cp.next_record:,}" if cp else "-",
            str(cp.chunk) if cp else "-",
            _attempt(f),
            _age(f, now),
        )
    return table


def watch_renderable(
    view: JobView,
    samples: Sequence[Sample],
    window: float = WATCH_WINDOW_SECONDS,
    now: datetime.datetime | None = None,
) -> RenderableType:
    """The ``watch`` screen, a pure function of one poll (``view``), the samples so far and the
    time (for the checkpoints' age; default: the clock)."""
    colour = {"running": "cyan", "completed": "green"}.get(view.status, "red")
    lines: list[RenderableType] = [
        safe_line((view.workflow_id, "bold"), ": ", (view.status, f"bold {colour}")),
        Text(f"  Web UI   {printable(view.ui_url)}"),
    ]
    p = view.progress
    if p is None:
        lines.append(Text("  progress unavailable (no worker has picked the job up yet?)"))
        return Group(*lines)
    lines += [Text(f"  {line}") for line in totals_lines(p, listing_done=p.listing_done)]
    lines.append(Text(f"  {state_line(p)}"))
    latest = samples[-1] if samples else sample_of(view, 0.0)
    if latest is not None and view.in_flight:
        lines.append(
            Text(
                f"  so far   {latest.records:,} records and {filesize.decimal(latest.bytes)} read, "
                "counting the files in flight up to their last checkpoint"
            )
        )
    rates = throughput(samples, window)
    if rates is None:
        lines.append(Text("  speed    measuring..."))
    else:
        span = samples[-1].t - _window_start(samples, window).t
        lines.append(Text(f"  speed    {rates[0]:,.0f} records/s, {rates[1] / 1e6:,.2f} MB/s (last {span:.0f} s)"))
    lines.append(Text(f"  ETA      {eta(view, rates[1] if rates else None)}"))
    if view.in_flight:
        lines.append(in_flight_table(view.in_flight, now or datetime.datetime.now(datetime.UTC)))
        lines += [
            Text(f"  {printable(f.key)}: last attempt failed: {printable(f.last_failure)}", style="yellow")
            for f in view.in_flight
            if f.last_failure
        ]
    return Group(*lines)


def print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2) + "\n")
    sys.stdout.flush()


# ------------------------------------------------------------------------------ commands


def _keys() -> list[bytes]:
    """The encryption keyring of the environment (first = current), ``[]`` without encryption."""
    try:
        return keys_from_env()
    except KeyringError as err:
        raise CliError(f"the encryption settings are not usable: {err}", EXIT_BAD_INPUT) from None


async def _connect() -> Client:
    try:
        plugin = S3BatchPlugin()
    except KeyringError as err:
        raise CliError(f"the encryption settings are not usable: {err}", EXIT_BAD_INPUT) from None
    try:
        return await connect([plugin])
    except (RuntimeError, RPCError, OSError) as err:
        target = connect_config()["target_host"]
        raise CliError(f"cannot connect to Temporal at {target} (set TEMPORAL_ADDRESS?): {err}") from None


def _was_started(handle: WorkflowHandle[Any, Any]) -> bool:
    """False when the start found the ID already running (``USE_EXISTING`` returned that run)."""
    # The SDK keeps the start response on the handle but exposes no public flag for it.
    response = getattr(handle, "_start_workflow_response", None)
    return bool(getattr(response, "started", True))


async def follow(handle: WorkflowHandle[Any, S3BatchResult]) -> tuple[S3BatchResult | None, str | None]:
    """Show a live progress bar from the ``progress`` query until the job ends."""
    done_task = asyncio.ensure_future(outcome(handle))
    columns = (
        SpinnerColumn(),
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:.0f}/{task.fields[listed]} files"),
        TextColumn("{task.fields[records]} records, {task.fields[rejected]} rejected"),
        TextColumn("{task.fields[bytes]}"),
        TimeElapsedColumn(),
    )
    with ProgressBar(*columns, console=out, transient=False) as bar:
        task = bar.add_task("waiting", total=None, listed="?", records="0", rejected="0", bytes="0 bytes")
        while not done_task.done():
            p = await query_progress(handle)
            if p is not None:
                bar.update(
                    task,
                    description="processing" if p.listing_done else "listing",
                    completed=p.files_succeeded + p.files_failed,
                    total=p.files_listed if p.listing_done else None,
                    listed=f"{p.files_listed}{'' if p.listing_done else '+'}",
                    records=f"{p.records_written:,}",
                    rejected=f"{p.rejected:,}",
                    bytes=filesize.decimal(p.bytes_read),
                )
            await asyncio.wait([done_task], timeout=_POLL_SECONDS)
        result, error = done_task.result()
        if result is not None:
            t = result.totals
            bar.update(
                task,
                description="done",
                completed=t.files_succeeded + t.files_failed,
                total=t.files_listed,
                listed=str(t.files_listed),
                records=f"{t.records_written:,}",
                rejected=f"{t.rejected:,}",
                bytes=filesize.decimal(t.bytes_read),
            )
        else:
            bar.update(task, description="failed")
    return result, error


async def start_job(
    client: Client,
    job: S3BatchInput,
    workflow_id: str,
    task_queue: str,
    *,
    wait: bool,
    as_json: bool,
    extra: dict[str, Any] | None = None,
) -> int:
    """Start ``job`` as ``workflow_id`` (or find it already running), say so, and follow it to its
    end if ``wait``. ``extra`` is merged into the JSON output. Used by ``start`` and ``redrive``."""

    # Search attributes are not payloads (the codec never sees them): with a key, S3BatchSource is
    # an HMAC of the source, not its name (see s3batch.search_attributes).
    keys = _keys()

    async def start(indexed: bool) -> WorkflowHandle[Any, S3BatchResult]:
        return await client.start_workflow(
            WORKFLOW_TYPE,
            job,
            id=workflow_id,
            task_queue=task_queue,
            result_type=S3BatchResult,
            # A running job with this ID is followed, not started again; a finished one is not rerun.
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            search_attributes=sa.at_start(job.bucket, job.prefix, keys) if indexed else None,
            # Shown as the job's summary in the Web UI (a payload: encrypted with a key).
            static_summary=f"s3://{job.bucket}/{job.prefix} -> s3://{job.output_bucket}/{job.output_prefix}",
        )

    try:
        try:
            handle = await start(indexed=True)
        except RPCError as err:
            # The namespace lacks the s3batch search attributes: the job runs unindexed.
            if err.status != RPCStatusCode.INVALID_ARGUMENT or sa.SOURCE.name not in err.message:
                raise
            handle = await start(indexed=False)
    except WorkflowAlreadyStartedError as err:
        raise CliError(
            f"job {workflow_id!r} already ran (run {err.run_id}) and is finished; an ID is never reused, so "
            f"nothing was started. `s3batch status {workflow_id}` shows its outcome; pass another --id "
            "to run the job again.",
            EXIT_ID_USED,
        ) from None
    started = _was_started(handle)
    link = ui_link(client, workflow_id)
    info = {
        "workflow_id": workflow_id,
        "run_id": handle.result_run_id,
        "namespace": client.namespace,
        "already_running": not started,
        "ui_url": link,
        **(extra or {}),
    }
    if not as_json:
        if started:
            out.print(safe_line("Started job ", (workflow_id, "bold")))
        else:
            out.print(
                safe_line("Job ", (workflow_id, "bold"), " was already running: not started again "
                     "(the running job keeps its own input)")
            )
        out.print(safe_line(f"  Web UI   {link}"))
        out.print(safe_line(f"  status   s3batch status {workflow_id}"))
        out.print(safe_line(f"  watch    s3batch watch {workflow_id}"))
    if not wait:
        if as_json:
            print_json(info)
        return EXIT_OK
    # Follow the latest run of the ID, whatever continue-as-new does.
    latest = client.get_workflow_handle(workflow_id, result_type=S3BatchResult)
    if as_json:
        result, error = await outcome(latest)
        status = "completed" if result is not None else "failed"
        print_json({**info, "status": status, "result": result.model_dump(mode="json") if result else None,
                    "error": error})
    else:
        result, error = await follow(latest)
        print_outcome(result, error)
        out.print(safe_line(f"  Web UI   {link}"))
    return EXIT_OK if result is not None else EXIT_FAILED


def default_workflow_id(job: S3BatchInput, *, encrypted: bool) -> str:
    """``s3batch-<bucket>-<random>``; with encryption ``s3batch-<random>``: workflow IDs are stored
    in plain text, and the bucket name is what encryption hides."""
    if encrypted:
        return f"s3batch-{uuid.uuid4().hex[:16]}"
    return f"s3batch-{job.bucket}-{uuid.uuid4().hex[:8]}"


async def cmd_start(args: argparse.Namespace) -> int:
    job = job_from_args(args)  # before connecting: bad input never reaches the server
    workflow_id = args.id or default_workflow_id(job, encrypted=bool(_keys()))
    client = await _connect()
    task_queue = args.task_queue or Settings().task_queue
    return await start_job(client, job, workflow_id, task_queue, wait=args.wait, as_json=args.json)


async def cmd_status(args: argparse.Namespace) -> int:
    client = await _connect()
    view = await load_job(client, args.workflow_id)
    if args.json:
        print_json(view.to_json())
    else:
        print_view(view)
    return EXIT_OK


async def cmd_watch(args: argparse.Namespace) -> int:
    """Redraw the job's live view every ``--interval`` seconds until it ends, then print its
    outcome as ``start --wait`` does (and exit the same way)."""
    if args.interval <= 0:
        raise CliError("--interval must be positive", EXIT_BAD_INPUT)
    client = await _connect()
    cache: dict[tuple[str, str], list[ObjectRef]] = {}
    samples: deque[Sample] = deque()
    view = await load_job(client, args.workflow_id, cache)
    if args.once and view.status == "running":
        sample = sample_of(view, time.monotonic())
        out.print(watch_renderable(view, [sample] if sample else []))
        return EXIT_OK
    if view.status == "running":
        with Live(console=out, auto_refresh=False, transient=False) as live:
            fresh = True
            while view.status == "running":
                sample = sample_of(view, time.monotonic()) if fresh else None
                if sample is not None:
                    samples.append(sample)
                    while samples[0].t < sample.t - 2 * WATCH_WINDOW_SECONDS:
                        samples.popleft()
                live.update(watch_renderable(view, samples), refresh=True)
                await asyncio.sleep(args.interval)
                try:
                    view, fresh = await load_job(client, args.workflow_id, cache), True
                except RPCError as err:
                    # A blip of the server (or a proxy) must not end the view: keep the last poll.
                    err_out.print(safe_line(("poll failed, retrying:", "yellow"), f" {err.message}"))
                    fresh = False
    out.print(safe_line((view.workflow_id, "bold"), f": {view.status}"))
    print_outcome(view.result, view.error)
    out.print(safe_line(f"  Web UI   {view.ui_url}"))
    return EXIT_OK if view.result is not None else EXIT_FAILED


# ------------------------------------------------------------------------------ control


async def _existing(client: Client, workflow_id: str) -> WorkflowHandle[Any, S3BatchResult]:
    """A handle on the latest run of a job that exists.

    Raises:
        CliError: No job has this ID.
    """
    handle = client.get_workflow_handle(workflow_id, result_type=S3BatchResult)
    try:
        await handle.describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise CliError(f"no job with ID {workflow_id!r} in namespace {client.namespace!r}") from None
        raise
    return handle


async def _update(workflow_id: str, name: str, *args: Any) -> Progress:
    """Send one control update to a running job and return its progress afterwards."""
    client = await _connect()
    handle = await _existing(client, workflow_id)
    try:
        return await handle.execute_update(name, args=list(args), result_type=Progress)
    except WorkflowUpdateFailedError as err:
        cause = err.cause
        message = cause.message if isinstance(cause, ApplicationError) else str(cause)
        raise CliError(f"{name} rejected: {message}", EXIT_BAD_INPUT) from None
    except RPCError as err:
        if err.status in (RPCStatusCode.NOT_FOUND, RPCStatusCode.FAILED_PRECONDITION):
            raise CliError(f"job {workflow_id!r} is not running: {err.message}", EXIT_ID_USED) from None
        raise


def _print_control(args: argparse.Namespace, p: Progress, message: Text) -> None:
    if args.json:
        print_json({"workflow_id": args.workflow_id, "progress": p.model_dump(mode="json")})
        return
    out.print(message)
    out.print(
        f"  {'paused' if p.paused else 'running'}, at most {p.max_concurrent_files} file(s) at once; "
        f"{p.files_in_flight} in flight, {p.files_succeeded + p.files_failed} done of {p.files_listed} listed"
    )


async def cmd_pause(args: argparse.Namespace) -> int:
    p = await _update(args.workflow_id, "pause")
    _print_control(
        args, p, safe_line("Paused job ", (args.workflow_id, "bold"), ": no new file starts; files in flight finish")
    )
    return EXIT_OK


async def cmd_resume(args: argparse.Namespace) -> int:
    p = await _update(args.workflow_id, "resume")
    _print_control(args, p, safe_line("Resumed job ", (args.workflow_id, "bold")))
    return EXIT_OK


async def cmd_set_concurrency(args: argparse.Namespace) -> int:
    p = await _update(args.workflow_id, "set_concurrency", args.n)
    _print_control(
        args, p, safe_line("Job ", (args.workflow_id, "bold"), f" now processes at most {args.n} file(s) at once")
    )
    return EXIT_OK


async def cmd_cancel(args: argparse.Namespace) -> int:
    client = await _connect()
    handle = await _existing(client, args.workflow_id)
    desc = await handle.describe()
    if desc.status != WorkflowExecutionStatus.RUNNING:
        # The server accepts a cancel request for a closed workflow and ignores it: say so instead.
        status = desc.status.name.lower() if desc.status else "closed"
        raise CliError(f"job {args.workflow_id!r} is not running (it is {status}): nothing to cancel", EXIT_ID_USED)
    try:
        await handle.cancel()
    except RPCError as err:
        if err.status in (RPCStatusCode.NOT_FOUND, RPCStatusCode.FAILED_PRECONDITION):
            raise CliError(f"job {args.workflow_id!r} is not running: {err.message}", EXIT_ID_USED) from None
        raise
    out.print(
        safe_line(
            "Cancellation requested for job ",
            (args.workflow_id, "bold"),
            ": files in flight stop at their next chunk boundary, then the report is written with them as cancelled",
        )
    )
    out.print(safe_line(f"  report   s3batch report {args.workflow_id}"))
    return EXIT_OK


async def job_input(client: Client, workflow_id: str) -> S3BatchInput:
    """The job's input, from the start event of its first run (every run has the same job)."""
    desc = await (await _existing(client, workflow_id)).describe()
    first_run = desc.raw_description.workflow_execution_info.first_run_id or desc.run_id
    async for event in client.get_workflow_handle(workflow_id, run_id=first_run).fetch_history_events():
        if event.HasField("workflow_execution_started_event_attributes"):
            payloads = event.workflow_execution_started_event_attributes.input.payloads
            [value] = await client.data_converter.decode(payloads[:1])
            return S3BatchInput.model_validate(value)
    raise CliError(f"the history of job {workflow_id!r} has no start event")


def _read_report(bucket: str, key: str) -> tuple[dict[str, Any], str] | None:
    """The job report at ``s3://bucket/key`` and its ETag, or None where there is none (yet)."""
    s3 = make_client()
    try:
        response = s3.get_object(Bucket=bucket, Key=key)
    except s3.exceptions.NoSuchKey:
        return None
    return json.loads(response["Body"].read()), response["ETag"]


async def cmd_report(args: argparse.Namespace) -> int:
    client = await _connect()
    job = await job_input(client, args.workflow_id)
    key = layout.report_key(job.output_prefix)
    got = await asyncio.to_thread(_read_report, job.output_bucket, key)
    if got is None:
        raise CliError(
            f"no report at s3://{job.output_bucket}/{key} yet: the report is written when the job ends "
            f"(see `s3batch status {args.workflow_id}`)"
        )
    report, _ = got
    if args.json:
        print_json(report)
        return EXIT_OK
    colour = {"succeeded": "green", "cancelled": "yellow"}.get(str(report.get("status")), "red")
    out.print(
        safe_line((report.get("job_id"), "bold"), ": ", (report.get("status"), f"bold {colour}"),
             f" ({report.get('finished_at')})")
    )
    out.print(safe_line(f"  {report.get('source')} -> {report.get('output')}"))
    for line in totals_lines(Totals.model_validate(report["totals"])):
        out.print(f"  {line}")
    table = Table(box=None, padding=(0, 1))
    table.add_column("file", overflow="fold")
    table.add_column("status")
    for column in ("records", "written", "rejected", "attempts"):
        table.add_column(column, justify="right", no_wrap=True)
    table.add_column("error", overflow="fold")
    style = {"succeeded": "green", "failed": "red", "cancelled": "yellow", "not_started": "dim"}
    for f in report["files"]:
        table.add_row(
            cell(f.get("key")),
            cell(f.get("status"), style.get(str(f.get("status")), "white")),
            _count(f.get("records")),
            _count(f.get("records_written")),
            _count(f.get("rejected")),
            _count(f.get("attempts")),
            cell(f.get("error") or ""),
        )
    out.print(table)
    out.print(safe_line(f"  report   s3://{job.output_bucket}/{key}"))
    return EXIT_OK




def _count(value: Any) -> Text:
    """A count from a report (``1,234``); anything else (a report written by someone else) as text."""
    return cell(f"{value:,}" if isinstance(value, int) else value)


def _copy_report(bucket: str, key: str, etag: str, copy_key: str) -> None:
    # Conditional on the ETag read: the copy is the very report whose failed files were counted.
    make_client().copy_object(
        Bucket=bucket, Key=copy_key, CopySource={"Bucket": bucket, "Key": key}, CopySourceIfMatch=etag
    )


async def cmd_redrive(args: argparse.Namespace) -> int:
    """Start a new job over the files that failed (or were cancelled) in a finished job.

    The new job has the same input, so it writes into the same output layout (a redriven file that
    committed parts resumes from them), plus ``only_failed_of``. It overwrites the layout's
    ``_report.json`` when it ends, so the original report is first copied next to it and the new
    job reads its failed files from that copy.
    """
    wid = args.workflow_id
    client = await _connect()
    desc = await (await _existing(client, wid)).describe()
    status = desc.status.name.lower() if desc.status else "unknown"
    if desc.status == WorkflowExecutionStatus.RUNNING:
        raise CliError(
            f"job {wid!r} is still running: a redrive takes the failed files from the report written when "
            f"a job ends. Wait for it (`s3batch watch {wid}`) or cancel it (`s3batch cancel {wid}`) first; "
            "nothing was started.",
            EXIT_ID_USED,
        )
    job = await job_input(client, wid)
    key = layout.report_key(job.output_prefix)
    uri = f"s3://{job.output_bucket}/{key}"
    got = await asyncio.to_thread(_read_report, job.output_bucket, key)
    if got is None:
        raise CliError(
            f"job {wid!r} ended ({status}) without a report at {uri}, so no file failed in it: nothing to "
            f"redrive (`s3batch status {wid}` says how it ended; start it again to rerun it)",
            EXIT_ID_USED,
        )
    report, etag = got
    owner = report.get("job_id")
    if owner != wid:
        raise CliError(
            f"the report at {uri} belongs to job {owner!r}, not to {wid!r}: a later job wrote into the same "
            f"output layout (a redrive does). Redrive that one instead: `s3batch redrive {owner}`",
            EXIT_ID_USED,
        )
    files = [
        f
        for f in report.get("files", [])
        if f.get("status") in REDRIVE_STATUSES and str(f.get("key", "")).startswith(job.prefix)
    ]
    # A job cancelled before its listing ended also left the rest of its listing undone.
    unlisted = not (report.get("listing") or {}).get("done", True)
    if not files and not unlisted:
        raise CliError(
            f"job {wid!r} has no failed or cancelled files in its report {uri}: nothing to redrive",
            EXIT_ID_USED,
        )
    new_id = args.id or f"{wid}-redrive-{uuid.uuid4().hex[:8]}"
    try:
        existing = await client.get_workflow_handle(new_id).describe()
    except RPCError as err:
        if err.status != RPCStatusCode.NOT_FOUND:
            raise
    else:
        if existing.status != WorkflowExecutionStatus.RUNNING:
            # Checked before copying: the copy must not replace the report that job redrove.
            raise CliError(
                f"job {new_id!r} already ran and is finished; an ID is never reused, so nothing was "
                "started. Pass another --id (or none).",
                EXIT_ID_USED,
            )
    copy_key = layout.report_copy_key(job.output_prefix, new_id)
    copy_uri = f"s3://{job.output_bucket}/{copy_key}"
    await asyncio.to_thread(_copy_report, job.output_bucket, key, etag, copy_key)
    redrive = S3BatchInput.model_validate({**job.model_dump(), "only_failed_of": copy_uri})
    counts = {s: sum(1 for f in files if f["status"] == s) for s in REDRIVE_STATUSES}
    if not args.json:
        out.print(
            safe_line("Redriving ", f"{len(files)} file(s) of job ", (wid, "bold"), f" ({counts['failed']} failed, "
            f"{counts['cancelled']} cancelled, {counts['not_started']} not started)"
            f"{', then the files it never listed,' if unlisted else ''} into the same output "
            f"s3://{job.output_bucket}/{job.output_prefix}")
        )
        out.print(safe_line(f"  original report kept at {copy_uri} (the new job writes {uri} when it ends)"))
    return await start_job(
        client,
        redrive,
        new_id,
        args.task_queue or desc.task_queue,
        wait=args.wait,
        as_json=args.json,
        extra={"redrive_of": wid, "files": len(files), "original_report": copy_uri, "report": uri},
    )


def _source_cell(source: str | None) -> Text:
    """The ``source`` column of ``list``: ``s3://bucket/prefix``, or for an encrypted job the
    HMAC it is indexed by (``s3batch list --source bucket/prefix`` finds it)."""
    if not source:
        return cell("-")
    if source.startswith(sa.HASHED):
        return cell(f"hidden ({source})")
    return cell(f"s3://{source}")


def list_query(*, running: bool, source: str | None, keys: Sequence[bytes]) -> str:
    """The visibility query of ``s3batch list``.

    Raises:
        CliError: ``source`` is not ``bucket/prefix``.
    """
    query = f'WorkflowType="{WORKFLOW_TYPE}"'
    if running:
        query += ' AND ExecutionStatus="Running"'
    if source is not None:
        bucket, slash, prefix = source.removeprefix("s3://").partition("/")
        if not bucket or not slash or '"' in source:
            raise CliError(
                f"--source must be BUCKET/PREFIX (e.g. incoming/customers/, or incoming/ for the whole bucket), got "
                f"{source!r}",
                EXIT_BAD_INPUT,
            )
        query += f" AND {sa.source_query(bucket, prefix, keys)}"
    return query


async def cmd_list(args: argparse.Namespace) -> int:
    query = list_query(running=args.running, source=args.source, keys=_keys())
    client = await _connect()
    rows = []
    async for wf in client.list_workflows(query, limit=args.limit):
        rows.append(
            {
                "workflow_id": wf.id,
                "run_id": wf.run_id,
                "status": wf.status.name.lower() if wf.status else "unknown",
                "start_time": wf.start_time.isoformat(),
                "close_time": wf.close_time.isoformat() if wf.close_time else None,
                "task_queue": wf.task_queue,
                "source": wf.typed_search_attributes.get(sa.SOURCE),
                "search_status": wf.typed_search_attributes.get(sa.STATUS),
                "files_done": wf.typed_search_attributes.get(sa.FILES_DONE),
                "files_failed": wf.typed_search_attributes.get(sa.FILES_FAILED),
            }
        )
    if args.json:
        print_json(rows)
        return EXIT_OK
    if not rows:
        out.print("no s3batch jobs")
        return EXIT_OK
    table = Table(box=None, padding=(0, 1))
    for column in ("job ID", "status", "source", "files done", "failed", "started", "closed", "task queue"):
        table.add_column(column, no_wrap=column not in ("job ID", "source"), overflow="fold")
    for r in rows:
        running = r["status"] == "running" and r["search_status"]
        table.add_row(
            cell(r["workflow_id"]),
            cell(f"running ({r['search_status']})" if running else r["status"]),
            _source_cell(r["source"]),
            "-" if r["files_done"] is None else str(r["files_done"]),
            "-" if r["files_failed"] is None else str(r["files_failed"]),
            r["start_time"][:19].replace("T", " "),
            (r["close_time"] or "-")[:19].replace("T", " "),
            cell(r["task_queue"]),
        )
    out.print(table)
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="s3batch",
        description="Start and follow s3batch jobs (durable processing of files in S3 on Temporal).",
        epilog="Temporal connection: TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE, TEMPORAL_API_KEY or a "
        "temporal.toml profile, as for the temporal CLI.",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    start = commands.add_parser("start", help="start a job (validated locally first)")
    _add_job_flags(start)
    start.add_argument(
        "--id",
        help="workflow ID (default: s3batch-<bucket>-<random>, or s3batch-<random> with an encryption key); reusing "
        "one never reruns it",
    )
    start.add_argument("--task-queue", help="task queue of the workers (default: S3BATCH_TASK_QUEUE or s3-batch)")
    start.add_argument("--wait", action="store_true", help="follow the job with a progress bar until it ends")
    start.add_argument("--json", action="store_true", help="machine-readable output")
    start.set_defaults(func=cmd_start)

    status = commands.add_parser("status", help="progress and in-flight checkpoints of a job")
    status.add_argument("workflow_id", metavar="ID", help="the job's workflow ID")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(func=cmd_status)

    for name, func, help_text in (
        ("pause", cmd_pause, "start no new file (files in flight finish)"),
        ("resume", cmd_resume, "start files again after pause"),
    ):
        sub = commands.add_parser(name, help=help_text)
        sub.add_argument("workflow_id", metavar="ID", help="the job's workflow ID")
        sub.add_argument("--json", action="store_true", help="machine-readable output")
        sub.set_defaults(func=func)

    conc = commands.add_parser("set-concurrency", help="change how many files a running job processes at once")
    conc.add_argument("workflow_id", metavar="ID", help="the job's workflow ID")
    conc.add_argument("n", metavar="N", type=int, help="files at once, 1 to 1000")
    conc.add_argument("--json", action="store_true", help="machine-readable output")
    conc.set_defaults(func=cmd_set_concurrency)

    cancel = commands.add_parser("cancel", help="stop a job gracefully (the report is still written)")
    cancel.add_argument("workflow_id", metavar="ID", help="the job's workflow ID")
    cancel.set_defaults(func=cmd_cancel)

    watch = commands.add_parser("watch", help="live view of a job: a bar per file in flight, speed and ETA")
    watch.add_argument("workflow_id", metavar="ID", help="the job's workflow ID")
    watch.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes (default: 1)")
    watch.add_argument("--once", action="store_true", help="print the view once and exit (for scripts and logs)")
    watch.set_defaults(func=cmd_watch)

    report = commands.add_parser("report", help="the report of a finished job, as a table")
    report.add_argument("workflow_id", metavar="ID", help="the job's workflow ID")
    report.add_argument("--json", action="store_true", help="the report's JSON as written to S3")
    report.set_defaults(func=cmd_report)

    redrive = commands.add_parser(
        "redrive", help="start a new job over the files that failed or were cancelled in a finished job"
    )
    redrive.add_argument("workflow_id", metavar="ID", help="the finished job's workflow ID")
    redrive.add_argument("--id", help="workflow ID of the new job (default: ID-redrive-<random>)")
    redrive.add_argument("--task-queue", help="task queue of the workers (default: the finished job's)")
    redrive.add_argument("--wait", action="store_true", help="follow the new job with a progress bar until it ends")
    redrive.add_argument("--json", action="store_true", help="machine-readable output")
    redrive.set_defaults(func=cmd_redrive)

    listing = commands.add_parser("list", help="running and recent jobs")
    listing.add_argument("--running", action="store_true", help="running jobs only")
    listing.add_argument(
        "--source",
        metavar="BUCKET/PREFIX",
        help="only jobs of this exact source (with encryption, matched by its HMAC under each configured key)",
    )
    listing.add_argument("--limit", type=int, default=50, help="at most this many jobs (default: 50)")
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    listing.set_defaults(func=cmd_list)
    return parser


def run(argv: list[str] | None = None) -> int:
    """Run the command line ``argv`` and return its exit code (for callers in Python)."""
    args = build_parser().parse_args(argv)
    try:
        return asyncio.run(args.func(args))
    except CliError as err:
        err_out.print(safe_line(("error:", "bold red"), f" {err}"))
        return err.code
    except KeyboardInterrupt:
        err_out.print("interrupted: the job itself keeps running (see `s3batch status ID`)")
        return 130


def main() -> None:
    """Console-script entry point."""
    code = run()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: the Temporal client's native threads can outlive the event loop and
    # abort a finishing interpreter (temporalio/sdk-python#300), turning a success into SIGABRT.
    os._exit(code)

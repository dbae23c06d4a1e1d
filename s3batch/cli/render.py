"""How the commands show jobs: counters, the status view, the progress bar, the report and list
tables (the live ``watch`` screen is :mod:`s3batch.cli.watch`)."""

from __future__ import annotations

import asyncio
import datetime
import json
from collections.abc import Sequence
from typing import Any

from rich import filesize
from rich.progress import BarColumn, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as ProgressBar
from rich.table import Table
from rich.text import Text
from temporalio.client import Client

from s3batch import client as api
from s3batch import search_attributes as sa
from s3batch.after_success import DONE
from s3batch.cli.output import cell, err_out, out, safe_line
from s3batch.cli.report_files import print_files
from s3batch.messages import Progress, S3BatchResult, Totals
from s3batch.models import S3BatchInput
from s3batch.report import JobReport
from s3batch.sinks.spec import destination

POLL_SECONDS = 0.5


def totals_lines(t: Totals | Progress, *, listing_done: bool = True) -> list[str]:
    """Two human lines of job counters (``Totals`` and ``Progress`` share these fields): records written and
    rejected side by side, and those of files an earlier job had written (found done: none written again)."""
    done = t.files_succeeded + t.files_failed
    listed = f"{t.files_listed}{'' if listing_done else '+'}"
    already = f", {t.already_written:,} already written by an earlier job" if t.already_written else ""
    acted: dict[str, int] = getattr(t, "after_success", None) or {}  # a job with after_success (its Totals)
    return [
        f"files    {done} done of {listed} listed ({t.files_succeeded} succeeded, {t.files_failed} failed)",
        f"records  {t.records:,} read: {t.records_written:,} written, {t.rejected:,} rejected{already}; "
        f"{filesize.decimal(t.bytes_read)} read",
    ] + ([f"sources  {', '.join(f'{n:,} {done}' for done, n in sorted(acted.items()))} after success"] if acted else [])


def warning_lines(warnings: Sequence[str]) -> list[Text]:
    """One line per warning (a high reject ratio, a CSV delimiter hint; each starts with its file's key)."""
    return [safe_line(("  warning  ", "bold yellow"), w) for w in warnings]


def empty_warning(t: Totals, source: str = "the job's prefix") -> list[str]:
    """The warning of a job that found no file (it succeeds unless ``--fail-if-empty``)."""
    if t.files_listed:
        return []
    return [f"no file matched {source}: nothing was processed (check --bucket and --prefix; --fail-if-empty "
            "makes this an error)"]  # fmt: skip


def print_outcome(result: S3BatchResult | None, error: str | None, stored: api.StoredReport | None = None) -> None:
    """How a job ended, with its counts: from its result, or for a job that failed from its report (``stored``,
    when it has one); a job with a sink says where its records went (``stored``)."""
    into = sink_destination(stored.report) if stored is not None else None
    if result is not None:
        out.print(safe_line((f"Job {result.status}", "bold green")))
        if into:
            out.print(safe_line(f"  into     {into}"))
        for line in totals_lines(result.totals):
            out.print(f"  {line}")
        for text in warning_lines([*result.warnings, *empty_warning(result.totals)]):
            out.print(text)
        out.print(safe_line(f"  report   s3://{result.report_bucket}/{result.report_key}"))
    else:
        err_out.print(safe_line(("Job failed:", "bold red"), f" {error}"))
        if stored is not None:  # what it wrote and rejected before it failed
            if into:
                out.print(safe_line(f"  into     {into}"))
            for line in totals_lines(stored.report.totals, listing_done=stored.report.listing.done):
                out.print(f"  {line}")


def state_line(p: Progress) -> str:
    """What a running job is doing now: files in flight, pause, cancellation, concurrency, run."""
    if p.cancelling:
        doing = "cancelling: files in flight stop at their next chunk boundary"
    elif p.paused:
        doing = "paused: no new file starts; files in flight finish"
    else:
        doing = f"at most {p.max_concurrent_files or '?'} file(s) at once"
    return f"running  {p.files_in_flight} file(s) in flight; {doing}; workflow run {p.run + 1}"


def status_colour(status: str) -> str:
    return {"running": "cyan", "succeeded": "green", "cancelled": "yellow"}.get(status, "red")


NO_WORKER_FIX = (
    "start one: `make worker` (a worker on the local stack, in the foreground), `s3batch-stack up --workers 2` "
    "(two in the background), or `s3batch-worker` with the job's Temporal and S3 settings"
)


def no_worker_line(task_queue: str) -> Text:
    """What to say when no worker serves a job's task queue."""
    queue = (task_queue, "bold")
    return safe_line(("no worker", "bold yellow"), " polls task queue ", queue, f": the job waits; {NO_WORKER_FIX}")


def file_label(f: api.InFlightFile) -> Text:
    """The file's key, as typed, and its place in a group."""
    group = f" (file {f.group_index + 1} of {f.group_files} in a group)" if f.group_files > 1 else ""
    if f.split is not None:
        group = f" (split {f.split.index + 1} of {f.split.count})"
    return cell((f.key or f"activity {f.activity_id}") + group)


def attempt(f: api.InFlightFile) -> str:
    return str(f.attempt) + ("" if f.state == "started" else f" ({f.state})")


def percent(f: api.InFlightFile) -> str:
    """``42%`` of the object read, ``gzip`` (or ``zstd``, ``parquet``...) where the offset is unknown,
    ``-`` before a checkpoint."""
    if f.fraction is not None:
        return f"{f.fraction:.0%}"
    return "-" if f.checkpoint is None or f.checkpoint.byte_offset is not None else f.offsetless


def age(f: api.InFlightFile, now: datetime.datetime) -> str:
    return f"{(now - f.last_heartbeat).total_seconds():.0f}s ago" if f.last_heartbeat else "none yet"


WIDE = 100
"""Terminals at least this wide get every column; narrower ones (80 columns) get the essential ones,
so that IDs and file names keep room and are never squeezed out."""


def _checkpoint_cells(f: api.InFlightFile, now: datetime.datetime) -> dict[str, str]:
    cp = f.checkpoint
    return {
        "attempt": attempt(f),
        "done": percent(f),
        "next record": f"{cp.next_record:,}" if cp else "-",
        "byte offset": "-" if cp is None or cp.byte_offset is None else f"{cp.byte_offset:,}",
        "chunk": str(cp.chunk) if cp else "-",
        "rejected": f"{cp.rejected:,}" if cp else "-",
        "heartbeat": age(f, now),
    }


def _checkpoints_table(files: Sequence[api.InFlightFile]) -> Table:
    table = Table(title="In-flight files: last checkpoint", title_justify="left", box=None, padding=(0, 1))
    table.add_column("file", overflow="fold")
    columns = ("attempt", "done", "next record", "byte offset", "chunk", "rejected", "heartbeat")
    for column in columns:
        table.add_column(column, justify="right", no_wrap=True)
    now = datetime.datetime.now(datetime.UTC)
    for f in files:
        cells = _checkpoint_cells(f, now)
        table.add_row(file_label(f), *(cells[column] for column in columns))
    return table


def _print_checkpoints_narrow(files: Sequence[api.InFlightFile]) -> None:
    """The in-flight files on a narrow terminal: each key whole on its own line, its checkpoint below."""
    out.print("In-flight files: last checkpoint")
    now = datetime.datetime.now(datetime.UTC)
    for f in files:
        c = _checkpoint_cells(f, now)
        out.print(file_label(f))
        out.print(
            f"  {c['done']} done, next record {c['next record']}, chunk {c['chunk']}, {c['rejected']} rejected, "
            f"attempt {c['attempt']}, beat {c['heartbeat']}"
        )


def print_view(view: api.JobView, stored: api.StoredReport | None = None) -> None:
    """The ``status`` view of a job (``stored``: its report, once it ended)."""
    out.print(safe_line((view.workflow_id, "bold"), ": ", (view.status, f"bold {status_colour(view.status)}")))
    out.print(safe_line(f"  Web UI   {view.ui_url}"))
    if view.progress is not None and view.progress.destination:
        out.print(safe_line(f"  into     {view.progress.destination}"))
    if view.status != "running":
        print_outcome(view.result, view.error, stored)
        return
    if view.waits_for_worker and view.task_queue:
        err_out.print(no_worker_line(view.task_queue))
    if view.progress is None:
        out.print("  progress unavailable (no worker has picked the job up yet)")
    else:
        p = view.progress
        for line in totals_lines(p, listing_done=p.listing_done):
            out.print(f"  {line}")
        out.print(f"  {state_line(p)}")
        for text in warning_lines(p.warnings):
            out.print(text)
    if not view.in_flight:
        return
    if out.width >= WIDE:
        out.print(_checkpoints_table(view.in_flight))
    else:
        _print_checkpoints_narrow(view.in_flight)
    for f in view.in_flight:
        if f.last_failure:
            out.print(safe_line(f"  {f.key}: last attempt failed: {f.last_failure}"))


def _bar_fields(t: Totals | Progress, listing_done: bool = True) -> dict[str, Any]:
    return {
        "completed": t.files_succeeded + t.files_failed,
        "total": t.files_listed if listing_done else None,
        "listed": f"{t.files_listed}{'' if listing_done else '+'}",
        "records": f"{t.records_written:,}",
        "rejected": f"{t.rejected:,}",
        "bytes": filesize.decimal(t.bytes_read),
    }


async def follow(client: Client, workflow_id: str) -> tuple[api.Outcome, api.StoredReport | None]:
    """Show a live progress bar from the ``progress`` query until the job ends; its outcome, and for a job that
    failed its report (the bar's last counts are then the report's)."""
    done_task = asyncio.ensure_future(api.outcome(client, workflow_id))
    columns = (
        SpinnerColumn(),
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:.0f}/{task.fields[listed]} files"),
        TextColumn("{task.fields[records]} written, {task.fields[rejected]} rejected"),
        TextColumn("{task.fields[bytes]}"),
        TimeElapsedColumn(),
    )
    warned = False
    with ProgressBar(*columns, console=out, transient=False) as bar:
        task = bar.add_task("waiting", total=None, listed="?", records="0", rejected="0", bytes="0 bytes")
        while not done_task.done():
            p = await api.progress(client, workflow_id)
            if p is not None:
                description = "processing" if p.listing_done else "listing"
                bar.update(task, description=description, **_bar_fields(p, p.listing_done))
            elif not warned:
                # No answer: a job without a worker would wait here forever, silently.
                queue = await api.waiting_for_worker(client, workflow_id)
                if queue is not None:
                    warned = True
                    bar.update(task, description="waiting for a worker")
                    bar.console.print(no_worker_line(queue))  # above the live bar
            await asyncio.wait([done_task], timeout=POLL_SECONDS)
        result, error = done_task.result()
        stored = None if result is not None else await api.ended_report(client, workflow_id)
        if result is not None:
            bar.update(task, description="done", **_bar_fields(result.totals))
        elif stored is not None:  # the last poll may be older than the end: the report's counts
            bar.update(task, description="failed", **_bar_fields(stored.report.totals, stored.report.listing.done))
        else:
            bar.update(task, description="failed")
    return api.Outcome(result, error), stored


async def outcome_report(client: Client, view: api.JobView) -> api.StoredReport | None:
    """The report the summary of an ended job needs (:func:`print_outcome`): a job without a result (failed,
    cancelled...) its counts, a job with a sink where its records went. None for the others: their result says
    it all, and S3 is not read."""
    if view.result is not None and (await api.job_input(client, view.workflow_id)).sink is None:
        return None
    return await api.ended_report(client, view.workflow_id)


def sink_destination(report: JobReport) -> str | None:
    """Where a reported job with a ``sink`` sent its records (None: the default JSONL parts, or no sink)."""
    return report_destination(report) if report.input.get("sink") else None


def report_destination(report: JobReport) -> str | None:
    """Where a reported job's records went: its table, or its output folder and the parts' format (the
    folder alone when the report's input does not parse here, e.g. written by a newer version)."""
    try:  # as JSON, the way the job input arrived (strict types allow its strings there)
        job = S3BatchInput.model_validate_json(json.dumps(report.input))
    except ValueError:  # pydantic's ValidationError
        return report.output
    return destination(job.sink, job.output_bucket, job.output_prefix)


def print_report(stored: api.StoredReport) -> None:
    """A job report: its counts, its files (a table, or a block each: :mod:`s3batch.cli.report_files`) with where
    their rejects are, its warnings and notes."""
    report = stored.report
    colour = {"succeeded": "green", "cancelled": "yellow"}.get(report.status, "red")
    out.print(
        safe_line((report.job_id, "bold"), ": ", (report.status, f"bold {colour}"), f" ({report.finished_at})")
    )
    out.print(safe_line(f"  {report.source} -> {report_destination(report)}"))
    for line in totals_lines(report.totals):
        out.print(f"  {line}")
    print_files(report)
    empty = empty_warning(report.totals, report.source or "the prefix") if report.listing.done else []
    for text in warning_lines([*empty, *(f"{f.key}: {w}" for f in report.files for w in f.warnings or ())]):
        out.print(text)
    into_table = (report.input.get("sink") or {}).get("type") == "postgres"
    after = DONE.get((report.input.get("after_success") or {}).get("action", ""), "acted on")
    for f in report.files:
        if f.already_written:
            out.print(safe_line(("  note     ", "bold"), f"{f.key}: {already_note(f.already_written, into_table)}"))
        if f.after_success is not None and f.after_success.reason:
            out.print(safe_line(("  note     ", "bold"), f"{f.key}: not {after}: {f.after_success.reason}"))
    out.print(safe_line(f"  report   {stored.uri}"))


def already_note(records: int, into_table: bool) -> str:
    """What a report says of a file found done, written by an earlier job (``FileResult.already_written``)."""
    if into_table:
        return f"already imported: an earlier job with the same options wrote its {records:,} rows; this job wrote none"
    return f"already written: an earlier job with the same options wrote its {records:,} records; this job wrote none"


def _source_cell(source: str | None) -> Text:
    """The ``source`` column of ``list``: ``s3://bucket/prefix``, or for an encrypted job the
    HMAC it is indexed by (``s3batch list --source bucket/prefix`` finds it)."""
    if not source:
        return cell("-")
    if source.startswith(sa.HASHED):
        return cell(f"hidden ({source})")
    return cell(f"s3://{source}")


def _when(moment: datetime.datetime | None, *, wide: bool = True) -> str:
    """``2026-11-30 09:06:36`` (UTC), or ``11-30 09:06`` on a narrow terminal."""
    if not moment:
        return "-"
    text = moment.astimezone(datetime.UTC).isoformat()[:19].replace("T", " ")
    return text if wide else text[5:16]


def _status_of(job: api.JobSummary, *, wide: bool) -> str:
    running = job.status == "running" and job.search_status
    return (f"running ({job.search_status})" if wide else str(job.search_status)) if running else job.status


def print_jobs(jobs: Sequence[api.JobSummary]) -> None:
    """The ``list`` table: every column from 100 columns on; narrower, the job ID whole and the rest
    shortened (no task queue or end time, short start times, the status word alone; no start time
    when the IDs are long)."""
    if not jobs:
        out.print("no s3batch jobs")
        return
    wide = out.width >= WIDE
    id_width = max(len(job.workflow_id) for job in jobs)
    status_width = max(len(_status_of(job, wide=wide)) for job in jobs)
    # job ID, status, done, failed and their gaps; the source gets what is left (at least 12).
    started = wide or out.width - (id_width + status_width + 4 + 6 + 5) >= 12 + 12
    table = Table(box=None, padding=(0, 1), pad_edge=False)
    # The ID is what every other command takes: never folded or squeezed out.
    table.add_column("job ID", no_wrap=True, min_width=id_width)
    table.add_column("status", no_wrap=True)
    table.add_column("source", overflow="fold", ratio=1, min_width=8)
    table.add_column("files done" if wide else "done", no_wrap=True, justify="right")
    table.add_column("failed", no_wrap=True, justify="right")
    if started:
        table.add_column("started", no_wrap=True)
    if wide:
        table.add_column("closed", no_wrap=True)
        table.add_column("task queue", overflow="fold")
    for job in jobs:
        row: list[Text | str] = [
            cell(job.workflow_id),
            cell(_status_of(job, wide=wide)),
            _source_cell(job.source),
            "-" if job.files_done is None else str(job.files_done),
            "-" if job.files_failed is None else str(job.files_failed),
        ]
        if started:
            row.append(_when(job.start_time, wide=wide))
        if wide:
            row += [_when(job.close_time), cell(job.task_queue)]
        table.add_row(*row)
    out.print(table)

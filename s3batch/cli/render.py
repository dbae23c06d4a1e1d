"""How the commands show jobs: counters, the status view, the progress bar, the report and list
tables (the live ``watch`` screen is :mod:`s3batch.cli.watch`)."""

from __future__ import annotations

import asyncio
import datetime
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
from s3batch.cli.output import cell, err_out, out, safe_line
from s3batch.models import Progress, S3BatchResult, Totals

POLL_SECONDS = 0.5


def totals_lines(t: Totals | Progress, *, listing_done: bool = True) -> list[str]:
    """Two human lines of job counters (``Totals`` and ``Progress`` share these fields)."""
    done = t.files_succeeded + t.files_failed
    listed = f"{t.files_listed}{'' if listing_done else '+'}"
    return [
        f"files    {done} done of {listed} listed ({t.files_succeeded} succeeded, {t.files_failed} failed)",
        f"records  {t.records:,} read: {t.records_written:,} written, {t.rejected:,} rejected; "
        f"{filesize.decimal(t.bytes_read)} read",
    ]


def warning_lines(warnings: Sequence[str]) -> list[Text]:
    """One line per warning (a high reject ratio, a CSV delimiter hint; each starts with its file's key)."""
    return [safe_line(("  warning  ", "bold yellow"), w) for w in warnings]


def print_outcome(result: S3BatchResult | None, error: str | None) -> None:
    if result is not None:
        out.print(safe_line((f"Job {result.status}", "bold green")))
        for line in totals_lines(result.totals):
            out.print(f"  {line}")
        for text in warning_lines(result.warnings):
            out.print(text)
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


def status_colour(status: str) -> str:
    return {"running": "cyan", "completed": "green"}.get(status, "red")


def file_label(f: api.InFlightFile) -> Text:
    """The file's key, as typed, and its place in a group."""
    group = f" (file {f.group_index + 1} of {f.group_files} in a group)" if f.group_files > 1 else ""
    return cell((f.key or f"activity {f.activity_id}") + group)


def attempt(f: api.InFlightFile) -> str:
    return str(f.attempt) + ("" if f.state == "started" else f" ({f.state})")


def percent(f: api.InFlightFile) -> str:
    """``42%`` of the object read, ``gzip`` where the offset is unknown, ``-`` before a checkpoint."""
    if f.fraction is not None:
        return f"{f.fraction:.0%}"
    return "-" if f.checkpoint is None or f.checkpoint.byte_offset is not None else "gzip"


def age(f: api.InFlightFile, now: datetime.datetime) -> str:
    return f"{(now - f.last_heartbeat).total_seconds():.0f}s ago" if f.last_heartbeat else "none yet"


def _checkpoints_table(files: Sequence[api.InFlightFile]) -> Table:
    table = Table(title="In-flight files: last checkpoint", title_justify="left", box=None, padding=(0, 1))
    table.add_column("file", overflow="fold")
    for column in ("attempt", "done", "next record", "byte offset", "chunk", "rejected", "heartbeat"):
        table.add_column(column, justify="right", no_wrap=True)
    now = datetime.datetime.now(datetime.UTC)
    for f in files:
        cp = f.checkpoint
        table.add_row(
            file_label(f),
            attempt(f),
            percent(f),
            f"{cp.next_record:,}" if cp else "-",
            "-" if cp is None or cp.byte_offset is None else f"{cp.byte_offset:,}",
            str(cp.chunk) if cp else "-",
            f"{cp.rejected:,}" if cp else "-",
            age(f, now),
        )
    return table


def print_view(view: api.JobView) -> None:
    """The ``status`` view of a job."""
    out.print(safe_line((view.workflow_id, "bold"), ": ", (view.status, f"bold {status_colour(view.status)}")))
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
        for text in warning_lines(p.warnings):
            out.print(text)
    if not view.in_flight:
        return
    out.print(_checkpoints_table(view.in_flight))
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


async def follow(client: Client, workflow_id: str) -> api.Outcome:
    """Show a live progress bar from the ``progress`` query until the job ends."""
    done_task = asyncio.ensure_future(api.outcome(client, workflow_id))
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
            p = await api.progress(client, workflow_id)
            if p is not None:
                description = "processing" if p.listing_done else "listing"
                bar.update(task, description=description, **_bar_fields(p, p.listing_done))
            await asyncio.wait([done_task], timeout=POLL_SECONDS)
        result, error = done_task.result()
        if result is not None:
            bar.update(task, description="done", **_bar_fields(result.totals))
        else:
            bar.update(task, description="failed")
    return api.Outcome(result, error)


def print_report(stored: api.StoredReport) -> None:
    """A job report as a table of its files."""
    report = stored.report
    colour = {"succeeded": "green", "cancelled": "yellow"}.get(report.status, "red")
    out.print(
        safe_line((report.job_id, "bold"), ": ", (report.status, f"bold {colour}"), f" ({report.finished_at})")
    )
    out.print(safe_line(f"  {report.source} -> {report.output}"))
    for line in totals_lines(report.totals):
        out.print(f"  {line}")
    table = Table(box=None, padding=(0, 1))
    table.add_column("file", overflow="fold")
    table.add_column("status")
    for column in ("records", "written", "rejected", "attempts"):
        table.add_column(column, justify="right", no_wrap=True)
    table.add_column("error", overflow="fold")
    style = {"succeeded": "green", "failed": "red", "cancelled": "yellow", "not_started": "dim"}
    for f in report.files:
        table.add_row(
            cell(f.key),
            cell(f.status, style.get(f.status, "white")),
            f"{f.records:,}",
            f"{f.records_written:,}",
            f"{f.rejected:,}",
            f"{f.attempts:,}",
            cell(f.error or ""),
        )
    out.print(table)
    for text in warning_lines([f"{f.key}: {w}" for f in report.files for w in f.warnings or ()]):
        out.print(text)
    out.print(safe_line(f"  report   {stored.uri}"))


def _source_cell(source: str | None) -> Text:
    """The ``source`` column of ``list``: ``s3://bucket/prefix``, or for an encrypted job the
    HMAC it is indexed by (``s3batch list --source bucket/prefix`` finds it)."""
    if not source:
        return cell("-")
    if source.startswith(sa.HASHED):
        return cell(f"hidden ({source})")
    return cell(f"s3://{source}")


def _when(moment: datetime.datetime | None) -> str:
    return moment.isoformat()[:19].replace("T", " ") if moment else "-"


def print_jobs(jobs: Sequence[api.JobSummary]) -> None:
    """The ``list`` table."""
    if not jobs:
        out.print("no s3batch jobs")
        return
    table = Table(box=None, padding=(0, 1))
    for column in ("job ID", "status", "source", "files done", "failed", "started", "closed", "task queue"):
        table.add_column(column, no_wrap=column not in ("job ID", "source"), overflow="fold")
    for job in jobs:
        running = job.status == "running" and job.search_status
        table.add_row(
            cell(job.workflow_id),
            cell(f"running ({job.search_status})" if running else job.status),
            _source_cell(job.source),
            "-" if job.files_done is None else str(job.files_done),
            "-" if job.files_failed is None else str(job.files_failed),
            _when(job.start_time),
            _when(job.close_time),
            cell(job.task_queue),
        )
    out.print(table)

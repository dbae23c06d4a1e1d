"""``s3batch watch``: the live view of a job, a bar per file in flight, speed and ETA.

The screen is a pure function of one poll, the samples so far and the time
(:func:`watch_renderable`); :func:`cmd_watch` polls and redraws it.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from rich import filesize
from rich.console import Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar as Bar
from rich.table import Table
from rich.text import Text
from temporalio.client import Client
from temporalio.service import RPCError

from s3batch import client as api
from s3batch.cli.output import EXIT_BAD_INPUT, CliError, err_out, job_exit, out, safe_line
from s3batch.cli.render import (
    age,
    attempt,
    file_label,
    no_worker_line,
    outcome_report,
    percent,
    print_outcome,
    state_line,
    status_colour,
    totals_lines,
    warning_lines,
)
from s3batch.logs import printable

WATCH_WINDOW_SECONDS = 10.0
"""Throughput is measured over the samples of this many seconds."""

_BAR_WIDTH = 30


@dataclass(frozen=True)
class Sample:
    """Job-wide amounts at one poll: finished files' totals plus the in-flight files' checkpoints."""

    t: float
    """Seconds on a monotonic clock."""
    records: int
    bytes: int


def sample_of(view: api.JobView, t: float) -> Sample | None:
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


def eta(view: api.JobView, bytes_per_second: float | None) -> str:
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


def in_flight_table(files: Sequence[api.InFlightFile], now: datetime.datetime) -> Table:
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
        cp, size, span = f.checkpoint, f.size, f.span
        if f.fraction is not None and cp is not None and span is not None:
            total = span[1] - span[0]
            bar: RenderableType = Bar(total=total, completed=f.done_in_span, width=_BAR_WIDTH)
            amount = f"{filesize.decimal(f.done_in_span)} / {filesize.decimal(total)}"
        elif cp is None:
            bar, amount = Text("waiting for the first checkpoint", style="dim"), "-"
        else:
            bar = Text(f"{f.offsetless}: no byte offset", style="dim")
            amount = f"? / {filesize.decimal(size)}" if size is not None else "-"
        table.add_row(
            file_label(f),
            bar,
            percent(f),
            amount,
            f"{cp.next_record:,}" if cp else "-",
            str(cp.chunk) if cp else "-",
            attempt(f),
            age(f, now),
        )
    return table


def _speed_lines(view: api.JobView, samples: Sequence[Sample], window: float) -> list[RenderableType]:
    """The ``so far``, ``speed`` and ``ETA`` lines of a running job with progress."""
    lines: list[RenderableType] = []
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
    return lines


def watch_renderable(
    view: api.JobView,
    samples: Sequence[Sample],
    window: float = WATCH_WINDOW_SECONDS,
    now: datetime.datetime | None = None,
) -> RenderableType:
    """The ``watch`` screen, a pure function of one poll (``view``), the samples so far and the
    time (for the checkpoints' age; default: the clock)."""
    lines: list[RenderableType] = [
        safe_line((view.workflow_id, "bold"), ": ", (view.status, f"bold {status_colour(view.status)}")),
        Text(f"  Web UI   {printable(view.ui_url)}"),
    ]
    if view.waits_for_worker and view.task_queue:
        lines.append(no_worker_line(view.task_queue))
    p = view.progress
    if p is None:
        lines.append(Text("  progress unavailable (no worker has picked the job up yet?)"))
        return Group(*lines)
    lines += [Text(f"  {line}") for line in totals_lines(p, listing_done=p.listing_done)]
    lines.append(Text(f"  {state_line(p)}"))
    lines += warning_lines(p.warnings)
    lines += _speed_lines(view, samples, window)
    if view.in_flight:
        lines.append(in_flight_table(view.in_flight, now or datetime.datetime.now(datetime.UTC)))
        lines += [
            Text(f"  {printable(f.key)}: last attempt failed: {printable(f.last_failure)}", style="yellow")
            for f in view.in_flight
            if f.last_failure
        ]
    return Group(*lines)


async def _live(client: Client, view: api.JobView, interval: float, cache: api.ObjectsCache) -> api.JobView:
    """Redraw the screen every ``interval`` seconds while the job runs; its last view."""
    samples: deque[Sample] = deque()
    with Live(console=out, auto_refresh=False, transient=False) as live:
        fresh = True
        while view.status == "running":
            sample = sample_of(view, time.monotonic()) if fresh else None
            if sample is not None:
                samples.append(sample)
                while samples[0].t < sample.t - 2 * WATCH_WINDOW_SECONDS:
                    samples.popleft()
            live.update(watch_renderable(view, samples), refresh=True)
            await asyncio.sleep(interval)
            try:
                view, fresh = await api.describe(client, view.workflow_id, cache), True
            except RPCError as err:
                # A blip of the server (or a proxy) must not end the view: keep the last poll.
                err_out.print(safe_line(("poll failed, retrying:", "yellow"), f" {err.message}"))
                fresh = False
    return view


async def cmd_watch(args: argparse.Namespace) -> int:
    """Redraw the job's live view every ``--interval`` seconds until it ends, then print its
    outcome as ``start --wait`` does (and exit the same way)."""
    if args.interval <= 0:
        raise CliError("--interval must be positive", EXIT_BAD_INPUT)
    client = await api.connect()
    cache: api.ObjectsCache = {}
    view = await api.describe(client, args.workflow_id, cache)
    if args.once and view.status == "running":
        sample = sample_of(view, time.monotonic())
        out.print(watch_renderable(view, [sample] if sample else []))
        return job_exit(view.status)
    if view.status == "running":
        view = await _live(client, view, args.interval, cache)
    out.print(safe_line((view.workflow_id, "bold"), f": {view.status}"))
    print_outcome(view.result, view.error, await outcome_report(client, view))
    out.print(safe_line(f"  Web UI   {view.ui_url}"))
    return job_exit(view.status)

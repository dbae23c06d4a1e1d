"""``s3batch schedule create|list|pause|unpause|trigger|delete`` and ``s3batch backfill``: incremental
jobs started by a Temporal Schedule (see :mod:`s3batch.client.schedules`)."""

from __future__ import annotations

import argparse
import datetime
import re

from pydantic import ValidationError

from s3batch.cli.output import EXIT_BAD_INPUT, EXIT_OK, CliError, out, print_json, safe_line
from s3batch.cli.start import invalid_input, job_from_args
from s3batch.client import connect
from s3batch.client import schedules as api
from s3batch.logs import printable
from s3batch.models import S3BatchInput
from s3batch.selection import parse_time

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_every(text: str) -> datetime.timedelta:
    """``30s``, ``15m``, ``1h``, ``1d`` (or a sum: ``1h30m``)."""
    parts = re.fullmatch(r"(?:\d+[smhd])+", text.strip())
    if not parts:
        raise CliError(f"--every {text!r}: give a duration such as 15m, 1h or 1d", EXIT_BAD_INPUT)
    seconds = sum(int(n) * _UNITS[u] for n, u in re.findall(r"(\d+)([smhd])", text))
    if seconds < 1:
        raise CliError(f"--every {text!r}: must be at least 1s", EXIT_BAD_INPUT)
    return datetime.timedelta(seconds=seconds)


def _job(args: argparse.Namespace) -> S3BatchInput:
    """The job of ``--input JSON`` (strict, as a workflow input) or of the job flags."""
    if args.input is None:
        return job_from_args(args)
    try:
        return S3BatchInput.model_validate_json(args.input)
    except ValidationError as err:
        raise invalid_input(err, "nothing was created") from None


async def cmd_create(args: argparse.Namespace) -> int:
    if (args.every is None) == (args.cron is None):
        raise CliError("give exactly one of --every (e.g. 1h) or --cron (e.g. '0 * * * *')", EXIT_BAD_INPUT)
    every = parse_every(args.every) if args.every is not None else None
    job = _job(args)  # before connecting: bad input never reaches the server
    client = await connect()
    await api.create(
        client, args.name, job, every=every, cron=args.cron, overlap=args.overlap, task_queue=args.task_queue,
        paused=args.paused,
    )
    if args.json:
        print_json({"schedule_id": api.schedule_id(args.name), "workflow_id": api.run_workflow_id(args.name)})
    else:
        out.print(
            safe_line(
                f"Created schedule {api.schedule_id(args.name)}: each run is job "
                f"{api.run_workflow_id(args.name)}-<tick time> (overlap: {args.overlap})"
            )
        )
    return EXIT_OK


async def cmd_list(args: argparse.Namespace) -> int:
    found = await api.list_all(await connect())
    if args.json:
        print_json(found)
        return EXIT_OK
    for s in found:
        # Names, workflow IDs and the job's source and output are the server's strings (whoever may create a
        # schedule wrote them): shown escaped, as every command shows them, never as terminal controls.
        state = "paused" if s["paused"] else "active"
        fields = (s["name"], state, f"next {(s['next'] or ['-'])[0]}", f"last {(s['recent'] or ['-'])[-1]}", s["job"])
        print("\t".join(printable(field) for field in fields))  # tab-separated: plain print, each field escaped
    return EXIT_OK


async def cmd_action(args: argparse.Namespace) -> int:
    client = await connect()
    await getattr(api, args.action)(client, args.name)
    out.print(safe_line(f"{args.action}: schedule {api.schedule_id(args.name)}"))
    return EXIT_OK


async def cmd_backfill(args: argparse.Namespace) -> int:
    try:
        start, end = parse_time(args.start), parse_time(args.end)
    except ValueError:
        raise CliError(
            f"--start {args.start!r} / --end {args.end!r}: give ISO 8601 times such as 2026-11-30T08:00:00Z "
            "(nothing was started)",
            EXIT_BAD_INPUT,
        ) from None
    if start >= end:
        raise CliError(
            f"--start {start.isoformat()} must be earlier than --end {end.isoformat()} (nothing was started)",
            EXIT_BAD_INPUT,
        )
    started = await api.backfill(await connect(), args.name, start, end)
    if args.json:
        print_json({"schedule_id": api.schedule_id(args.name), "workflow_ids": started})
        return EXIT_OK
    out.print(
        safe_line(
            f"backfill of schedule {api.schedule_id(args.name)} from {start.isoformat()} to {end.isoformat()}: "
            f"{len(started)} run(s), one after the other:"
        )
    )
    for workflow_id in started:
        out.print(safe_line(f"  {workflow_id}"))
    return EXIT_OK

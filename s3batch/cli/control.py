"""The control commands of a running job: ``pause``, ``resume``, ``set-concurrency``, ``cancel``."""

from __future__ import annotations

import argparse

from rich.text import Text

from s3batch import client as api
from s3batch.cli.output import EXIT_OK, out, print_json, safe_line
from s3batch.messages import Progress


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
    p = await api.pause(await api.connect(), args.workflow_id)
    _print_control(
        args, p, safe_line("Paused job ", (args.workflow_id, "bold"), ": no new file starts; files in flight finish")
    )
    return EXIT_OK


async def cmd_resume(args: argparse.Namespace) -> int:
    p = await api.resume(await api.connect(), args.workflow_id)
    _print_control(args, p, safe_line("Resumed job ", (args.workflow_id, "bold")))
    return EXIT_OK


async def cmd_set_concurrency(args: argparse.Namespace) -> int:
    p = await api.set_concurrency(await api.connect(), args.workflow_id, args.n)
    _print_control(
        args, p, safe_line("Job ", (args.workflow_id, "bold"), f" now processes at most {args.n} file(s) at once")
    )
    return EXIT_OK


async def cmd_cancel(args: argparse.Namespace) -> int:
    await api.cancel(await api.connect(), args.workflow_id)
    out.print(
        safe_line(
            "Cancellation requested for job ",
            (args.workflow_id, "bold"),
            ": files in flight stop at their next chunk boundary, then the report is written with them as cancelled",
        )
    )
    out.print(safe_line(f"  report   s3batch report {args.workflow_id}"))
    return EXIT_OK

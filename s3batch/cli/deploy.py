"""Worker Versioning commands: ``s3batch worker`` (run a worker, optionally as a version of a Worker
Deployment) and ``s3batch deploy status|promote|rollback`` (which version takes new jobs).

The deploy commands are thin over :mod:`s3batch.client.deployments`; the ``temporal worker deployment``
commands do the same (docs/how-to/upgrade.md shows both).
"""

from __future__ import annotations

import argparse
from dataclasses import asdict
from datetime import datetime

from rich.table import Table

from s3batch import DEFAULT_DEPLOYMENT_NAME
from s3batch import client as api
from s3batch.cli.output import EXIT_OK, cell, out, print_json, safe_line
from s3batch.client.deployments import DeploymentView, RunVersion, describe_deployment, promote, rollback
from s3batch.config import Settings


def _name(args: argparse.Namespace) -> str:
    return args.deployment_name or Settings().deployment_name or DEFAULT_DEPLOYMENT_NAME


def _plain(value: object) -> object:
    return value.isoformat() if isinstance(value, datetime) else value


def _print(view: DeploymentView, as_json: bool, done: str | None = None) -> None:
    if as_json:
        plain = asdict(view, dict_factory=lambda items: {k: _plain(v) for k, v in items})
        print_json({"done": done, **plain} if done else plain)
        return
    if done:
        out.print(safe_line(done))
    ramp = f", {view.ramping} ramping at {view.ramp_percentage:g}%" if view.ramping else ""
    out.print(safe_line("Deployment ", (view.name, "bold"), f": current {view.current or 'unversioned workers'}{ramp}"))
    table = Table("build ID", "status", "running runs", "created", "last current")
    for v in view.versions:
        running = "?" if v.running is None else str(v.running)
        when = [f"{t:%Y-%m-%d %H:%M:%S}" if t else "" for t in (v.created, v.last_current)]
        table.add_row(cell(v.build_id), cell(v.status), running, *when)
    out.print(table)
    draining = [v.build_id for v in view.versions if v.status == "draining" and v.running != 0]
    idle = [v.build_id for v in view.versions if v.status == "drained" or (v.status == "draining" and v.running == 0)]
    if draining:
        out.print(f"  draining: {', '.join(draining)}: runs are still pinned there, keep their workers running")
    if idle:
        # The server marks a version drained a few minutes after its last pinned run ended.
        out.print(f"  drained (no running run): {', '.join(idle)}: no run needs them, their workers may stop")


def print_run_versions(runs: list[RunVersion]) -> None:
    """Which worker version each run of a job ran on (consecutive runs on one version as one), for
    ``s3batch status`` and ``report``; nothing for a job only unversioned workers ran."""
    if all(r.version is None for r in runs):
        return
    groups: list[list[RunVersion]] = []
    for r in runs:
        if groups and (groups[-1][-1].version, groups[-1][-1].behavior) == (r.version, r.behavior):
            groups[-1].append(r)
        else:
            groups.append([r])
    parts = []
    for g in groups:
        which = f"run {g[0].run}" if len(g) == 1 else f"runs {g[0].run}-{g[-1].run}"
        behavior = f" ({g[0].behavior})" if g[0].behavior else ""
        parts.append(f"{which} on {g[0].version or 'unversioned workers'}{behavior}")
    out.print(safe_line("  ran on   ", "; ".join(parts)))


async def cmd_status(args: argparse.Namespace) -> int:
    _print(await describe_deployment(await api.connect(), _name(args)), args.json)
    return EXIT_OK


async def cmd_promote(args: argparse.Namespace) -> int:
    view = await promote(await api.connect(), _name(args), args.build_id, ramp=args.ramp, wait=args.wait)
    if args.ramp is None:
        done = (f"Made {args.build_id} current: new jobs and continue-as-new successors start on it; runs "
                "pinned to other versions finish there")
    else:
        done = f"Ramping {args.build_id} at {args.ramp:g}% of new runs"
    _print(view, args.json, done)
    return EXIT_OK


async def cmd_rollback(args: argparse.Namespace) -> int:
    what, view = await rollback(await api.connect(), _name(args), wait=args.wait)
    _print(view, args.json, f"Rolled back: {what}")
    return EXIT_OK


def run_worker(args: argparse.Namespace) -> int:
    """``s3batch worker``: the ``s3batch-worker`` program, in this process (it never returns)."""
    from s3batch.worker import main

    argv = [f"--{flag}={value}" for flag, value in (("deployment-name", args.deployment_name),
                                                    ("build-id", args.build_id)) if value is not None]
    main(argv)
    return EXIT_OK

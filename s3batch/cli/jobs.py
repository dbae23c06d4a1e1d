"""Reading jobs: ``status``, ``report`` and ``list``."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import asdict

from s3batch import client as api
from s3batch.cli.deploy import print_run_versions
from s3batch.cli.output import EXIT_BAD_INPUT, EXIT_OK, CliError, job_exit, print_json
from s3batch.cli.render import outcome_report, print_jobs, print_report, print_view
from s3batch.client.deployments import run_versions


async def cmd_status(args: argparse.Namespace) -> int:
    client = await api.connect()
    view = await api.describe(client, args.workflow_id)
    runs = await run_versions(client, args.workflow_id)
    if args.json:
        print_json({**view.to_json(), "runs": [asdict(r) for r in runs]})
    else:  # an ended job's report: a failed job's counts, where a sink job's records went
        print_view(view, await outcome_report(client, view) if view.status != "running" else None)
        print_run_versions(runs)
    return job_exit(view.status)


async def cmd_report(args: argparse.Namespace) -> int:
    client = await api.connect()
    stored = await api.report(client, args.workflow_id)
    if args.json:
        print_json(json.loads(stored.report.to_json()))  # as written to S3
    else:
        print_report(stored)
        print_run_versions(await run_versions(client, args.workflow_id))
    return job_exit(stored.report.status)


def list_query(*, running: bool, source: str | None, keys: Sequence[bytes]) -> str:
    """The visibility query of ``s3batch list``.

    Raises:
        CliError: ``source`` is not ``bucket/prefix``.
    """
    if source is None:
        return api.jobs_query(running=running)
    bucket, slash, prefix = source.removeprefix("s3://").partition("/")
    if not bucket or not slash or '"' in source:
        raise CliError(
            f"--source must be BUCKET/PREFIX (e.g. incoming/customers/, or incoming/ for the whole bucket), got "
            f"{source!r}",
            EXIT_BAD_INPUT,
        )
    return api.jobs_query(running=running, bucket=bucket, prefix=prefix, keys=keys)


async def cmd_list(args: argparse.Namespace) -> int:
    query = list_query(running=args.running, source=args.source, keys=api.environment_keys())
    client = await api.connect()
    jobs = await api.list_jobs(client, query, limit=args.limit)
    if args.json:
        print_json([job.to_json() for job in jobs])
    else:
        print_jobs(jobs)
    return EXIT_OK

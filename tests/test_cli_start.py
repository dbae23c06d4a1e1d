"""Issue 33: ``s3batch --help``, ``s3batch status --help`` and ``s3batch status`` answer at once. Every command
took 3-4 s to start, all of it imports (``import s3batch.cli`` alone loaded Temporal's client, boto3, pyarrow,
psycopg and obstore); the command line now imports none of them before a command runs, and ``status`` only
Temporal's client. Structural checks, not timings."""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
import uuid
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.worker import Worker

from s3batch.cli import build_parser
from s3batch.models import S3BatchInput
from tests.helpers import run
from tests.helpers.data import make_csv

HEAVY = ("temporalio.client", "boto3", "botocore", "pyarrow", "psycopg", "obstore")
"""What a command needs and ``--help`` does not: each costs tenths of a second to import."""


def imported_by(code: str) -> tuple[list[str], subprocess.CompletedProcess[str]]:
    """The modules a fresh interpreter imports running ``code`` (``-X importtime``), and the run."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    modules = [line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")]
    return modules, done


def heavy(modules: list[str]) -> list[str]:
    return sorted({m for m in modules for h in HEAVY if m == h or m.startswith(h + ".")})


HELPS = [["--help"], ["status", "--help"], ["start", "--help"], ["deploy", "promote", "--help"]]


@pytest.mark.parametrize("argv", HELPS)
def test_help_imports_none_of_the_heavy_modules(argv: list[str]) -> None:
    modules, done = imported_by(f"from s3batch.cli import run; run({argv!r})")
    assert done.returncode == 0 and "usage: s3batch" in done.stdout, done.stderr[-2000:]
    assert "s3batch.cli.parser" in modules  # the check sees the command line's own imports
    assert heavy(modules) == [], f"s3batch {' '.join(argv)} imported {heavy(modules)}"


def test_building_and_parsing_the_command_line_imports_none_of_them() -> None:
    code = (
        "import sys; from s3batch.cli import build_parser; "
        "args = build_parser().parse_args(['status', 'some-job']); "
        "print(args.run, sorted(m for m in sys.modules if m.split('.')[0] in "
        "('temporalio', 'boto3', 'botocore', 'pyarrow', 'psycopg', 'obstore')))"
    )
    _, done = imported_by(code)
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = done.stdout.split(" ", 1)[1]
    assert done.stdout.startswith("jobs:cmd_status ") and all(f"'{h}" not in loaded for h in HEAVY), done.stdout


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], str]]:
    """Every leaf command of ``parser`` with the ``module:function`` that runs it."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _commands(sub, (*path, name))
    if not found and path:
        found.append((path, parser.get_default("run")))
    return found


def test_every_command_names_a_function_that_exists() -> None:
    commands = _commands(build_parser())
    assert len(commands) >= 20, commands
    for path, function in commands:
        assert function, path
        module, _, name = function.partition(":")
        assert callable(getattr(importlib.import_module(f"s3batch.cli.{module}"), name, None)), (path, function)


def test_the_overlap_choices_are_the_schedule_policies() -> None:
    from s3batch.cli.parser import OVERLAPS
    from s3batch.client.schedules import OVERLAPS as POLICIES

    assert sorted(OVERLAPS) == sorted(POLICIES)


def test_a_client_given_the_plugin_imports_neither_the_workflow_nor_the_activities() -> None:
    # s3batch status and the other job commands connect with S3BatchPlugin for its data converter: before,
    # building it imported the workflow and every activity (psycopg, obstore, the sinks), about 0.5 s a command.
    code = (
        "import sys; from s3batch.plugin import S3BatchPlugin; S3BatchPlugin(); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('psycopg', 'obstore') "
        "or m in ('s3batch.workflows.batch', 's3batch.activities.s3_activities')))"
    )
    _, done = imported_by(code)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", done.stdout


STATUS_HEAVY = (
    "pyarrow",
    "zstandard",
    "s3batch.formats.csv",
    "boto3",
    "s3transfer",
    "botocore.session",
    "s3batch.s3io",
    "psycopg",
    "obstore",
    "temporalio.worker",
    "s3batch.plugin",
)
"""What ``s3batch status`` and ``watch`` of a running or succeeded job need none of: the readers (pyarrow, zstandard:
the in-flight view needs only the checkpoint's model and what a key says), boto3 (read only for the report of a job
without a result, or with a sink), and Temporal's worker (the plugin's module imports it; a client needs only
s3batch's data converter). Together about half a second of each command before."""


def status_heavy(modules: list[str]) -> list[str]:
    return sorted({m for m in modules for h in STATUS_HEAVY if m == h or m.startswith(h + ".")})


def test_the_modules_of_status_and_watch_import_none_of_the_readers_boto3_or_the_worker() -> None:
    # What s3batch.cli.run imports for `s3batch status` and `s3batch watch`: the parser, the output and the
    # command's module. Before: pyarrow (client.views -> formats), boto3 (checkpoint -> objects -> s3io, the
    # report, the plugin) and temporalio.worker (the plugin), 1,018 modules in all.
    modules, done = imported_by("import s3batch.cli, s3batch.cli.output, s3batch.cli.jobs, s3batch.cli.watch")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "s3batch.client.inflight" in modules and "temporalio.client" in modules  # what status does need
    assert status_heavy(modules) == [], status_heavy(modules)


async def status_imports(*argv: str) -> tuple[list[str], Any]:
    """The modules ``s3batch ARGV`` imported from its start to its exit (imports while it runs included), and
    the run (``PYTHONPROFILEIMPORTTIME``: the console script as a user runs it)."""
    done = await run("s3batch", *argv, env={"PYTHONPROFILEIMPORTTIME": "1"})
    lines = done.stderr.splitlines()
    modules = [line.rsplit("|", 1)[1].strip() for line in lines if line.startswith("import time:")]
    return modules, done


async def test_status_of_a_running_job_imports_none_of_them(client: Client) -> None:
    # No worker polls its task queue: the job stays running, its workflow task waiting.
    wid = f"status-imports-{uuid.uuid4().hex[:8]}"
    job = S3BatchInput(bucket="incoming", output_bucket="processed")
    handle = await client.start_workflow("S3BatchWorkflow", job, id=wid, task_queue=f"nobody-{uuid.uuid4().hex[:8]}")
    try:
        for argv in (["status", wid], ["status", wid, "--json"], ["watch", wid, "--once"]):
            modules, done = await status_imports(*argv)
            assert done.code == 0 and wid in done.stdout, (argv, done)
            assert "temporalio.client" in modules, done.stderr[-2000:]
            assert status_heavy(modules) == [], (argv, status_heavy(modules))
    finally:
        await handle.terminate()


async def test_status_of_a_succeeded_job_reads_no_report_and_imports_none_of_them(
    worker: Worker, task_queue: str, s3: Any, buckets: tuple[str, str]
) -> None:
    # Before, it read the job's report from S3 (boto3 and a client: a quarter of a second) for nothing: a
    # succeeded job's result holds the counts shown.
    src, out = buckets
    s3.put_object(Bucket=src, Key="in/a.csv", Body=make_csv(10))
    base = ["--bucket", src, "--prefix", "in/", "--output-bucket", out, "--task-queue", task_queue]
    started = await run("s3batch", "start", *base, "--wait")
    assert started.code == 0, started
    wid = started.stdout.split("Started job ", 1)[1].split()[0]
    for argv in (["status", wid], ["watch", wid]):
        modules, done = await status_imports(*argv)
        assert done.code == 0, (argv, done)
        assert "Job succeeded" in done.stdout and "10 written" in done.stdout, done.stdout
        assert status_heavy(modules) == [], (argv, status_heavy(modules))

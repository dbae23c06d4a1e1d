"""Issue 33: ``s3batch --help`` and ``s3batch status --help`` answer at once. Every command took 3-4 s to
start, all of it imports (``import s3batch.cli`` alone loaded Temporal's client, boto3, pyarrow, psycopg and
obstore); the command line now imports none of them before a command runs. Structural checks, not timings."""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys

import pytest

from s3batch.cli import build_parser

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

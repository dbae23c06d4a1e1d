"""The ``s3batch`` command line: its commands, flags and help, and nothing that runs them.

This module imports argparse and the job's pydantic model (for the job flags) only: ``s3batch --help``
and ``s3batch status --help`` answer without loading Temporal's client, boto3, pyarrow, psycopg or
obstore (``tests/test_cli_start.py`` checks it). Each command names the function that runs it as
``module:function`` of :mod:`s3batch.cli` (``jobs:cmd_status``), imported by :func:`s3batch.cli.run`
once the command line is parsed.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import types
import typing
from collections.abc import Sequence
from typing import Annotated, Any, Literal, NoReturn, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from s3batch import DEFAULT_DEPLOYMENT_NAME
from s3batch.models import S3BatchInput

OVERLAPS = ("allow_all", "buffer_all", "buffer_one", "cancel_other", "skip", "terminate_other")
"""``schedule create --overlap``: Temporal's ``ScheduleOverlapPolicy`` names, lower-cased (the names of
:data:`s3batch.client.schedules.OVERLAPS`)."""


class Parser(argparse.ArgumentParser):
    """argparse, with the closest flag suggested for a flag it does not know (``--ouput-prefix``)."""

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:  # type: ignore[override]
        # (typeshed overloads parse_args on the namespace's type; this one takes and returns any)
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            self.error(self._unknown(extras, self._command_parser(parsed)))
        return parsed

    def _command_parser(self, parsed: argparse.Namespace) -> argparse.ArgumentParser:
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                return action.choices.get(str(getattr(parsed, action.dest, "")), self)
        return self

    def error(self, message: str) -> NoReturn:
        choice = re.match(r"argument \S+: invalid choice: '(.*)' \(choose from (.*)\)$", message)
        if choice:
            close = difflib.get_close_matches(choice[1], re.findall(r"'([^']*)'", choice[2]), n=1, cutoff=0.6)
            if close:
                message += f": did you mean {close[0]!r}?"
        super().error(message)

    @staticmethod
    def _unknown(extras: list[str], parser: argparse.ArgumentParser) -> str:
        known = [option for action in parser._actions for option in action.option_strings]
        lines = []
        for extra in [e for e in extras if e.startswith("-")] or extras:  # not the value after a flag
            flag = extra.split("=", 1)[0]
            close = difflib.get_close_matches(flag, known, n=1, cutoff=0.6) if flag.startswith("-") else []
            hint = f": did you mean {close[0]}?" if close else ""
            lines.append(f"unrecognized argument {extra!r}{hint}")
        return "; ".join(lines) + f" (see `{parser.prog} --help`)"


def build_parser() -> argparse.ArgumentParser:
    """The ``s3batch`` command line, its commands in the order of ``--help``."""
    parser = Parser(
        prog="s3batch",
        description="Start and follow s3batch jobs (durable processing of files in S3 on Temporal).",
        epilog="Temporal connection: TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE, TEMPORAL_API_KEY or a "
        "temporal.toml profile, as for the temporal CLI. Exit codes: 0 succeeded (status: or running), 1 the job "
        "failed, 2 invalid usage or input, 3 not in the job's state, 4 cancelled, 5 terminated, 6 not found, "
        "7 Temporal or S3 unreachable, 8 another error (see docs/reference/errors.md).",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    add_start(commands)
    add_status(commands)
    add_controls(commands)
    add_watch(commands)
    add_report(commands)
    add_redrive(commands)
    add_list(commands)
    add_schedule(commands)
    add_backfill(commands)
    add_worker(commands)
    add_deploy(commands)
    return parser


def _runs(parser: argparse.ArgumentParser, function: str, **defaults: Any) -> None:
    """Name the function that runs ``parser``'s command: ``module:function`` of :mod:`s3batch.cli`."""
    parser.set_defaults(run=function, **defaults)


def _job_id(parser: argparse.ArgumentParser, help_text: str = "the job's workflow ID") -> None:
    parser.add_argument("workflow_id", metavar="ID", help=help_text)


def _json_flag(parser: argparse.ArgumentParser, help_text: str = "machine-readable output") -> None:
    parser.add_argument("--json", action="store_true", help=help_text)


# ------------------------------------------------------------------------------ job flags

_UNIONS = (typing.Union, types.UnionType)


def flag(name: str) -> str:
    """The command-line flag of an :class:`S3BatchInput` field: ``chunk_records`` -> ``--chunk-records``."""
    return "--" + name.replace("_", "-")


def _doc(info: FieldInfo) -> str:
    """A field's docstring (its description) on one line, without reST literal quotes."""
    return " ".join((info.description or "").replace("``", "").split())


def add_job_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per :class:`S3BatchInput` field, so the command cannot drift from the model.

    Flags are plain strings left out of the namespace unless given: the model converts and
    validates them, and supplies its own defaults (``s3batch.cli.start.job_from_args``).
    """
    group = parser.add_argument_group("job input (the fields of S3BatchInput)")
    for name, info in S3BatchInput.model_fields.items():
        choices = get_args(info.annotation) if get_origin(info.annotation) is Literal else ()
        metavar = "{" + ",".join(choices) + "}" if choices else name.split("_")[-1].upper()
        default = "required" if info.is_required() else f"default: {info.default!r}"
        help_text = f"{_doc(info)} ({default})".replace("%", "%%")
        kind = _flag_kind(info)
        if kind == "switch":  # given means true ("true" is what the model reads)
            group.add_argument(flag(name), dest=name, action="store_const", const="true", default=argparse.SUPPRESS,
                               help=help_text)  # fmt: skip
        elif kind == "list":  # repeatable: --include '*.csv' --include '*.tsv'
            group.add_argument(flag(name), dest=name, metavar=metavar, action="append", default=argparse.SUPPRESS,
                               help=help_text + " (repeat the flag for more)")  # fmt: skip
        elif kind == "json":  # an object or a list: JSON text, e.g. --sink '{"type": "s3"}'
            group.add_argument(flag(name), dest=name, metavar="JSON", type=json_or_text, default=argparse.SUPPRESS,
                               help=help_text)  # fmt: skip
        else:
            group.add_argument(flag(name), dest=name, metavar=metavar, default=argparse.SUPPRESS, help=help_text)


def _flag_kind(info: FieldInfo) -> str:
    """How a field is given on the command line: ``switch`` (a bool), ``list`` (a list of strings,
    one flag each), ``json`` (an object, or a value that may be a list: JSON text) or ``text``."""
    annotation = info.annotation
    if annotation is bool:
        return "switch"
    options = [_unwrapped(a) for a in _members(annotation) if a is not type(None)]
    options = [member for a in options for member in _members(a)]
    if options == [list[str]]:
        return "list"
    structured = [get_origin(a) in (list, dict) or (isinstance(a, type) and issubclass(a, BaseModel)) for a in options]
    return "json" if any(structured) else "text"


def _members(annotation: Any) -> tuple[Any, ...]:
    """The members of a union annotation, or the annotation alone."""
    return get_args(annotation) if get_origin(annotation) in _UNIONS else (annotation,)


def _unwrapped(annotation: Any) -> Any:
    """``Annotated[T, ...]`` -> ``T``."""
    return get_args(annotation)[0] if get_origin(annotation) is Annotated else annotation


def json_or_text(value: str) -> Any:
    """A flag's value read as JSON (``'{"type": "s3"}'``, ``'["id", "name"]'``), or as the text itself when it
    is not meant as JSON (``none``), for the model to validate.

    Raises:
        argparse.ArgumentTypeError: The value starts as JSON does (``{``, ``[`` or ``"``) but is not valid
            JSON: where it breaks (argparse names the flag).
    """
    try:
        return json.loads(value)
    except json.JSONDecodeError as err:
        if not value.lstrip().startswith(("{", "[", '"')):
            return value
        raise argparse.ArgumentTypeError(
            f"invalid JSON at line {err.lineno}, column {err.colno}: {err.msg} (in single quotes on the command "
            "line, the shell keeps its double quotes and spaces: '{\"type\": \"s3\"}')"
        ) from None


# ------------------------------------------------------------------------------ the job commands


def add_start(commands: argparse._SubParsersAction) -> None:
    start = commands.add_parser("start", help="start a job (validated locally first)")
    add_job_flags(start)
    start.add_argument(
        "--id",
        help="workflow ID (default: s3batch-<bucket>-<random>, or s3batch-<random> with an encryption key); reusing "
        "one never reruns it",
    )
    start.add_argument("--task-queue", help="task queue of the workers (default: S3BATCH_TASK_QUEUE or s3-batch)")
    start.add_argument("--wait", action="store_true", help="follow the job with a progress bar until it ends")
    _json_flag(start)
    start.add_argument(
        "--dry-run",
        action="store_true",
        help="start nothing: list the files the job would process and what --after-success would do to each",
    )
    _runs(start, "start:cmd_start")


def add_status(commands: argparse._SubParsersAction) -> None:
    status = commands.add_parser("status", help="progress and in-flight checkpoints of a job")
    _job_id(status)
    _json_flag(status)
    _runs(status, "jobs:cmd_status")


def add_report(commands: argparse._SubParsersAction) -> None:
    report = commands.add_parser("report", help="the report of a finished job, as a table")
    _job_id(report)
    _json_flag(report, "the report's JSON as written to S3")
    _runs(report, "jobs:cmd_report")


def add_redrive(commands: argparse._SubParsersAction) -> None:
    redrive = commands.add_parser(
        "redrive",
        help="start a new job over the files that failed or were cancelled in a finished job (--rejected: over the "
        "records it rejected)",
    )
    _job_id(redrive, "the finished job's workflow ID")
    redrive.add_argument(
        "--rejected",
        action="store_true",
        help="process again only the records ID's files rejected (their lines in its rejects files), from the same "
        "source versions, once their cause is fixed; those now accepted are written once, beside the rows accepted "
        "before in a table, or into an output prefix of its own",
    )
    redrive.add_argument(
        "--output-prefix",
        help="with --rejected: the new job's output prefix (default: _rejected/ under ID's output prefix)",
    )
    redrive.add_argument(
        "--id", help="workflow ID of the new job (default: ID-redrive-<random>, with --rejected ID-rejected-<random>)"
    )
    redrive.add_argument("--task-queue", help="task queue of the workers (default: the finished job's)")
    redrive.add_argument("--wait", action="store_true", help="follow the new job with a progress bar until it ends")
    _json_flag(redrive)
    _runs(redrive, "start:cmd_redrive")


def add_list(commands: argparse._SubParsersAction) -> None:
    listing = commands.add_parser("list", help="running and recent jobs")
    listing.add_argument("--running", action="store_true", help="running jobs only")
    listing.add_argument(
        "--source",
        metavar="BUCKET/PREFIX",
        help="only jobs of this exact source (with encryption, matched by its HMAC under each configured key)",
    )
    listing.add_argument("--limit", type=int, default=50, help="at most this many jobs (default: 50)")
    _json_flag(listing)
    _runs(listing, "jobs:cmd_list")


def add_controls(commands: argparse._SubParsersAction) -> None:
    """``pause``, ``resume``, ``set-concurrency`` and ``cancel`` (:mod:`s3batch.cli.control`)."""
    for name, function, help_text in (
        ("pause", "control:cmd_pause", "start no new file (files in flight finish)"),
        ("resume", "control:cmd_resume", "start files again after pause"),
    ):
        sub = commands.add_parser(name, help=help_text)
        _job_id(sub)
        _json_flag(sub)
        _runs(sub, function)

    conc = commands.add_parser("set-concurrency", help="change how many files a running job processes at once")
    _job_id(conc)
    conc.add_argument("n", metavar="N", type=int, help="files at once, 1 to 1000")
    _json_flag(conc)
    _runs(conc, "control:cmd_set_concurrency")

    cancel = commands.add_parser("cancel", help="stop a job gracefully (the report is still written)")
    _job_id(cancel)
    _runs(cancel, "control:cmd_cancel")


def add_watch(commands: argparse._SubParsersAction) -> None:
    watch = commands.add_parser("watch", help="live view of a job: a bar per file in flight, speed and ETA")
    _job_id(watch)
    watch.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes (default: 1)")
    watch.add_argument("--once", action="store_true", help="print the view once and exit (for scripts and logs)")
    _runs(watch, "watch:cmd_watch")


# ------------------------------------------------------------------------------ schedules


def add_schedule(commands: argparse._SubParsersAction) -> None:
    schedule = commands.add_parser("schedule", help="incremental jobs started by a Temporal Schedule")
    sub = schedule.add_subparsers(dest="schedule_command", required=True)
    create = sub.add_parser("create", help="start an incremental job every interval or on a cron expression")
    create.add_argument("name", metavar="NAME", help="the schedule's name (its ID is s3batch-NAME)")
    create.add_argument("--every", help="interval: 15m, 1h, 1d")
    create.add_argument("--cron", help="cron expression, e.g. '0 * * * *'")
    create.add_argument("--overlap", choices=OVERLAPS, default="skip", help="a tick while a run runs (default: skip)")
    create.add_argument("--task-queue", help="task queue of the workers (default: S3BATCH_TASK_QUEUE or s3-batch)")
    create.add_argument("--paused", action="store_true", help="create it paused (e.g. to backfill first)")
    _json_flag(create)
    create.add_argument("--input", metavar="JSON", help="the job as JSON (instead of the job flags)")
    add_job_flags(create)
    _runs(create, "schedule:cmd_create")
    listing = sub.add_parser("list", help="the s3batch schedules")
    _json_flag(listing)
    _runs(listing, "schedule:cmd_list")
    for action, text in (
        ("pause", "start no run until unpause"),
        ("unpause", "start runs again"),
        ("trigger", "start a run now"),
        ("delete", "delete the schedule (runs started go on)"),
    ):
        cmd = sub.add_parser(action, help=text)
        cmd.add_argument("name", metavar="NAME")
        _runs(cmd, "schedule:cmd_action", action=action)


def add_backfill(commands: argparse._SubParsersAction) -> None:
    backfill = commands.add_parser("backfill", help="run a schedule's ticks of a past time window")
    backfill.add_argument("name", metavar="NAME", help="the schedule's name")
    backfill.add_argument("--start", required=True, help="ISO 8601 start of the window")
    backfill.add_argument("--end", required=True, help="ISO 8601 end of the window")
    _json_flag(backfill, "machine-readable output (the runs' workflow IDs)")
    _runs(backfill, "schedule:cmd_backfill")


# ------------------------------------------------------------------------------ workers and versions


def add_version_flags(parser: argparse.ArgumentParser) -> None:
    """``--deployment-name`` and ``--build-id``, shared by ``s3batch-worker`` and ``s3batch worker``."""
    parser.add_argument(
        "--deployment-name",
        help="Worker Versioning: the Worker Deployment this worker belongs to (S3BATCH_DEPLOYMENT_NAME; "
        "default s3batch when a build ID is given). Neither given: unversioned.",
    )
    parser.add_argument(
        "--build-id",
        help="Worker Versioning: this worker's build ID (S3BATCH_BUILD_ID; default with a deployment name: "
        "the package version and the git commit of the image).",
    )


def add_worker(commands: argparse._SubParsersAction) -> None:
    worker = commands.add_parser("worker", help="run a worker (as s3batch-worker does), optionally as a version")
    add_version_flags(worker)
    _runs(worker, "deploy:run_worker", in_process=True)


def add_deploy(commands: argparse._SubParsersAction) -> None:
    deploy = commands.add_parser("deploy", help="Worker Versioning: which worker version takes new jobs")
    steps = deploy.add_subparsers(dest="step", required=True)
    status = steps.add_parser("status", help="the versions, which is current or ramping, runs still pinned to each")
    promote = steps.add_parser("promote", help="make a build current (or ramp it) for new jobs and continue-as-new")
    promote.add_argument("build_id", metavar="BUILD_ID")
    promote.add_argument("--ramp", type=float, metavar="PCT", help="send only this share (0-100) of new runs to it")
    back = steps.add_parser("rollback", help="stop a ramp, or make the version current before the current one current")
    runs = {status: "deploy:cmd_status", promote: "deploy:cmd_promote", back: "deploy:cmd_rollback"}
    for sub, function in runs.items():
        sub.add_argument("--deployment-name", help=f"default: S3BATCH_DEPLOYMENT_NAME, else {DEFAULT_DEPLOYMENT_NAME}")
        _json_flag(sub)
        _runs(sub, function)
    for sub in (promote, back):
        sub.add_argument("--wait", type=float, default=60.0, metavar="SECONDS",
                         help="how long to wait for the build's workers to poll (default 60)")  # fmt: skip

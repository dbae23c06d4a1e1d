"""The job commands: ``start``, ``status``, ``report``, ``redrive`` and ``list``."""

from __future__ import annotations

import argparse
import json
import types
import typing
from collections.abc import Sequence
from dataclasses import asdict
from typing import Annotated, Any, Literal, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from temporalio.client import Client

from s3batch import client as api
from s3batch.cli.deploy import print_run_versions
from s3batch.cli.output import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_ID_USED, EXIT_OK, CliError, out, print_json, safe_line
from s3batch.cli.render import follow, print_jobs, print_outcome, print_report, print_view
from s3batch.client import plan
from s3batch.client.deployments import run_versions
from s3batch.models import S3BatchInput
from s3batch.sinks.spec import destination
from s3batch.validation import describe_validation_error

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
    validates them, and supplies its own defaults.
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
            group.add_argument(flag(name), dest=name, metavar="JSON", type=_json_or_text, default=argparse.SUPPRESS,
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


def _json_or_text(value: str) -> Any:
    """A flag's value read as JSON when it is JSON (``'{"type": "s3"}'``, ``'["id", "name"]'``),
    else as the text itself (``none``), for the model to validate."""
    try:
        return json.loads(value)
    except ValueError:
        return value


def job_from_args(args: argparse.Namespace) -> S3BatchInput:
    """Validate the job flags into an :class:`S3BatchInput`.

    Raises:
        CliError: With ``EXIT_BAD_INPUT`` and a message naming each invalid field.
    """
    values = {name: getattr(args, name) for name in S3BatchInput.model_fields if hasattr(args, name)}
    # A tab is hard to type as a flag's value: --delimiter '\t' means one (as $'\t' does).
    values = {name: "\t" if value == "\\t" else value for name, value in values.items()}
    try:
        # Flags are text: "--chunk-records 500" is read as a number here (JSON input stays strict).
        return S3BatchInput.model_validate(values, strict=False)
    except ValidationError as err:
        raise CliError(
            f"invalid job input: {describe_validation_error(err, what='input')}\n"
            "(nothing was started; see `s3batch start --help`)",
            EXIT_BAD_INPUT,
        ) from None


# ------------------------------------------------------------------------------ start, redrive


def _print_started(started: api.StartedJob) -> None:
    wid = started.workflow_id
    if not started.already_running:
        out.print(safe_line("Started job ", (wid, "bold")))
    else:
        out.print(
            safe_line(
                "Job ", (wid, "bold"), " was already running: not started again (the running job keeps its own input)"
            )
        )
    out.print(safe_line(f"  Web UI   {started.ui_url}"))
    out.print(safe_line(f"  status   s3batch status {wid}"))
    out.print(safe_line(f"  watch    s3batch watch {wid}"))


async def start_and_follow(
    client: Client,
    job: S3BatchInput,
    workflow_id: str,
    task_queue: str | None,
    *,
    wait: bool,
    as_json: bool,
    extra: dict[str, Any] | None = None,
) -> int:
    """Start ``job`` as ``workflow_id`` (or find it already running), say so, and follow it to its
    end if ``wait``. ``extra`` is merged into the JSON output. Used by ``start`` and ``redrive``.

    Raises:
        CliError: The ID already ran (exit 3).
    """
    try:
        started = await api.start(client, job, workflow_id, task_queue)
    except api.JobIdUsed as err:
        raise CliError(
            f"{err}. `s3batch status {workflow_id}` shows its outcome; pass another --id to run the job again.",
            EXIT_ID_USED,
        ) from None
    info = {**started.to_json(), **(extra or {})}
    if not as_json:
        _print_started(started)
    if not wait:
        if as_json:
            print_json(info)
        return EXIT_OK
    if as_json:
        result, error = await api.outcome(client, workflow_id)
        status = "succeeded" if result is not None else "failed"
        result_json = result.model_dump(mode="json") if result else None
        print_json({**info, "status": status, "result": result_json, "error": error})
    else:
        (result, error), stored = await follow(client, workflow_id)
        if stored is None and job.sink is not None:  # where the records went
            stored = await api.ended_report(client, workflow_id)
        print_outcome(result, error, stored)
        out.print(safe_line(f"  Web UI   {started.ui_url}"))
    return EXIT_OK if result is not None else EXIT_FAILED


async def cmd_start(args: argparse.Namespace) -> int:
    job = job_from_args(args)  # before connecting: bad input never reaches the server
    if args.dry_run:
        return await print_plan(job, as_json=args.json)
    workflow_id = args.id or api.default_workflow_id(job, encrypted=bool(api.environment_keys()))
    client = await api.connect()
    return await start_and_follow(client, job, workflow_id, args.task_queue, wait=args.wait, as_json=args.json)


async def cmd_redrive(args: argparse.Namespace) -> int:
    """Start a new job over the files that failed (or were cancelled) in a finished job (see
    :mod:`s3batch.client.redrive`)."""
    if args.output_prefix is not None and not args.rejected:
        raise CliError("--output-prefix goes with --rejected: a redrive of files writes into its job's", EXIT_BAD_INPUT)
    client = await api.connect()
    try:
        if args.rejected:
            plan = await api.prepare_rejected_redrive(
                client, args.workflow_id, args.id, args.task_queue, args.output_prefix
            )
        else:
            plan = await api.prepare_redrive(client, args.workflow_id, args.id, args.task_queue)
    except api.JobIdUsed as err:
        raise CliError(f"{err}. Pass another --id (or none).", EXIT_ID_USED) from None
    if not args.json and plan.rejected is not None:
        job = plan.job
        out.print(
            safe_line(
                f"Redriving the {plan.rejected:,} rejected record(s) of {len(plan.files)} file(s) of job ",
                (plan.of, "bold"), f" into {destination(job.sink, job.output_bucket, job.output_prefix)}",
            )
        )
        out.print(safe_line(f"  their lines are read from the rejects files of the job of {plan.original_report}"))
    elif not args.json:
        counts, job = plan.counts(), plan.job
        out.print(
            safe_line(
                "Redriving ", f"{len(plan.files)} file(s) of job ", (plan.of, "bold"),
                f" ({counts['failed']} failed, {counts['cancelled']} cancelled, {counts['not_started']} not started)"
                f"{', then the files it never listed,' if plan.unlisted else ''} into the same output "
                f"s3://{job.output_bucket}/{job.output_prefix}",
            )
        )
        kept = f"  original report kept at {plan.original_report} (the new job writes {plan.report} when it ends)"
        out.print(safe_line(kept))
    return await start_and_follow(
        client, plan.job, plan.workflow_id, plan.task_queue, wait=args.wait, as_json=args.json, extra=plan.to_json()
    )


async def print_plan(job: S3BatchInput, *, as_json: bool) -> int:
    """``start --dry-run``: the files ``job`` would list and what its ``after_success`` would do to each."""
    files = await plan.plan(job)
    caveat = plan.caveat(job)
    if as_json:
        print_json({"dry_run": True, "files": [f.to_json() for f in files], "caveat": caveat})
        return EXIT_OK
    source = job.manifest or f"s3://{job.bucket}/{job.prefix}"
    count = f"{len(files):,} file(s) under {source} would be processed"
    out.print(safe_line(("Dry run", "bold"), f": nothing started. {count}"))
    for f in files:
        then = f"  then: {f.then}" if f.then else ""
        out.print(safe_line(f"  s3://{f.bucket}/{f.key} ({f.size:,} bytes){then}"))
    if job.after_success is not None:
        out.print(safe_line("  (each only once it succeeded, and only if it is still the version listed)"))
    if caveat:
        out.print(safe_line(f"  note: {caveat}"))
    return EXIT_OK


# ------------------------------------------------------------------------------ status, report, list


async def cmd_status(args: argparse.Namespace) -> int:
    client = await api.connect()
    view = await api.describe(client, args.workflow_id)
    runs = await run_versions(client, args.workflow_id)
    if args.json:
        print_json({**view.to_json(), "runs": [asdict(r) for r in runs]})
    else:  # an ended job's report: a failed job's counts, where a sink job's records went
        print_view(view, await api.ended_report(client, args.workflow_id) if view.status != "running" else None)
        print_run_versions(runs)
    return EXIT_OK


async def cmd_report(args: argparse.Namespace) -> int:
    client = await api.connect()
    stored = await api.report(client, args.workflow_id)
    if args.json:
        print_json(json.loads(stored.report.to_json()))  # as written to S3
    else:
        print_report(stored)
        print_run_versions(await run_versions(client, args.workflow_id))
    return EXIT_OK


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


# ------------------------------------------------------------------------------ their flags


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
    start.add_argument("--json", action="store_true", help="machine-readable output")
    start.add_argument(
        "--dry-run",
        action="store_true",
        help="start nothing: list the files the job would process and what --after-success would do to each",
    )
    start.set_defaults(func=cmd_start)


def add_status(commands: argparse._SubParsersAction) -> None:
    status = commands.add_parser("status", help="progress and in-flight checkpoints of a job")
    status.add_argument("workflow_id", metavar="ID", help="the job's workflow ID")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(func=cmd_status)


def add_report(commands: argparse._SubParsersAction) -> None:
    report = commands.add_parser("report", help="the report of a finished job, as a table")
    report.add_argument("workflow_id", metavar="ID", help="the job's workflow ID")
    report.add_argument("--json", action="store_true", help="the report's JSON as written to S3")
    report.set_defaults(func=cmd_report)


def add_redrive(commands: argparse._SubParsersAction) -> None:
    redrive = commands.add_parser(
        "redrive",
        help="start a new job over the files that failed or were cancelled in a finished job (--rejected: over the "
        "records it rejected)",
    )
    redrive.add_argument("workflow_id", metavar="ID", help="the finished job's workflow ID")
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
    redrive.add_argument("--json", action="store_true", help="machine-readable output")
    redrive.set_defaults(func=cmd_redrive)


def add_list(commands: argparse._SubParsersAction) -> None:
    listing = commands.add_parser("list", help="running and recent jobs")
    listing.add_argument("--running", action="store_true", help="running jobs only")
    listing.add_argument(
        "--source",
        metavar="BUCKET/PREFIX",
        help="only jobs of this exact source (with encryption, matched by its HMAC under each configured key)",
    )
    listing.add_argument("--limit", type=int, default=50, help="at most this many jobs (default: 50)")
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    listing.set_defaults(func=cmd_list)

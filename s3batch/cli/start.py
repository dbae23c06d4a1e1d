"""Starting jobs: the job flags, ``start`` (and its ``--dry-run``) and ``redrive``."""

from __future__ import annotations

import argparse
from typing import Any

from pydantic import ValidationError
from temporalio.client import Client

from s3batch import client as api
from s3batch.cli.output import EXIT_BAD_INPUT, EXIT_OK, EXIT_WRONG_STATE, CliError, job_exit, out, print_json, safe_line
from s3batch.cli.render import follow, print_outcome
from s3batch.client import plan
from s3batch.messages import S3BatchResult
from s3batch.models import S3BatchInput
from s3batch.sinks.spec import destination
from s3batch.validation import validation_problems

# ------------------------------------------------------------------------------ job flags


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
        raise invalid_input(err, "nothing was started; see `s3batch start --help`") from None


def invalid_input(err: ValidationError, nothing: str) -> CliError:
    """The error of a job input the model refused: each invalid field on a line of its own, then ``nothing``
    (what was not done, in parentheses)."""
    problems = "".join(f"\n  {problem}" for problem in validation_problems(err, what="input"))
    return CliError(f"invalid job input:{problems}\n({nothing})", EXIT_BAD_INPUT)


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
            EXIT_WRONG_STATE,
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
        status = await ended_status(client, workflow_id, result)
        result_json = result.model_dump(mode="json") if result else None
        print_json({**info, "status": status, "result": result_json, "error": error})
    else:
        (result, error), stored = await follow(client, workflow_id)
        if stored is None and job.sink is not None:  # where the records went
            stored = await api.ended_report(client, workflow_id)
        print_outcome(result, error, stored)
        out.print(safe_line(f"  Web UI   {started.ui_url}"))
        status = await ended_status(client, workflow_id, result)
    return job_exit(status)


async def ended_status(client: Client, workflow_id: str, result: S3BatchResult | None) -> str:
    """How a job that ended ended: ``succeeded``, ``failed``, ``cancelled``, ``terminated`` or ``timed_out``."""
    if result is not None:
        return result.status
    _, desc = await api.describe_run(client, workflow_id)
    return api.status_word(desc.status)


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
        raise CliError(f"{err}. Pass another --id (or none).", EXIT_WRONG_STATE) from None
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

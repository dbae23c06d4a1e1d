"""Issue 33, the walls of a user's first day with ``s3batch``, each against the real stack: a workflow that is
not a job, validation errors on real lines, broken JSON in a flag, exit codes that tell the job's state, where
each file's rejects are, and a report table that fits 80 columns."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest
from temporalio.client import Client, WorkflowFailureError
from temporalio.worker import Worker

import tests.slow_handlers  # noqa: F401 - registers slow_passthrough for the in-process worker
from s3batch.cli.output import (
    EXIT_BAD_INPUT,
    EXIT_CANCELLED,
    EXIT_FAILED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_TERMINATED,
)
from tests.helpers import run
from tests.helpers.data import make_csv
from tests.helpers.jobs import slow_job, start, until


def one_error_line(stderr: str) -> str:
    """The one line of an error without a traceback."""
    assert "Traceback" not in stderr, stderr
    [line] = stderr.strip().splitlines()
    return line


async def test_a_workflow_that_is_not_a_job_is_named_as_such(client: Client, task_queue: str) -> None:
    """Before: ``s3batch status`` of another workflow type printed a 59-line traceback."""
    wid = f"not-a-job-{uuid.uuid4().hex[:8]}"
    handle = await client.start_workflow("OrderWorkflow", {"order": 1}, id=wid, task_queue=task_queue)
    try:
        for argv in (["status", wid], ["status", wid, "--json"], ["report", wid], ["watch", wid, "--once"]):
            r = await run("s3batch", *argv)
            assert r.code == EXIT_NOT_FOUND, r
            line = one_error_line(r.stderr)
            assert f"workflow '{wid}' is not an s3batch job: it is a 'OrderWorkflow' workflow" in line, line
    finally:
        await handle.terminate()


async def test_validation_errors_are_on_real_lines() -> None:
    """Before: ``error: invalid job input: ...\\n(nothing was started; ...)`` with a literal backslash-n."""
    r = await run("s3batch", "start", "--bucket", "incoming", "--output-bucket", "X", "--chunk-records", "-5")
    assert r.code == EXIT_BAD_INPUT, r
    assert "\\n" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert lines[0] == "error: invalid job input:", lines
    assert {line.split(":")[0] for line in lines[1:-1]} == {"  chunk_records", "  output_bucket"}, lines
    assert lines[-1] == "(nothing was started; see `s3batch start --help`)", lines


@pytest.mark.parametrize(
    ("flag", "value", "where"),
    [
        ("--sink", '{"type": "postgres", "table": "public.t",}', "line 1, column 42"),
        ("--sink", "{type: s3}", "line 1, column 2"),
        ("--after-success", '{"action": "tag",\n "tags": {"done": "yes"}', "line 2, column 25"),
    ],
)
async def test_broken_json_in_a_flag_says_where(flag: str, value: str, where: str) -> None:
    """Before: ``sink: Input should be a valid dictionary`` (the text was handed to the model as a string)."""
    r = await run("s3batch", "start", "--bucket", "incoming", "--output-bucket", "processed", flag, value)
    assert r.code == EXIT_BAD_INPUT, r
    assert f"argument {flag}: invalid JSON at {where}: " in r.stderr, r.stderr
    assert "valid dictionary" not in r.stderr, r.stderr


async def test_exit_codes_tell_the_job_state(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets: tuple[str, str]
) -> None:
    """Before: ``s3batch status`` of a failed (or cancelled) job exited 0, like a succeeded one."""
    src, out = buckets
    s3.put_object(Bucket=src, Key="in/a.csv", Body=make_csv(10))
    base = ["--bucket", src, "--prefix", "in/", "--output-bucket", out, "--task-queue", task_queue]
    # The commands run at once (each a process of its own, mostly starting up): a job's exit code is its own.
    ok, bad = await asyncio.gather(
        run("s3batch", "start", *base, "--output-prefix", "ok/", "--wait", "--json"),
        run("s3batch", "start", *base, "--output-prefix", "bad/", "--handler", "no-such-handler", "--wait"),
    )
    assert (ok.code, bad.code) == (EXIT_OK, EXIT_FAILED), (ok, bad)
    ok_id = json.loads(ok.stdout)["workflow_id"]
    bad_id = bad.stdout.split("Started job ", 1)[1].split()[0]

    s3.put_object(Bucket=src, Key="in/b.csv", Body=make_csv(20_000))
    cancelled, terminated = await asyncio.gather(
        start(client, task_queue, slow_job(src, out, output_prefix="c/"), "exit-cancel"),
        start(client, task_queue, slow_job(src, out, output_prefix="t/"), "exit-terminate"),
    )
    await asyncio.gather(*(until(lambda p: p.files_in_flight >= 1, h) for h in (cancelled, terminated)))
    await cancelled.cancel()
    await terminated.terminate()
    with pytest.raises(WorkflowFailureError):
        await cancelled.result()

    expected = [(argv, code) for wid, code in ((ok_id, EXIT_OK), (bad_id, EXIT_FAILED), (cancelled.id, EXIT_CANCELLED),
                                               (terminated.id, EXIT_TERMINATED), ("no-such-job", EXIT_NOT_FOUND))
                for argv in (["status", wid], ["status", wid, "--json"], ["watch", wid])]  # fmt: skip
    report_codes = {ok_id: EXIT_OK, cancelled.id: EXIT_CANCELLED, terminated.id: EXIT_NOT_FOUND}  # no report
    expected += [(["report", wid], code) for wid, code in report_codes.items()]
    ran = await asyncio.gather(*(run("s3batch", *argv) for argv, _ in expected))
    for (argv, code), r in zip(expected, ran, strict=True):
        assert r.code == code, (argv, r)


async def test_the_report_says_where_each_files_rejects_are_and_fits_80_columns(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets: tuple[str, str]
) -> None:
    """Before: no pointer to a file's rejects (you listed the prefix), and at 80 columns the table folded
    keys mid-word."""
    src, out = buckets
    rejecting = "in/exports/2026-11-30/customers-eu-west-1-with-a-long-descriptive-name.csv"
    clean = "in/exports/2026-11-30/orders-eu-west-1-with-an-even-longer-descriptive-name.csv"
    s3.put_object(Bucket=src, Key=rejecting, Body=make_csv(50) + b'1,"unterminated\n')
    s3.put_object(Bucket=src, Key=clean, Body=make_csv(30))
    base = ["--bucket", src, "--prefix", "in/", "--output-bucket", out, "--output-prefix", "o/"]
    done = await run("s3batch", "start", *base, "--task-queue", task_queue, "--wait", "--json")
    assert done.code == EXIT_OK, done
    wid = json.loads(done.stdout)["workflow_id"]

    files = {f["key"]: f for f in json.loads(s3.get_object(Bucket=out, Key="o/_report.json")["Body"].read())["files"]}
    prefix = f"s3://{out}/o/{rejecting}/rejects-"
    assert files[rejecting]["rejected"] == 1 and files[rejecting]["rejects_prefix"] == prefix
    assert "rejects_prefix" not in files[clean]
    listed = s3.list_objects_v2(Bucket=out, Prefix=prefix.removeprefix(f"s3://{out}/"))["Contents"]
    assert [o["Key"].rsplit("/", 1)[1] for o in listed] == ["rejects-00000.jsonl"]

    for columns in (80, 200):
        r = await run("s3batch", "report", wid, columns=columns)
        assert r.code == EXIT_OK, r
        lines = r.stdout.splitlines()
        assert any(line.strip().startswith(f"rejects  {prefix}") for line in lines), r.stdout
        for key in (rejecting, clean):  # each key whole on one line
            assert any(key in line for line in lines), (columns, r.stdout)
        long = [line for line in lines if len(line) > columns and "s3://" not in line]  # a URI is as long as it is
        assert not long, r.stdout

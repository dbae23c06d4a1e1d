"""Issue 12, a newcomer's first hour: what they hit after ``make demo``, each checked against the real
stack (the walk-through of the README's Quick start is ``tests/test_quickstart.py``)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import uuid
from asyncio.subprocess import DEVNULL, PIPE, STDOUT
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker

import tests.fault_handlers  # registers explode_until_fixed for the in-process worker
import tests.slow_handlers  # registers slow_passthrough for the in-process worker
from s3batch import client as api
from s3batch import layout
from s3batch.dev.stack import StackConfig
from tests.helpers import BIN, Run, wait_for
from tests.helpers.data import make_csv
from tests.helpers.jobs import SLOW_HEARTBEAT_TIMEOUT, new_id, slow_job, start, until
from tests.helpers.output import report


def parts(s3: Any, bucket: str, key: str) -> int:
    return s3.list_objects_v2(Bucket=bucket, Prefix=f"{layout.file_dir('o/', key)}part-")["KeyCount"]


async def test_cancelled_files_report_what_they_committed(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets: tuple[str, str]
):
    """Point 3: a file stopped by a cancel is reported with the records, parts and chunks of its last
    checkpoint (it had committed them), not with zeros."""
    src, out = buckets
    key = "in/big.csv"
    s3.put_object(Bucket=src, Key=key, Body=make_csv(20_000))  # 200 chunks of 50 ms
    handle = await start(client, task_queue, slow_job(src, out), "cancel-books")
    await until(lambda p: p.files_in_flight == 1, handle)
    await wait_for(lambda: parts(s3, out, key) >= 5, 60, "five committed parts")
    await handle.cancel()
    with pytest.raises(WorkflowFailureError):
        await handle.result()
    committed = parts(s3, out, key)
    rep = report(s3, out)
    (f,) = rep["files"]
    assert f["status"] == "cancelled"
    assert f["chunks"] == committed and f["records"] == f["records_written"] == committed * 100, f
    t = rep["totals"]
    assert (t["records"], t["records_written"]) == (committed * 100, committed * 100), t


async def test_a_file_cancelled_between_attempts_reports_its_committed_parts(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets: tuple[str, str], monkeypatch: pytest.MonkeyPatch
):
    """Point 3: a cancel that finds a file waiting for its next attempt (the server cancels it without
    running it, so the workflow learns nothing from it) still reports the parts that file committed:
    the report reads them back, so it is true, and a redrive resumes from there."""
    src, out = buckets
    key = "in/boom.csv"
    body = make_csv(1_000).replace(b'550,"name, 550"', b'550,"BOOM"')  # chunk 5 fails until the handler is fixed
    s3.put_object(Bucket=src, Key=key, Body=body)
    spec = slow_job(src, out, handler="explode_until_fixed", max_attempts=10)
    handle = await start(client, task_queue, spec, "cancel-backoff")

    async def retrying() -> bool:
        desc = await handle.describe()
        pending = desc.raw_description.pending_activities
        return bool(pending) and pending[0].attempt >= 3

    await wait_for(retrying, 60, "the file's third attempt (in retry backoff)")
    assert parts(s3, out, key) == 5
    await handle.cancel()
    with pytest.raises(WorkflowFailureError):
        await handle.result()
    rep = report(s3, out)
    (f,) = rep["files"]
    assert (f["status"], f["chunks"], f["records"], f["records_written"]) == ("cancelled", 5, 500, 500), f
    assert (rep["totals"]["records"], rep["totals"]["records_written"]) == (500, 500), rep["totals"]

    monkeypatch.setattr(tests.fault_handlers, "BOOM_FIXED", True)  # the in-process worker's handler, fixed
    redrive = await s3batch("redrive", handle.id, "--wait", timeout=120)
    assert redrive.code == 0, redrive
    (again,) = report(s3, out)["files"]
    assert (again["status"], again["resumed_from_record"], again["records"]) == ("succeeded", 500, 1_000), again


async def s3batch(*argv: str, timeout: float = 60, columns: int = 200, **env: str | None) -> Run:
    """``s3batch ARGV`` in a subprocess with the stack's environment changed by ``env`` (None drops a
    variable), at ``columns`` columns."""
    environ = {**os.environ, "COLUMNS": str(columns)}
    for name, value in env.items():
        if value is None:
            environ.pop(name, None)
        else:
            environ[name] = value
    proc = await asyncio.create_subprocess_exec(
        str(BIN / "s3batch"), *argv, stdout=PIPE, stderr=PIPE, env=environ, stdin=DEVNULL
    )
    try:
        stdout, stderr = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise AssertionError(f"s3batch {' '.join(argv)} still running after {timeout:g}s") from None
    assert proc.returncode is not None
    return Run(proc.returncode, stdout.decode(), stderr.decode())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_start_wait_and_status_say_when_no_worker_polls_the_task_queue(
    client: Client, s3: Any, buckets: tuple[str, str]
):
    """Point 1: with no worker on the job's task queue, ``start --wait`` says so (and what to run)
    instead of spinning on "waiting" forever, and so does ``status``; the job runs once a worker comes."""
    src, out = buckets
    s3.put_object(Bucket=src, Key="in/a.csv", Body=make_csv(10))
    queue = f"tq-nobody-{uuid.uuid4().hex[:8]}"
    wid = new_id("no-worker")
    args = ["--bucket", src, "--prefix", "in/", "--output-bucket", out, "--id", wid, "--task-queue", queue]
    proc = await asyncio.create_subprocess_exec(
        str(BIN / "s3batch"), "start", *args, "--wait", stdout=PIPE, stderr=STDOUT, stdin=DEVNULL,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert proc.stdout is not None
    seen: list[str] = []
    try:
        async with asyncio.timeout(60):
            while not any("no worker" in line for line in seen):
                line = (await proc.stdout.readline()).decode()
                assert line, f"s3batch start --wait ended without saying there is no worker: {seen}"
                seen.append(line)
    finally:
        proc.kill()
        await proc.wait()
    said = " ".join(seen)
    assert f"no worker polls task queue {queue}" in said and "make worker" in said, said

    status = await s3batch("status", wid)
    assert status.code == 0, status
    assert f"no worker polls task queue {queue}" in status.stderr and "make worker" in status.stderr, status
    as_json = json.loads((await s3batch("status", wid, "--json")).stdout)
    assert (as_json["task_queue"], as_json["workers"], as_json["waits_for_worker"]) == (queue, 0, True)
    watched = await s3batch("watch", wid, "--once")
    assert f"no worker polls task queue {queue}" in watched.stdout, watched

    async with Worker(client, task_queue=queue, activity_executor=ThreadPoolExecutor(4)):
        await client.get_workflow_handle(wid).result()
        status = await s3batch("status", wid)
    assert "no worker" not in status.stderr and f"{wid}: succeeded" in status.stdout, status


async def test_missing_s3_credentials_or_unreachable_servers_are_one_line_with_the_fix(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets: tuple[str, str]
):
    """Point 2: ``s3batch report`` without the stack's S3 credentials (no ``eval $(s3batch-stack
    env)``), with S3 or Temporal unreachable: one line naming what is missing and the command that
    fixes it, exit 8 (an error) or 7 (unreachable), no traceback, no dump of the transport's error."""
    src, out = buckets
    s3.put_object(Bucket=src, Key="in/a.csv", Body=make_csv(10))
    wid = new_id("creds")
    done = await s3batch("start", "--bucket", src, "--prefix", "in/", "--output-bucket", out, "--id", wid,
                         "--task-queue", task_queue, "--wait")  # fmt: skip
    assert done.code == 0, done
    nowhere = "/nonexistent/aws"
    no_credentials = await s3batch(
        "report", wid, AWS_ACCESS_KEY_ID=None, AWS_SECRET_ACCESS_KEY=None, AWS_PROFILE=None,
        AWS_SHARED_CREDENTIALS_FILE=nowhere, AWS_CONFIG_FILE=nowhere, AWS_EC2_METADATA_DISABLED="true",
    )  # fmt: skip
    port = free_port()
    no_s3 = await s3batch("report", wid, AWS_ENDPOINT_URL_S3=f"http://127.0.0.1:{port}")
    no_temporal = await s3batch("status", wid, TEMPORAL_ADDRESS=f"127.0.0.1:{port}")
    for r, said, code in (
        (no_credentials, "no S3 credentials", 8),
        (no_s3, f"cannot reach S3 at http://127.0.0.1:{port}", 7),
        (no_temporal, f"cannot connect to Temporal at 127.0.0.1:{port} (connection refused): is its server", 7),
    ):
        assert r.code == code and "Traceback" not in r.stderr, r
        [line] = r.stderr.strip().splitlines()
        assert said in line and "s3batch-stack env" in line, line
        assert not any(dump in line for dump in ("tonic", "ConnectError", "Os {", "transport")), line


async def test_tables_keep_ids_and_file_names_at_80_columns(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets: tuple[str, str]
):
    """Point 7: at 80 columns ``list`` shows every job ID whole on its row, and ``status`` the key of
    each file in flight whole, in one line each."""
    src, out = buckets
    key = "in/customers-2026-11-30-eu-west.csv"
    s3.put_object(Bucket=src, Key=key, Body=make_csv(60_000))  # 30 s in flight: four CLI runs on a loaded machine
    handle = await start(client, task_queue, slow_job(src, out), "eighty-columns-job-with-a-long-redrive-like-id")
    await until(lambda p: p.files_in_flight == 1, handle)
    await wait_for(lambda: parts(s3, out, key) >= 1, 60, "a committed part")
    for columns in (80, 200):
        listed = await s3batch("list", "--limit", "20", columns=columns)
        assert listed.code == 0, listed
        assert all(len(line) <= columns for line in listed.stdout.splitlines()), listed.stdout
        [row] = [line for line in listed.stdout.splitlines() if handle.id in line]
        assert "processing" in row, row
        status = await s3batch("status", handle.id, columns=columns)
        assert status.code == 0, status
        lines = [line for line in status.stdout.splitlines() if "Web UI" not in line]  # a URL is as long as it is
        assert all(len(line) <= columns for line in lines), status.stdout
        assert any(key in line for line in lines), status.stdout
    await handle.cancel()


async def test_one_vocabulary_succeeded_and_cancelled(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets: tuple[str, str]
):
    """Point 8: ``status``, ``list`` and the JSON of the client say ``succeeded`` and ``cancelled`` (the
    words of the report and the search attributes), never Temporal's ``completed`` / ``canceled``."""
    src, out = buckets
    s3.put_object(Bucket=src, Key="in/a.csv", Body=make_csv(10))
    ok = await s3batch("start", "--bucket", src, "--prefix", "in/", "--output-bucket", out, "--output-prefix", "ok/",
                       "--task-queue", task_queue, "--wait", "--json")  # fmt: skip
    ok_id = json.loads(ok.stdout)["workflow_id"]
    assert json.loads(ok.stdout)["status"] == "succeeded", ok
    s3.put_object(Bucket=src, Key="in/b.csv", Body=make_csv(20_000))
    handle = await start(client, task_queue, slow_job(src, out, output_prefix="c/"), "vocab-cancel")
    await until(lambda p: p.files_in_flight >= 1, handle)
    await handle.cancel()
    with pytest.raises(WorkflowFailureError):
        await handle.result()
    for wid, word in ((ok_id, "succeeded"), (handle.id, "cancelled")):
        status = await s3batch("status", wid)
        assert f"{wid}: {word}" in status.stdout, status
        assert json.loads((await s3batch("status", wid, "--json")).stdout)["status"] == word
        rows = [line for line in (await s3batch("list")).stdout.splitlines() if wid in line]
        assert len(rows) == 1 and word in rows[0], rows
        assert "completed" not in rows[0] and "canceled" not in rows[0], rows


async def test_a_prefix_matching_nothing_warns_and_fail_if_empty_fails(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets: tuple[str, str]
):
    """Point 6: a prefix that matches no file still succeeds, but says so in the CLI, the report and
    the Web UI details; ``--fail-if-empty`` (``"fail_if_empty": true`` in JSON) makes it a failure."""
    src, out = buckets
    s3.put_object(Bucket=src, Key="in/a.csv", Body=make_csv(10))
    base = ["--bucket", src, "--prefix", "customers/", "--output-bucket", out, "--task-queue", task_queue]
    quiet = await s3batch("start", *base, "--output-prefix", "e1/", "--id", (wid := new_id("empty")), "--wait")
    assert quiet.code == 0, quiet
    assert f"no file matched s3://{src}/customers/" not in quiet.stdout  # the result does not carry the source
    assert "warning" in quiet.stdout and "no file matched" in quiet.stdout and "--fail-if-empty" in quiet.stdout
    rep = report(s3, out, "e1/")
    assert rep["status"] == "succeeded" and rep["warnings"] == [
        f"no file matched s3://{src}/customers/: nothing was processed (check the prefix)"
    ], rep
    shown = await s3batch("report", wid)
    assert f"no file matched s3://{src}/customers/" in shown.stdout, shown
    # The Web UI's "User Metadata" tab shows the current details (the SDK's metadata query).
    handle = client.get_workflow_handle(wid)
    metadata = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    assert f"warning: no file matched s3://{src}/customers/" in metadata.current_details, metadata

    loud = await s3batch("start", *base, "--output-prefix", "e2/", "--fail-if-empty", "--wait")
    assert loud.code == 1, loud
    assert f"no file matched s3://{src}/customers/ (fail_if_empty)" in loud.stderr, loud
    assert report(s3, out, "e2/")["status"] == "failed"
    as_json = {"bucket": src, "prefix": "customers/", "output_bucket": out, "output_prefix": "e3/"}
    as_json["fail_if_empty"] = True  # as `temporal workflow start --input` gives it
    started = await client.start_workflow("S3BatchWorkflow", as_json, id=new_id("empty-json"), task_queue=task_queue)
    with pytest.raises(WorkflowFailureError) as failure:
        await started.result()
    assert isinstance(failure.value.cause, ApplicationError) and failure.value.cause.type == "EmptyPrefix"
    # Off, the switch is left out of the input as written: reports of jobs without it are unchanged.
    assert "fail_if_empty" not in rep["input"] and "overwrite_output" not in rep["input"]


async def test_a_job_refuses_an_output_prefix_holding_another_jobs_output(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets: tuple[str, str]
):
    """Point 5: a second, different job writing to the output prefix of another refuses at start, naming
    that job and the option to pass; its report stays untouched. ``--overwrite-output`` replaces it on
    purpose; a rerun of the very same job (same input, new ID) reuses the output as before."""
    src, out = buckets
    s3.put_object(Bucket=src, Key="in/a.csv", Body=make_csv(10))
    base = ["--bucket", src, "--prefix", "in/", "--output-bucket", out, "--output-prefix", "runs/1/",
            "--task-queue", task_queue, "--wait"]  # fmt: skip
    first_id = new_id("first")
    first = await s3batch("start", *base, "--id", first_id)
    assert first.code == 0, first
    etag = s3.head_object(Bucket=out, Key="runs/1/_report.json")["ETag"]

    second = await s3batch("start", *base, "--chunk-records", "5")
    assert second.code == 1, second
    said = " ".join(second.stderr.split())
    assert f"holds the output of job '{first_id}', which had another input" in said, said
    assert "--overwrite-output" in said and "InvalidInput" in said, said
    assert s3.head_object(Bucket=out, Key="runs/1/_report.json")["ETag"] == etag  # untouched

    rerun = await s3batch("start", *base, "--id", (rerun_id := new_id("rerun")))
    assert rerun.code == 0, rerun  # the same job again: its committed output is found, nothing replaced
    assert (rep := report(s3, out, "runs/1/"))["job_id"] == rerun_id and rep["files"][0]["resumed_from_record"] == 10

    again = await s3batch("start", *base, "--chunk-records", "5", "--overwrite-output", "--id", (third := new_id("3")))
    assert again.code == 0, again
    assert report(s3, out, "runs/1/")["job_id"] == third
    # The job that owns the prefix now can be redriven into it (nothing failed: refused for that reason only).
    redrive = await s3batch("redrive", third)
    assert redrive.code == 3 and "holds the output" not in redrive.stderr, redrive


async def test_a_flag_typo_suggests_the_closest_flag_or_command():
    """Point 9: ``--ouput-prefix`` and ``statsu`` get the closest flag or command, exit 2."""
    typo = await s3batch("start", "--bucket", "incoming", "--ouput-prefix", "runs/1/")
    assert typo.code == 2, typo
    assert "unrecognized argument '--ouput-prefix': did you mean --output-prefix?" in typo.stderr, typo
    assert "'runs/1/'" not in typo.stderr  # the flag's value is not a second unknown argument
    command = await s3batch("statsu", "job-1")
    assert command.code == 2 and "did you mean 'status'?" in command.stderr, command


async def test_the_same_id_with_another_input_is_an_error_and_the_same_input_follows_the_job(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets: tuple[str, str]
):
    """Point 9: starting a running job's ID again with a different input exits 3 naming the fields that
    differ (nothing started); with the identical input it follows the running job (exit 0)."""
    src, out = buckets
    s3.put_object(Bucket=src, Key="in/big.csv", Body=make_csv(60_000))  # 30 s in flight: two CLI runs, a loaded machine
    handle = await start(client, task_queue, slow_job(src, out), "same-id")
    await until(lambda p: p.files_in_flight == 1, handle)
    same = ["--bucket", src, "--prefix", "in/", "--output-bucket", out, "--output-prefix", "o/",
            "--handler", "slow_passthrough", "--chunk-records", "100", "--group-max-files", "1",
            "--heartbeat-timeout-seconds", str(SLOW_HEARTBEAT_TIMEOUT), "--id", handle.id,
            "--task-queue", task_queue]  # fmt: skip
    followed = await s3batch("start", *same)
    assert followed.code == 0 and "was already running" in followed.stdout, followed
    other = await s3batch("start", *same, "--chunk-records", "200")
    assert other.code == 3, other
    said = " ".join(other.stderr.split())
    assert f"job '{handle.id}' is running with another input (it differs in chunk_records)" in said, said
    assert (await handle.describe()).run_id == handle.result_run_id  # the running job goes on untouched
    await handle.cancel()


async def test_the_python_example_runs_as_a_script(s3: Any, buckets: tuple[str, str]):
    """Point 9: the README's Python example is ``examples/start_job.py``, a script that runs (no
    top-level ``await``): its own worker in the process, a job to its end."""
    src, out = buckets
    s3.put_object(Bucket=src, Key="demo/a.csv", Body=make_csv(25))
    script = Path(__file__).parent.parent / "examples" / "start_job.py"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(script), src, "demo/", out, "runs/python/", stdout=PIPE, stderr=PIPE, stdin=DEVNULL
    )
    stdout, stderr = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, (stdout, stderr)
    assert stdout.decode().splitlines() == [
        "succeeded: 1 of 1 files, 25 written",
        f"report: s3://{out}/runs/python/_report.json",
    ], stdout
    assert report(s3, out, "runs/python/")["totals"]["records_written"] == 25


@pytest.mark.servers  # starts servers or builds of its own
async def test_the_local_stack_gets_workers_in_the_background_and_in_the_foreground(tmp_path: Path):
    """Point 1: ``s3batch-stack up --workers 1`` (ports from flags) starts a worker that ``status`` lists
    and ``down`` stops; ``s3batch-stack worker`` (``make worker``) runs one in the foreground on the
    stack; both poll the stack's task queue."""
    config = StackConfig.random_ports(tmp_path / "stack")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "AWS_", "S3BATCH_"))}
    stack = [str(BIN / "s3batch-stack")]
    root = ["--root", str(config.root)]
    ports = ["--temporal-port", str(config.temporal_port), "--ui-port", str(config.ui_port),
             "--s3-port", str(config.s3_port), "--weed-base-port", str(config.weed_base)]  # fmt: skip
    foreground = None
    try:
        up = subprocess.run([*stack, "up", *root, *ports, "--workers", "1"], env=env, capture_output=True, text=True,
                            timeout=120, check=False)  # fmt: skip
        assert up.returncode == 0 and "workers          1 running" in up.stdout, up
        status = subprocess.run([*stack, "status", *root], env=env, capture_output=True, text=True, check=True)
        assert re.search(r"worker-1: pid \d+ running", status.stdout), status.stdout
        foreground = subprocess.Popen([*stack, "worker", *root], env=env, stdout=PIPE, stderr=STDOUT, stdin=DEVNULL)
        temporal = await Client.connect(config.temporal_address)

        async def both_poll() -> bool:
            return await api.workers_polling(temporal, "s3-batch") == 2

        await wait_for(both_poll, 60, "the background and the foreground worker polling s3-batch", interval=0.5)
        foreground.send_signal(signal.SIGINT)  # Ctrl-C
        assert foreground.wait(60) == 0
    finally:
        if foreground is not None and foreground.poll() is None:
            foreground.kill()
            foreground.wait()
        down = subprocess.run([*stack, "down", *root], env=env, capture_output=True, text=True, timeout=120)
    assert down.returncode == 0 and "stopped worker-1" in down.stdout and "stopped temporal" in down.stdout, down

"""Schedules of incremental jobs (issue 16): through ``s3batch schedule`` and through the ``temporal`` CLI."""

from __future__ import annotations

import datetime
import json
import uuid
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.worker import Worker

from s3batch.client import schedules
from s3batch.incremental import run_output_prefix
from s3batch.logs import printable
from s3batch.models import S3BatchInput
from tests.helpers import run, wait_for


async def _runs(client: Client, workflow_id: str) -> list[Any]:
    """The finished runs the schedule started (workflow IDs ``{workflow_id}-{tick time}``)."""
    found = []
    async for wf in client.list_workflows(f"WorkflowId STARTS_WITH '{workflow_id}-'"):
        if wf.status == WorkflowExecutionStatus.COMPLETED:
            found.append(wf)
    return found


async def test_schedule_commands_start_incremental_runs(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets: tuple[str, str]
):
    src, out = buckets
    s3.put_object(Bucket=src, Key="in/a.jsonl", Body=b'{"a": 1}\n')
    name = f"hourly-{uuid.uuid4().hex[:6]}"
    created = await run(
        "s3batch", "schedule", "create", name, "--every", "1h", "--task-queue", task_queue,
        "--input", json.dumps({"bucket": src, "prefix": "in/", "output_bucket": out, "output_prefix": "o/"}), "--json",
    )
    assert created.code == 0, created.stderr
    ids = json.loads(created.stdout)
    assert ids == {"schedule_id": f"s3batch-{name}", "workflow_id": f"s3batch-schedule-{name}"}
    try:
        listed = await run("s3batch", "schedule", "list", "--json")
        assert any(s["name"] == name and not s["paused"] for s in json.loads(listed.stdout)), listed.stdout

        assert (await run("s3batch", "schedule", "trigger", name)).code == 0
        first = await wait_for(lambda: _runs(client, ids["workflow_id"]), 60, "the triggered run to complete")
        run_id = first[0].id
        ledger = json.loads(s3.get_object(Bucket=out, Key="o/ledger/ledger.json")["Body"].read())
        assert ledger["last_run"] == run_id and ledger["runs"][-1]["new"] == 1
        assert s3.get_object(Bucket=out, Key=f"{run_output_prefix('o/', run_id)}in/a.jsonl/part-00000.jsonl")

        assert (await run("s3batch", "schedule", "pause", name)).code == 0
        described = await run("temporal", "schedule", "describe", "--schedule-id", f"s3batch-{name}", "-o", "json")
        assert described.code == 0, described.stderr
        assert json.loads(described.stdout)["schedule"]["state"]["paused"] is True
        assert (await run("s3batch", "schedule", "unpause", name)).code == 0
    finally:
        assert (await run("s3batch", "schedule", "delete", name)).code == 0
    gone = await run("temporal", "schedule", "list", "-o", "json")
    assert f"s3batch-{name}" not in gone.stdout


async def test_schedule_create_refuses_bad_input_locally(client: Client):
    bad = await run("s3batch", "schedule", "create", "x", "--every", "1h", "--input", '{"bucket": "src-x"}')
    assert bad.code == 2 and "output_bucket" in bad.stderr, bad
    neither = await run("s3batch", "schedule", "create", "x", "--bucket", "src-x", "--output-bucket", "out-x")
    assert neither.code == 2 and "--every" in neither.stderr, neither
    assert "s3batch-x" not in (await run("temporal", "schedule", "list", "-o", "json")).stdout


async def test_temporal_cli_schedule_create_as_in_the_readme(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets: tuple[str, str]
):
    src, out = buckets
    s3.put_object(Bucket=src, Key="in/b.jsonl", Body=b'{"b": 1}\n')
    name = f"cli-{uuid.uuid4().hex[:6]}"
    job = {"bucket": src, "prefix": "in/", "output_bucket": out, "output_prefix": "t/", "incremental": {}}
    created = await run(
        "temporal", "schedule", "create", "--schedule-id", f"s3batch-{name}", "--interval", "1h",
        "--overlap-policy", "Skip", "--workflow-id", f"s3batch-schedule-{name}", "--task-queue", task_queue,
        "--type", "S3BatchWorkflow", "--input", json.dumps(job),
    )
    assert created.code == 0, created.stderr
    try:
        listed = await run("s3batch", "schedule", "list", "--json")
        assert any(s["name"] == name for s in json.loads(listed.stdout))
        assert (await run("temporal", "schedule", "trigger", "--schedule-id", f"s3batch-{name}")).code == 0
        done = await wait_for(lambda: _runs(client, f"s3batch-schedule-{name}"), 60, "the triggered run")
        ledger = json.loads(s3.get_object(Bucket=out, Key="t/ledger/ledger.json")["Body"].read())
        assert ledger["last_run"] == done[0].id
    finally:
        assert (await run("temporal", "schedule", "delete", "--schedule-id", f"s3batch-{name}")).code == 0


async def test_schedule_list_shows_the_servers_strings_escaped(client: Client) -> None:
    """A schedule's job is the server's string, written by whoever created the schedule: a prefix holding an
    OSC 52 clipboard write and a window title reaches ``s3batch schedule list`` escaped (issue 36, finding 6),
    as every other command shows keys and prefixes."""
    prefix = "in/\x1b]52;c;cm0gLXJmIH4=\x07\x1b]0;owned\x07\x1b[2J\r/"
    job = S3BatchInput(bucket="src-esc", prefix=prefix, output_bucket="out-esc", output_prefix="o/")
    name = f"esc-{uuid.uuid4().hex[:6]}"
    await schedules.create(client, name, job, every=datetime.timedelta(hours=1), paused=True)
    try:
        listed = await run("s3batch", "schedule", "list")
        assert listed.code == 0, listed
        [line] = [line for line in listed.stdout.splitlines() if line.startswith(f"{name}\t")]
        assert line.split("\t")[1] == "paused" and f"s3://src-esc/{printable(prefix)} -> s3://out-esc/o/" in line
        for raw in ("\x1b", "\x07", "\r"):
            assert raw not in listed.stdout + listed.stderr, repr(listed.stdout)
    finally:
        await schedules.delete(client, name)

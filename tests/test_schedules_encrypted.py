"""Schedules with encryption on (issue 16 with s3batch.codec): the job a schedule starts is stored
encrypted in the schedule's action and in each run's history, the runs succeed on an encrypting worker,
and ``s3batch schedule list`` reads the job with the key (and says it cannot without it)."""

from __future__ import annotations

import base64
import json
import os
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from temporalio.api.workflowservice.v1 import DescribeScheduleRequest
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.worker import Worker

from s3batch import search_attributes as sa
from s3batch.codec import KEY_ENV
from s3batch.dev.stack import Stack
from s3batch.incremental import run_output_prefix
from s3batch.messages import S3BatchResult
from s3batch.plugin import S3BatchPlugin
from s3batch.s3io import make_client
from tests.helpers import run, wait_for
from tests.helpers.output import read_jsonl

KEY = os.urandom(32)


async def _completed(client: Client, prefix: str) -> list[Any]:
    return [
        wf
        async for wf in client.list_workflows(f"WorkflowId STARTS_WITH '{prefix}'")
        if wf.status == WorkflowExecutionStatus.COMPLETED
    ]


async def _listing_reads_the_job_with_the_key_only(name: str, job: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``s3batch schedule list`` with the key shows the job; without it, says so and shows no name."""
    listed = await run("s3batch", "schedule", "list", "--json")
    assert listed.code == 0, listed.stderr
    [entry] = [s for s in json.loads(listed.stdout) if s["name"] == name]
    assert entry["job"] == job and entry["paused"], entry
    table = await run("s3batch", "schedule", "list")
    assert f"{name}\tpaused\t" in table.stdout and job in table.stdout, table
    key = os.environ[KEY_ENV]
    monkeypatch.delenv(KEY_ENV)
    unkeyed = await run("s3batch", "schedule", "list", "--json")
    assert unkeyed.code == 0, unkeyed.stderr
    [entry] = [s for s in json.loads(unkeyed.stdout) if s["name"] == name]
    bucket = job.split("/")[2]
    assert entry["job"].startswith("(cannot be decoded here") and bucket not in unkeyed.stdout, unkeyed
    monkeypatch.setenv(KEY_ENV, key)


async def test_scheduled_job_is_encrypted_in_the_schedule_and_its_runs(
    stack: Stack, s3: Any, buckets: tuple[str, str], task_queue: str, monkeypatch: pytest.MonkeyPatch
):
    src, out = buckets
    tag = uuid.uuid4().hex[:8]
    prefix, output_prefix = f"secret-in-{tag}/", f"secret-out-{tag}/"
    secrets = [src, out, prefix, output_prefix, f"secret-file-{tag}"]
    s3.put_object(Bucket=src, Key=f"{prefix}secret-file-{tag}.jsonl", Body=b'{"v": 1}\n')
    monkeypatch.setenv(KEY_ENV, base64.b64encode(KEY).decode())  # for the s3batch commands run below
    keyed = await Client.connect(
        stack.config.temporal_address, plugins=[S3BatchPlugin(make_client(), encryption_key=KEY)]
    )
    bare = await Client.connect(stack.config.temporal_address)  # no plugin, no codec: what the server holds
    name = f"enc-{tag}"
    job = {"bucket": src, "prefix": prefix, "output_bucket": out, "output_prefix": output_prefix}
    created = await run(
        "s3batch", "schedule", "create", name, "--every", "1h", "--paused", "--task-queue", task_queue,
        "--input", json.dumps(job),
    )
    assert created.code == 0, created.stderr
    try:
        # The schedule's action, as stored: one encrypted payload, no name of the job in any byte.
        stored = await bare.workflow_service.describe_schedule(
            DescribeScheduleRequest(namespace=bare.namespace, schedule_id=f"s3batch-{name}")
        )
        payloads = stored.schedule.action.start_workflow.input.payloads
        assert len(payloads) == 1 and payloads[0].metadata["encoding"] == b"binary/encrypted", payloads
        raw = stored.SerializeToString()
        for secret in secrets:
            assert secret.encode() not in raw, f"{secret!r} in the stored schedule"

        job_text = f"s3://{src}/{prefix} -> s3://{out}/{output_prefix}"
        await _listing_reads_the_job_with_the_key_only(name, job_text, monkeypatch)

        # A run on an encrypting worker succeeds, and its history holds the job only encrypted.
        pool = ThreadPoolExecutor(4)
        async with Worker(keyed, task_queue=task_queue, max_concurrent_activities=4, activity_executor=pool):
            assert (await run("s3batch", "schedule", "trigger", name)).code == 0
            [done] = await wait_for(lambda: _completed(keyed, f"s3batch-schedule-{name}-"), 90, "the triggered run")
        result = await keyed.get_workflow_handle(done.id, result_type=S3BatchResult).result()
        assert result.status == "succeeded" and result.totals.files_succeeded == 1, result
        assert read_jsonl(s3, out, f"{run_output_prefix(output_prefix, done.id)}{prefix}secret-file-{tag}.jsonl/") == [
            {"v": 1}
        ]
        # Indexed as a job started by s3batch start with the key (an HMAC of its source, never its name),
        # and summarised in the Web UI by its source and output (decoded with the key).
        described = await keyed.get_workflow_handle(done.id).describe()
        assert await described.static_summary() == job_text, await described.static_summary()
        attributes = described.typed_search_attributes
        hashed = sa.source_value(src, prefix, [KEY])
        assert attributes.get(sa.SOURCE) == hashed and hashed.startswith("hmac:"), attributes
        ledger = json.loads(s3.get_object(Bucket=out, Key=f"{output_prefix}ledger/ledger.json")["Body"].read())
        assert ledger["last_run"] == done.id and ledger["runs"][-1]["new"] == 1  # an incremental run
        history = await bare.get_workflow_handle(done.id).fetch_history()
        text = history.to_json()
        for secret in secrets:
            assert secret not in text, f"{secret!r} in the history of {done.id} read without the key"
        [started] = [e for e in history.events if e.HasField("workflow_execution_started_event_attributes")]
        [job_payload] = started.workflow_execution_started_event_attributes.input.payloads
        assert job_payload.metadata["encoding"] == b"binary/encrypted"
    finally:
        assert (await run("s3batch", "schedule", "delete", name)).code == 0

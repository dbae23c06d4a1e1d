"""The ``s3batch`` command and starting through the ``temporal`` CLI, against the real stack.

Every command runs as a real subprocess (the installed console scripts) while the test's worker runs
in this process's event loop, so the commands are awaited with asyncio, never blocking the loop.
"""

from __future__ import annotations

import gzip
import json
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import Worker

import tests.slow_handlers  # noqa: F401 - registers slow_passthrough (50 ms a chunk) for the in-process worker
from s3batch.dev.sample_data import customers_csv, gzip_chunks, upload_chunks, upload_samples
from s3batch.dev.stack import Stack
from s3batch.messages import S3BatchResult
from tests.helpers import run, wait_for

SLOW_HANDLER = "slow_passthrough"
"""Takes 50 ms per chunk, so a file stays in flight long enough to inspect."""

HEARTBEAT_TIMEOUT = "20"
"""Generous (a 2 s timeout failed files on a 0.4 s stall); the test worker still reports a checkpoint
to the server every second, which ``s3batch status`` reads."""


async def status_until_progress(wid: str, timeout: float = 60) -> dict[str, Any]:
    """Poll ``s3batch status --json`` until an in-flight file has a checkpoint past record 0."""

    async def progressed() -> dict[str, Any] | None:
        r = await run("s3batch", "status", wid, "--json")
        assert r.code == 0, r
        view = json.loads(r.stdout)
        assert view["status"] == "running", view
        if any(f["checkpoint"] and f["checkpoint"]["next_record"] > 0 for f in view["in_flight"]):
            return view
        return None

    return await wait_for(progressed, timeout, f"a checkpoint past record 0 in `s3batch status {wid}`", interval=0.3)


def job_id(tag: str) -> str:
    return f"cli-{tag}-{uuid.uuid4().hex[:8]}"


async def test_start_wait_completes_and_prints_the_report(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets: tuple[str, str]
):
    src, out = buckets
    samples = upload_samples(s3, src, "in/", rows=3000)
    wid = job_id("wait")

    r = await run(
        "s3batch", "start", "--bucket", src, "--prefix", "in/", "--output-bucket", out, "--output-prefix", "r1/",
        "--chunk-records", "1000", "--task-queue", task_queue, "--id", wid, "--wait",
    )

    assert r.code == 0, r
    assert f"Started job {wid}" in r.stdout
    assert f"/namespaces/default/workflows/{wid}" in r.stdout
    assert f"s3://{out}/r1/_report.json" in r.stdout
    assert "Job succeeded" in r.stdout
    report = json.loads(s3.get_object(Bucket=out, Key="r1/_report.json")["Body"].read())
    assert report["totals"]["files_succeeded"] == len(samples)
    assert report["totals"]["records"] == sum(s.records for s in samples)
    assert report["totals"]["rejected"] == sum(s.parse_rejects for s in samples)
    assert f"{report['totals']['records_written']:,} written" in r.stdout


async def test_failed_job_exits_non_zero_with_the_reason(
    client: Client, worker: Worker, task_queue: str, buckets: tuple[str, str]
):
    src, out = buckets
    r = await run(
        "s3batch", "start", "--bucket", src, "--output-bucket", out, "--handler", "no-such-handler",
        "--task-queue", task_queue, "--wait",
    )
    assert r.code == 1, r
    assert "Job failed" in r.stderr and "no-such-handler" in r.stderr


@pytest.mark.parametrize(
    ("flags", "field"),
    [
        (["--chunk-records", "-5"], "chunk_records"),
        (["--format", "xml"], "format"),
        (["--max-attempts", "lots"], "max_attempts"),
        (["--output-bucket", "X"], "output_bucket"),
    ],
)
async def test_bad_input_is_rejected_locally_naming_the_field(client: Client, flags: list[str], field: str):
    wid = job_id("bad")
    r = await run("s3batch", "start", "--bucket", "incoming", "--output-bucket", "processed", *flags, "--id", wid)
    assert r.code == 2, r
    assert field in r.stderr and "invalid job input" in r.stderr
    with pytest.raises(RPCError) as err:
        await client.get_workflow_handle(wid).describe()
    assert err.value.status == RPCStatusCode.NOT_FOUND


async def test_missing_required_field_is_named(client: Client):
    r = await run("s3batch", "start", "--output-bucket", "processed")
    assert r.code == 2 and "bucket: Field required" in r.stderr


async def test_same_id_twice_starts_one_run(client: Client, task_queue: str, s3: Any, buckets: tuple[str, str]):
    src, out = buckets
    s3.put_object(Bucket=src, Key="a.jsonl", Body=b'{"n": 1}\n{"n": 2}\n')
    wid = job_id("twice")
    argv = ("s3batch", "start", "--bucket", src, "--output-bucket", out, "--task-queue", task_queue, "--id", wid)

    # No worker yet: the first run is certainly still running when the second start arrives.
    first = await run(*argv, "--json")
    second = await run(*argv, "--json")
    human = await run(*argv)
    assert first.code == second.code == human.code == 0, (first, second, human)
    a, b = json.loads(first.stdout), json.loads(second.stdout)
    assert a["already_running"] is False and b["already_running"] is True
    assert a["run_id"] == b["run_id"]
    assert "already running: not started again" in human.stdout

    async with Worker(client, task_queue=task_queue, activity_executor=ThreadPoolExecutor(4)):
        result = await client.get_workflow_handle(wid, result_type=S3BatchResult).result()
    assert result.totals.records_written == 2
    desc = await client.get_workflow_handle(wid).describe()
    assert desc.run_id == a["run_id"]

    # Finished: the ID is not reused, so nothing runs again.
    again = await run(*argv, "--wait")
    assert again.code == 3, again
    assert "already ran" in again.stderr and "nothing was started" in again.stderr
    assert (await client.get_workflow_handle(wid).describe()).run_id == a["run_id"]


async def test_status_shows_in_flight_checkpoints(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets: tuple[str, str]
):
    src, out = buckets
    # 200 chunks at 50 ms each: about ten seconds in flight.
    upload_chunks(s3, src, "in/slow.csv", customers_csv(10_000, seed=7))
    etag = s3.head_object(Bucket=src, Key="in/slow.csv")["ETag"].strip('"')
    wid = job_id("status")
    started = await run(
        "s3batch", "start", "--bucket", src, "--prefix", "in/", "--output-bucket", out, "--handler", SLOW_HANDLER,
        "--chunk-records", "50", "--heartbeat-timeout-seconds", HEARTBEAT_TIMEOUT, "--task-queue", task_queue,
        "--id", wid,
    )
    assert started.code == 0, started

    view = await status_until_progress(wid)
    [f] = view["in_flight"]
    cp = f["checkpoint"]
    assert f["key"] == "in/slow.csv"
    assert f["state"] == "started" and f["attempt"] == 1
    assert cp["etag"] == etag
    assert cp["chunk"] >= 1 and cp["next_record"] == cp["chunk"] * 50
    assert cp["byte_offset"] > 0
    assert view["progress"]["in_flight"] == ["in/slow.csv"]
    assert view["progress"]["destination"] == f"s3://{out}/ (JSONL parts)"
    assert view["ui_url"].endswith(f"/namespaces/default/workflows/{wid}")

    human = await run("s3batch", "status", wid)
    assert human.code == 0, human
    assert "running" in human.stdout and "in/slow.csv" in human.stdout and "next record" in human.stdout
    assert f"into s3://{out}/ (JSONL parts)" in " ".join(human.stdout.split())

    await client.get_workflow_handle(wid).result()
    done = await run("s3batch", "status", wid, "--json")
    final = json.loads(done.stdout)
    assert final["status"] == "succeeded" and final["in_flight"] == []
    assert final["result"]["totals"]["records_written"] == 10_000
    assert final["result"]["report_key"] == "_report.json"


async def test_status_names_the_current_file_of_a_group(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets: tuple[str, str]
):
    src, out = buckets
    keys = [f"in/{name}.csv" for name in ("a", "b", "c")]
    for n, key in enumerate(keys):
        # Small files (grouped into one activity, run side by side on the group's threads), 300 chunks of
        # 50 ms each: the group is in flight for 15 s, long enough for `s3batch status` processes started on
        # a loaded machine (with 100 chunks a file, 5 s, CI under load saw the job end first).
        upload_chunks(s3, src, key, customers_csv(6_000, seed=n))
    wid = job_id("group")
    started = await run(
        "s3batch", "start", "--bucket", src, "--prefix", "in/", "--output-bucket", out, "--handler", SLOW_HANDLER,
        "--chunk-records", "20", "--heartbeat-timeout-seconds", HEARTBEAT_TIMEOUT, "--task-queue", task_queue,
        "--id", wid,
    )
    assert started.code == 0, started

    view = await status_until_progress(wid)
    [f] = view["in_flight"]
    assert f["group_files"] == 3
    # A listing page's files start biggest first (ties in key order): the group holds them in that order.
    order = sorted(keys, key=lambda k: -s3.head_object(Bucket=src, Key=k)["ContentLength"])
    assert f["key"] == order[f["group_index"]]
    assert f["checkpoint"]["etag"] == s3.head_object(Bucket=src, Key=f["key"])["ETag"].strip('"')
    assert sorted(view["progress"]["in_flight"]) == keys

    result = await client.get_workflow_handle(wid, result_type=S3BatchResult).result()
    assert result.totals.records_written == 18_000


async def test_status_of_unknown_id_fails_clearly(client: Client):
    r = await run("s3batch", "status", "no-such-job")
    assert r.code == 6 and "no job with ID 'no-such-job'" in r.stderr


async def test_temporal_cli_start_with_plain_json(
    client: Client, worker: Worker, task_queue: str, stack: Stack, s3: Any, buckets: tuple[str, str]
):
    src, out = buckets
    s3.put_object(Bucket=src, Key="customers/a.csv", Body=b"id,name\r\n1,Ada\r\n2,\"Hopper, Grace\"\r\n")
    wid = job_id("temporal")
    job = {"bucket": src, "prefix": "customers/", "output_bucket": out, "output_prefix": "runs/1/"}
    r = await run(
        "temporal", "workflow", "start", "--address", stack.config.temporal_address, "--namespace", "default",
        "--task-queue", task_queue, "--type", "S3BatchWorkflow", "--workflow-id", wid, "--input", json.dumps(job),
    )
    assert r.code == 0, r

    result = await client.get_workflow_handle(wid, result_type=S3BatchResult).result()
    assert result.status == "succeeded"
    assert result.report_key == "runs/1/_report.json"
    assert result.totals.records_written == 2
    rows = s3.get_object(Bucket=out, Key="runs/1/customers/a.csv/part-00000.jsonl")["Body"].read().splitlines()
    assert json.loads(rows[1]) == {"id": "2", "name": "Hopper, Grace"}
    desc = await client.get_workflow_handle(wid).describe()
    assert desc.status == WorkflowExecutionStatus.COMPLETED


def test_sample_data_streams_multipart_and_gzip(s3: Any, buckets: tuple[str, str]):
    src, _ = buckets
    data = b"".join(customers_csv(120_000, seed=3))
    assert len(data) > 8 * 1024 * 1024  # past the multipart threshold
    assert data == b"".join(customers_csv(120_000, seed=3))  # deterministic
    upload_chunks(s3, src, "big.csv", customers_csv(120_000, seed=3))
    head = s3.head_object(Bucket=src, Key="big.csv")
    assert head["ContentLength"] == len(data)
    assert "-" in head["ETag"]  # a multipart upload's ETag
    assert gzip.decompress(b"".join(gzip_chunks(customers_csv(500, seed=3)))) == b"".join(customers_csv(500, seed=3))

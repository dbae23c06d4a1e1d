"""``s3batch watch`` and ``s3batch redrive``: the watch screen as a pure function (unit tests), then
both commands as real subprocesses against the real stack (see tests/test_cli.py)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import json
import re
import uuid
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError
from temporalio.worker import Worker

import tests.slow_handlers  # noqa: F401 - registers slow_passthrough (50 ms a chunk) for the in-process worker
from s3batch import layout
from s3batch.checkpoint import Checkpoint
from s3batch.cli.watch import Sample, eta, sample_of, throughput, watch_renderable
from s3batch.client import InFlightFile, JobView
from s3batch.dev.sample_data import customers_csv, upload_chunks
from s3batch.formats.common import Record
from s3batch.handlers import HandlerResult, chunk_handler
from s3batch.messages import Progress, S3BatchResult
from tests.helpers import run, wait_for
from tests.helpers.output import read_jsonl

SLOW_HANDLER = "slow_passthrough"

# ------------------------------------------------------------------------------ the screen, unit


def progress(**kw: Any) -> Progress:
    values: dict[str, Any] = {
        "files_listed": 4,
        "files_succeeded": 1,
        "files_failed": 0,
        "files_in_flight": 2,
        "records": 5_000,
        "records_written": 4_990,
        "rejected": 10,
        "bytes_read": 1_000_000,
        "listing_done": True,
        "run": 0,
        "max_concurrent_files": 8,
    }
    return Progress(**{**values, **kw})


def checkpoint(next_record: int, byte_offset: int | None, chunk: int) -> Checkpoint:
    return Checkpoint(next_record=next_record, byte_offset=byte_offset, chunk=chunk, etag="e", fingerprint="f")


def in_flight(key: str, cp: Checkpoint | None, sizes: list[int], index: int = 0) -> InFlightFile:
    return InFlightFile(
        key=key,
        activity_id="1",
        attempt=1,
        state="started",
        last_heartbeat=None,
        checkpoint=cp,
        last_failure=None,
        group_files=len(sizes),
        group_index=index,
        sizes=sizes,
    )


def view(p: Progress | None, files: Sequence[InFlightFile]) -> JobView:
    return JobView("job-1", "run-1", "running", "http://ui/namespaces/default/workflows/job-1", p, list(files))


def text(renderable: Any) -> str:
    console = Console(file=io.StringIO(), width=160, force_terminal=False, color_system=None)
    console.print(renderable)
    return console.file.getvalue()  # type: ignore[attr-defined]


CSV = in_flight("in/big.csv", checkpoint(2_500, 250_000, 5), [1_000_000])
GZ = in_flight("in/events.jsonl.gz", checkpoint(1_200, None, 3), [500_000])


def test_watch_screen_has_a_bar_per_file_gzip_counts_speed_and_eta():
    v = view(progress(), [CSV, GZ])
    first = sample_of(v, 100.0)
    assert first == Sample(100.0, 5_000 + 2_500 + 1_200, 1_000_000 + 250_000)
    # Five seconds later: 500,000 more bytes and 5,000 more records.
    samples = [first, Sample(105.0, first.records + 5_000, first.bytes + 500_000)]

    screen = text(watch_renderable(v, samples))

    assert "job-1: running" in screen and "http://ui/namespaces/default/workflows/job-1" in screen
    assert "1 done of 4 listed" in screen and "4,990 written, 10 rejected" in screen
    assert "2 file(s) in flight" in screen and "at most 8 file(s) at once" in screen
    assert "1,000 records/s, 0.10 MB/s (last 5 s)" in screen
    big = next(line for line in screen.splitlines() if "in/big.csv" in line)
    assert "25%" in big and "━" in big and "250.0 kB / 1.0 MB" in big and "2,500" in big
    gz = next(line for line in screen.splitlines() if "in/events.jsonl.gz" in line)
    assert "gzip: no byte offset" in gz and "%" not in gz and "1,200" in gz
    assert "ETA" in screen


def test_eta_counts_in_flight_sizes_and_estimates_files_not_started():
    v = view(progress(), [CSV, GZ])
    # Left: 750 kB of big.csv, all 500 kB of the gzip file (no offset), and one file not started,
    # counted at the average size so far: (1 MB done + 1.5 MB in flight) / 3 files.
    left = 750_000 + 500_000 + 2_500_000 / 3
    assert eta(v, 100_000.0) == f"{round(left / 100_000)}s: 2.1 MB left (files not started yet counted at the " \
        "average size so far)"
    assert eta(v, None) == "measuring..."
    assert eta(v, 0.0).startswith("unknown (no bytes read")
    assert eta(view(progress(listing_done=False, files_listed=500), []), 1.0) == (
        "after the listing completes (500 files listed so far, more to come)"
    )
    # Nothing but the in-flight file left: known exactly.
    only = view(progress(files_listed=2, files_in_flight=1), [CSV])
    assert eta(only, 75_000.0) == "10s: 750.0 kB left"


def test_eta_is_announced_before_the_listing_completes_on_the_screen():
    screen = text(watch_renderable(view(progress(listing_done=False, files_listed=500), [CSV]), []))
    assert "500+ listed" in screen
    assert "ETA      after the listing completes" in screen and "speed    measuring" in screen


def test_throughput_uses_the_last_window_and_never_goes_negative():
    samples = [Sample(0.0, 0, 0), Sample(50.0, 1_000, 1_000_000), Sample(55.0, 2_000, 2_000_000),
               Sample(60.0, 3_000, 3_000_000)]
    assert throughput(samples, window=10.0) == (200.0, 200_000.0)  # from 50 to 60 s; the sample at 0 is too old
    assert throughput(samples[:1]) is None
    # A retried file restarts from an earlier checkpoint: the total steps back, the speed is 0.
    assert throughput([Sample(0.0, 500, 500), Sample(1.0, 100, 100)]) == (0.0, 0.0)


def test_a_group_counts_its_earlier_files_as_read():
    f = in_flight("in/c.csv", checkpoint(10, 400, 1), [1_000, 2_000, 800], index=2)
    assert (f.size, f.fraction, f.bytes_done) == (800, 0.5, 3_400)
    screen = text(watch_renderable(view(progress(), [f]), []))
    assert "in/c.csv (file 3 of 3 in a group)" in screen and "50%" in screen


def test_a_group_on_threads_counts_the_files_it_finished_not_those_before_the_one_it_names():
    # Files of a group run a few at once: file 3 heartbeating says nothing of files 1 and 2; the bytes of the
    # files finished (here only the second, 2,000 bytes) come with the heartbeat.
    third = in_flight("in/c.csv", checkpoint(10, 400, 1), [1_000, 2_000, 800], index=2)
    f = dataclasses.replace(third, group_done=2_000)
    assert (f.fraction, f.bytes_done) == (0.5, 2_400)
    assert dataclasses.replace(f, group_done=0).bytes_done == 400


def test_no_checkpoint_yet_and_no_progress():
    waiting = in_flight("in/new.csv", None, [10])
    assert "waiting for the first checkpoint" in text(watch_renderable(view(progress(), [waiting]), []))
    assert "progress unavailable" in text(watch_renderable(view(None, []), []))


# ------------------------------------------------------------------------------ watch, real stack


def job_id(tag: str) -> str:
    return f"wr-{tag}-{uuid.uuid4().hex[:8]}"


async def test_watch_shows_the_file_in_flight_then_the_outcome(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets: tuple[str, str]
):
    src, out = buckets
    # 200 chunks at 50 ms each: about ten seconds in flight. The SDK sends a checkpoint to the server
    # at most every 0.8 x the heartbeat timeout, but the test worker caps that at one second, so the
    # timeout can be generous (2 s failed the file on a 0.4 s stall of a loaded machine).
    upload_chunks(s3, src, "in/slow.csv", customers_csv(10_000, seed=11))
    wid = job_id("watch")
    started = await run(
        "s3batch", "start", "--bucket", src, "--prefix", "in/", "--output-bucket", out, "--handler", SLOW_HANDLER,
        "--chunk-records", "50", "--heartbeat-timeout-seconds", "20", "--task-queue", task_queue, "--id", wid,
    )
    assert started.code == 0, started
    assert f"s3batch watch {wid}" in started.stdout
    live = asyncio.ensure_future(run("s3batch", "watch", wid, "--interval", "0.3"))

    async def past_first_checkpoint() -> tuple[Any, str] | None:
        snap = await run("s3batch", "watch", wid, "--once")
        assert snap.code == 0, snap
        row = next((line for line in snap.stdout.splitlines() if "in/slow.csv" in line), "")
        if re.search(r"\b([1-9]\d?|100)%", row):  # past the first checkpoint (0%)
            return snap, row
        assert "Job succeeded" not in snap.stdout, snap  # finished before a checkpoint was seen
        return None

    snap, row = await wait_for(past_first_checkpoint, 60, f"`s3batch watch {wid} --once` past 0%", interval=0.3)
    assert f"{wid}: running" in snap.stdout and "speed    measuring" in snap.stdout  # one sample: no speed yet
    assert "ETA" in snap.stdout and "kB / 829.5 kB" in row and "━" in row

    done = await live
    assert done.code == 0, done
    # Not a terminal: rich's Live prints the last frame it drew (the job still running), then the outcome.
    assert f"{wid}: running" in done.stdout and f"{wid}: succeeded" in done.stdout
    assert "Job succeeded" in done.stdout and "10,000 written" in done.stdout
    assert f"s3://{out}/_report.json" in done.stdout

    after = await run("s3batch", "watch", wid, "--once")
    assert after.code == 0 and "Job succeeded" in after.stdout


async def test_watch_of_a_failed_job_exits_1(client: Client, worker: Worker, task_queue: str, buckets):
    src, out = buckets
    wid = job_id("watchfail")
    await client.start_workflow(
        "S3BatchWorkflow", {"bucket": src, "output_bucket": out, "handler": "no-such-handler"}, id=wid,
        task_queue=task_queue,
    )
    r = await run("s3batch", "watch", wid, "--interval", "0.2")
    assert r.code == 1, r
    assert "Job failed" in r.stderr and "no-such-handler" in r.stderr


# ------------------------------------------------------------------------------ redrive, real stack

COUNTRIES_HANDLER = "test_redrive_countries"
KNOWN_COUNTRIES = {"NL", "FR"}
"""The handler's reference table: the test "deploys a fix" by adding to it."""


@chunk_handler(COUNTRIES_HANDLER)
def _countries(records: Sequence[Record]) -> HandlerResult:
    """Enrich each record from a reference table; an unknown country fails the chunk (a chunk
    handler's exception fails the attempt), like a lookup that cannot go on without its data."""
    for r in records:
        if r.value["country"] not in KNOWN_COUNTRIES:
            raise LookupError(f"country {r.value['country']!r} is not in the reference table")
    return HandlerResult([{**r.value, "eu": True} for r in records], [])


def countries_csv(countries: Sequence[str]) -> bytes:
    return ("id,country\n" + "".join(f"{i},{c}\n" for i, c in enumerate(countries))).encode()


async def test_redrive_processes_only_the_failed_file_resuming_it_and_keeps_the_original_report(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets: tuple[str, str]
):
    """A realistic, fixable failure: the handler looks each record's country up in a reference
    table, and ``c.csv`` has a country missing from it at record 25. With ``--max-attempts 1`` the
    file fails at once, after committing chunks 0 and 1 (records 0-19); ``--max-failed-files 1``
    lets the job succeed with it reported failed. The operator then fixes the table (here: adds the
    country; in production, a deployment) and redrives. The source file is untouched, so the
    redriven job, which inherits the whole input, processes only ``c.csv`` and resumes it from its
    committed parts at record 20."""
    src, out = buckets
    good = countries_csv(["NL", "FR"] * 15)
    s3.put_object(Bucket=src, Key="in/a.csv", Body=good)
    s3.put_object(Bucket=src, Key="in/b.csv", Body=good)
    s3.put_object(Bucket=src, Key="in/c.csv", Body=countries_csv(["NL"] * 25 + ["BE"] + ["FR"] * 4))
    wid = job_id("redrive")
    first = await run(
        "s3batch", "start", "--bucket", src, "--prefix", "in/", "--output-bucket", out, "--output-prefix", "o/",
        "--handler", COUNTRIES_HANDLER, "--chunk-records", "10", "--group-max-files", "1", "--max-attempts", "1",
        "--max-failed-files", "1", "--task-queue", task_queue, "--id", wid, "--wait",
    )
    assert first.code == 0, first
    original = json.loads(s3.get_object(Bucket=out, Key="o/_report.json")["Body"].read())
    assert {f["key"]: f["status"] for f in original["files"]} == {
        "in/a.csv": "succeeded", "in/b.csv": "succeeded", "in/c.csv": "failed"
    }
    # The report names the exception and the lines, never its text (it could quote record contents).
    error = next(f for f in original["files"] if f["key"] == "in/c.csv")["error"]
    assert "raised LookupError on s3://" in error and "lines 22-31" in error
    assert "'BE'" not in error

    KNOWN_COUNTRIES.add("BE")
    try:
        r = await run("s3batch", "redrive", wid, "--wait", "--json")
    finally:
        KNOWN_COUNTRIES.discard("BE")
    assert r.code == 0, r
    info = json.loads(r.stdout)
    new_id = info["workflow_id"]
    copy_key = f"o/_report.before-redrive-{new_id}.json"
    assert new_id.startswith(f"{wid}-redrive-")
    assert info["redrive_of"] == wid and info["files"] == 1
    assert info["original_report"] == f"s3://{out}/{copy_key}"
    assert info["status"] == "succeeded" and info["result"]["status"] == "succeeded"
    assert info["ui_url"].endswith(f"/namespaces/default/workflows/{new_id}")

    # The original report is kept, byte for byte; the layout's report is now the redrive's.
    kept = json.loads(s3.get_object(Bucket=out, Key=copy_key)["Body"].read())
    assert kept == original
    after = json.loads(s3.get_object(Bucket=out, Key=layout.report_key("o/"))["Body"].read())
    assert after["job_id"] == new_id and after["status"] == "succeeded"
    assert after["input"]["only_failed_of"] == f"s3://{out}/{copy_key}"
    assert after["input"]["handler"] == COUNTRIES_HANDLER and after["input"]["output_prefix"] == "o/"
    [c] = after["files"]
    assert c["key"] == "in/c.csv" and c["status"] == "succeeded"
    assert c["resumed_from_record"] == 20
    assert after["totals"]["files_listed"] == 1
    rows = read_jsonl(s3, out, "o/in/c.csv/")
    assert [int(row["id"]) for row in rows] == list(range(30)) and all(row["eu"] for row in rows)

    # Only c.csv was processed: one file activity in the new job's history.
    history = await client.get_workflow_handle(new_id).fetch_history()
    scheduled = [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
    ]
    assert scheduled.count("s3batch.process_file") == 1 and "s3batch.process_group" not in scheduled

    # The layout's report is now the redrive's: redriving the first job again points there.
    again = await run("s3batch", "redrive", wid)
    assert again.code == 3, again
    assert f"belongs to job '{new_id}', not to '{wid}'" in again.stderr and f"s3batch redrive {new_id}" in again.stderr
    # And the redrive itself had no failures left.
    nothing = await run("s3batch", "redrive", new_id)
    assert nothing.code == 3 and "nothing to redrive" in nothing.stderr, nothing


async def test_redrive_prints_the_new_job_and_the_kept_report(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets: tuple[str, str]
):
    src, out = buckets
    s3.put_object(Bucket=src, Key="in/a.jsonl", Body=b'{"n": 1}\n')
    s3.put_object(Bucket=src, Key="in/b.data", Body=b'{"n": 2}\n')  # unknown extension: fails for good
    wid = job_id("human")
    result = await client.execute_workflow(
        "S3BatchWorkflow",
        {"bucket": src, "prefix": "in/", "output_bucket": out, "max_failed_files": 1},
        id=wid,
        task_queue=task_queue,
        result_type=S3BatchResult,
    )
    assert result.totals.files_failed == 1
    new_id = f"{wid}-again"

    r = await run("s3batch", "redrive", wid, "--id", new_id, "--task-queue", task_queue)

    assert r.code == 0, r
    assert f"Redriving 1 file(s) of job {wid} (1 failed, 0 cancelled, 0 not started)" in r.stdout
    assert f"original report kept at s3://{out}/_report.before-redrive-{new_id}.json" in r.stdout
    assert f"Started job {new_id}" in r.stdout and f"/namespaces/default/workflows/{new_id}" in r.stdout
    # The file still has no known format, so it fails again, alone.
    redriven = await client.get_workflow_handle(new_id, result_type=S3BatchResult).result()
    assert (redriven.totals.files_listed, redriven.totals.files_failed) == (1, 1)
    # A finished ID is never reused, and the kept report is not replaced.
    reused = await run("s3batch", "redrive", new_id, "--id", new_id)
    assert reused.code == 3 and "already ran" in reused.stderr, reused


async def test_redrive_of_a_running_job_exits_3(client: Client, task_queue: str, s3: Any, buckets: tuple[str, str]):
    src, out = buckets
    wid = job_id("running")
    # No worker polls this task queue: the job stays running.
    await client.start_workflow(
        "S3BatchWorkflow", {"bucket": src, "output_bucket": out}, id=wid, task_queue=task_queue
    )
    try:
        r = await run("s3batch", "redrive", wid)
        assert r.code == 3, r
        assert "still running" in r.stderr and "nothing was started" in r.stderr
    finally:
        await client.get_workflow_handle(wid).terminate("test over")
    assert "Contents" not in s3.list_objects_v2(Bucket=out)


async def test_redrive_of_a_job_without_failures_exits_3(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets: tuple[str, str]
):
    src, out = buckets
    s3.put_object(Bucket=src, Key="in/a.jsonl", Body=b'{"n": 1}\n')
    wid = job_id("clean")
    await client.execute_workflow(
        "S3BatchWorkflow", {"bucket": src, "prefix": "in/", "output_bucket": out}, id=wid, task_queue=task_queue
    )
    r = await run("s3batch", "redrive", wid)
    assert r.code == 3, r
    assert "no failed or cancelled files" in r.stderr and "nothing to redrive" in r.stderr
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=out)["Contents"]]
    assert not [k for k in keys if "before-redrive" in k]  # nothing copied

    # A job that failed before writing any report has nothing to redrive either.
    failed = job_id("noreport")
    handle = await client.start_workflow(
        "S3BatchWorkflow", {"bucket": src, "output_bucket": out, "output_prefix": "x/", "handler": "nope"},
        id=failed, task_queue=task_queue,
    )
    with contextlib.suppress(WorkflowFailureError):
        await handle.result()
    assert (await handle.describe()).status == WorkflowExecutionStatus.FAILED
    r = await run("s3batch", "redrive", failed)
    assert r.code == 3, r
    assert "without a report" in r.stderr and "nothing to redrive" in r.stderr


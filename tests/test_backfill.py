"""``s3batch backfill`` (issue 16): a schedule's ticks of a past window run one after the other, each an
incremental run of the schedule's ledger with the workflow ID of its tick; a window without ticks, or
one that is not a window, is refused with a message and exit code 2."""

from __future__ import annotations

import asyncio
import datetime
import json
import uuid
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.worker import Worker

from s3batch.incremental import run_output_prefix
from tests.helpers import run, wait_for
from tests.helpers.data import put_files
from tests.helpers.output import list_keys, read_jsonl

EVERY = 20  # seconds between the test schedule's ticks


def _at(moment: datetime.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


async def _finished(client: Client, prefix: str) -> dict[str, WorkflowExecutionStatus | None]:
    """Workflow ID -> status of every run whose ID starts with ``prefix``, once none of them is running."""
    found = {}
    async for wf in client.list_workflows(f"WorkflowId STARTS_WITH '{prefix}'"):
        found[wf.id] = wf.status
    return {} if WorkflowExecutionStatus.RUNNING in found.values() else found


async def _at_least(client: Client, prefix: str, count: int) -> dict[str, WorkflowExecutionStatus | None]:
    """:func:`_finished`, once it holds at least ``count`` runs (else empty)."""
    found = await _finished(client, prefix)
    return found if len(found) >= count else {}


async def _ids(client: Client, query: str, expected: set[str]) -> bool:
    return {wf.id async for wf in client.list_workflows(query)} == expected


def _outputs(s3: Any, out: str, workflow_id: str) -> list[str]:
    """The values a run wrote, under its own output prefix."""
    prefix = run_output_prefix("o/", workflow_id)
    sources = {k[len(prefix) :].rsplit("/", 1)[0] for k in list_keys(s3, out, prefix) if "/part-" in k}
    return [row["v"] for source in sorted(sources) for row in read_jsonl(s3, out, f"{prefix}{source}/")]


async def test_backfill_runs_each_tick_of_the_window_incrementally(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets: tuple[str, str]
):
    src, out = buckets
    put_files(s3, src, {f"in/a{i}.jsonl": f'{{"v": "a{i}-1"}}\n'.encode() for i in range(5)})
    name = f"bf-{uuid.uuid4().hex[:6]}"
    job = {"bucket": src, "prefix": "in/", "output_bucket": out, "output_prefix": "o/", "handler": "passthrough"}
    created = await run(
        "s3batch", "schedule", "create", name, "--every", f"{EVERY}s", "--task-queue", task_queue, "--paused",
        "--input", json.dumps(job),
    )
    assert created.code == 0, created.stderr
    runs_prefix = f"s3batch-schedule-{name}-"
    try:
        # A window of a day ago holding three ticks (multiples of 20 s since the epoch), not on its edges.
        base = datetime.datetime.now(datetime.UTC).replace(microsecond=0) - datetime.timedelta(days=1)
        base -= datetime.timedelta(seconds=base.timestamp() % EVERY)
        ticks = [base + datetime.timedelta(seconds=EVERY * n) for n in (1, 2, 3)]
        backfill = await run(
            "s3batch", "backfill", name, "--start", _at(base + datetime.timedelta(seconds=5)),
            "--end", _at(ticks[-1] + datetime.timedelta(seconds=5)), "--json",
        )
        assert backfill.code == 0, backfill.stderr
        expected = [f"{runs_prefix}{_at(t)}" for t in ticks]
        assert json.loads(backfill.stdout) == {"schedule_id": f"s3batch-{name}", "workflow_ids": expected}

        # The paused schedule runs the backfill (a backfill is asked for by hand), the three ticks in turn.
        done = await wait_for(lambda: _at_least(client, runs_prefix, 3), 120, "the three backfilled runs")
        assert sorted(done) == expected and set(done.values()) == {WorkflowExecutionStatus.COMPLETED}, done
        ledger = json.loads(s3.get_object(Bucket=out, Key="o/ledger/ledger.json")["Body"].read())
        assert [r["run"] for r in ledger["runs"]] == expected  # incremental runs of one ledger, in tick order
        assert [(r["new"], r["skipped_unchanged"]) for r in ledger["runs"]] == [(5, 0), (0, 5), (0, 5)]
        assert sorted(_outputs(s3, out, expected[0])) == [f"a{i}-1" for i in range(5)]
        assert _outputs(s3, out, expected[1]) == _outputs(s3, out, expected[2]) == []

        # Then a normal tick of the unpaused schedule takes only what changed since the backfill.
        s3.put_object(Bucket=src, Key="in/a2.jsonl", Body=b'{"v": "a2-2"}\n')
        s3.put_object(Bucket=src, Key="in/b0.jsonl", Body=b'{"v": "b0-1"}\n')
        assert (await run("s3batch", "schedule", "unpause", name)).code == 0
        later = await wait_for(lambda: _at_least(client, runs_prefix, 4), 120, "a normal tick's run")
        assert (await run("s3batch", "schedule", "pause", name)).code == 0
        done = await wait_for(lambda: _finished(client, runs_prefix), 60, "the runs to end after the pause")
        ticked = sorted(set(done) - set(expected))
        assert ticked and set(later) <= set(done) and set(done.values()) == {WorkflowExecutionStatus.COMPLETED}
        versions = [v for workflow_id in sorted(done) for v in _outputs(s3, out, workflow_id)]
        # Every version of every object processed exactly once across the backfilled runs and the ticks.
        assert sorted(versions) == sorted([f"a{i}-1" for i in range(5)] + ["a2-2", "b0-1"]), versions
        assert sorted(_outputs(s3, out, ticked[0])) == ["a2-2", "b0-1"]
        # Indexed by their source as any job (S3BatchSource, and the workflow's own S3BatchStatus).
        query = f"S3BatchSource = '{src}/in/' AND S3BatchStatus = 'succeeded'"
        await wait_for(lambda: _ids(client, query, set(done)), 30, "the runs indexed by source and status")
    finally:
        assert (await run("s3batch", "schedule", "delete", name)).code == 0


async def test_backfill_refuses_a_window_without_ticks_and_bad_windows(client: Client, task_queue: str):
    name = f"bf-bad-{uuid.uuid4().hex[:6]}"
    job = {"bucket": "src-bf-bad", "output_bucket": "out-bf-bad"}
    created = await run(
        "s3batch", "schedule", "create", name, "--every", "1h", "--task-queue", task_queue, "--paused",
        "--input", json.dumps(job),
    )
    assert created.code == 0, created.stderr
    try:
        # An hourly schedule has no tick between 10:05 and 10:55.
        empty = await run("s3batch", "backfill", name, "--start", "2026-11-30T10:05:00Z", "--end", "2026-11-30T10:55")
        assert empty.code == 2, empty
        window = "between 2026-11-30T10:05:00+00:00 and 2026-11-30T10:55:00+00:00"
        assert f"schedule s3batch-{name} has no tick {window}" in empty.stderr, empty.stderr
        assert "nothing was started" in empty.stderr, empty.stderr

        garbled = await run("s3batch", "backfill", name, "--start", "yesterday", "--end", "2026-11-30T10:55:00Z")
        assert garbled.code == 2 and "--start 'yesterday'" in garbled.stderr and "ISO 8601" in garbled.stderr, garbled

        backwards = await run("s3batch", "backfill", name, "--start", "2026-11-30T12:00:00Z", "--end", "2026-11-30")
        assert backwards.code == 2, backwards
        assert "--start 2026-11-30T12:00:00+00:00 must be earlier than --end 2026-11-30T00:00:00+00:00" in (
            backwards.stderr
        ), backwards.stderr

        future = datetime.datetime.now(datetime.UTC).replace(microsecond=0) + datetime.timedelta(hours=3)
        ahead = await run("s3batch", "backfill", name, "--start", "2026-11-30", "--end", _at(future))
        assert ahead.code == 2 and f"--end {future.isoformat()} is in the future" in ahead.stderr, ahead

        missing = await run("s3batch", "backfill", f"{name}-nope", "--start", "2026-11-30", "--end", "2026-12-01")
        assert missing.code == 6 and f"no schedule s3batch-{name}-nope" in missing.stderr, missing
        for result in (empty, garbled, backwards, ahead, missing):
            assert "Traceback" not in result.stderr
        started = [wf async for wf in client.list_workflows(f"WorkflowId STARTS_WITH 's3batch-schedule-{name}-'")]
        assert started == []
    finally:
        assert (await run("s3batch", "schedule", "delete", name)).code == 0


async def test_backfill_refuses_ticks_that_already_ran(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets: tuple[str, str]
):
    """A tick runs once: its workflow ID names its output prefix and the ledger's last run, so a second
    run of it would overwrite the first one's report and leave the ledger unadvanced (its files done
    again by the next run). A backfill over a window holding a tick that ran is refused, naming it."""
    src, out = buckets
    put_files(s3, src, {"in/a.jsonl": b'{"v": "a"}\n'})
    name = f"bf-again-{uuid.uuid4().hex[:6]}"
    job = {"bucket": src, "prefix": "in/", "output_bucket": out, "output_prefix": "o/", "handler": "passthrough"}
    created = await run(
        "s3batch", "schedule", "create", name, "--every", f"{EVERY}s", "--task-queue", task_queue, "--paused",
        "--input", json.dumps(job),
    )
    assert created.code == 0, created.stderr
    runs_prefix = f"s3batch-schedule-{name}-"
    try:
        base = datetime.datetime.now(datetime.UTC).replace(microsecond=0) - datetime.timedelta(hours=2)
        base -= datetime.timedelta(seconds=base.timestamp() % EVERY)
        first = await run("s3batch", "backfill", name, "--start", _at(base + datetime.timedelta(seconds=5)),
                          "--end", _at(base + datetime.timedelta(seconds=EVERY + 5)))
        assert first.code == 0, first.stderr
        ran = f"{runs_prefix}{_at(base + datetime.timedelta(seconds=EVERY))}"
        assert (await wait_for(lambda: _at_least(client, runs_prefix, 1), 60, "the backfilled run")) == {
            ran: WorkflowExecutionStatus.COMPLETED
        }
        report = s3.get_object(Bucket=out, Key=f"{run_output_prefix('o/', ran)}_report.json")["Body"].read()

        again = await run("s3batch", "backfill", name, "--start", _at(base + datetime.timedelta(seconds=5)),
                          "--end", _at(base + datetime.timedelta(seconds=2 * EVERY + 5)))
        assert again.code == 3, again
        assert f"already ran: {ran}" in again.stderr and "nothing was started" in again.stderr, again.stderr
        await asyncio.sleep(3)  # what a second run of the tick would have had to start
        executions = [wf async for wf in client.list_workflows(f"WorkflowId STARTS_WITH '{runs_prefix}'")]
        assert [wf.id for wf in executions] == [ran]
        assert s3.get_object(Bucket=out, Key=f"{run_output_prefix('o/', ran)}_report.json")["Body"].read() == report
    finally:
        assert (await run("s3batch", "schedule", "delete", name)).code == 0

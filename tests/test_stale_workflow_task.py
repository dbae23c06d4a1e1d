"""A workflow task held by a frozen worker, then answered after its run ended elsewhere, changes nothing.

The soak found this interleaving (with a change that ran the report and the ledger as local activities, not
landed): a run's first workflow task went to a worker as it was frozen; the server timed the task out and
another worker ran the run to its end; 17 s later the frozen worker woke and carried on with its stale task.
A stale task can only propose commands, which the server refuses, as long as nothing the workflow does
inside a task writes: a local activity runs in the worker, with no server round trip, so a stale task's
local activities would all run (there, an empty listing, then an empty report over the run's real one and
the ledger rewritten). This test makes the interleaving happen for certain, on an incremental job's second
run (where a stale listing finds nothing new: the other worker's ledger has it all), and checks that the
report and the ledger are untouched after the frozen worker wakes. With the short steps as local activities
(that change, on a branch) it fails: the woken worker writes the run's report again, the run long ended.

The frozen worker is ``tests/stale_task_worker.py``: workflow tasks only, one poll, no cache. Frozen while its
poll waits at the server, it is handed the run's first workflow task (the only worker polling) and holds it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from s3batch.dev.workers import WorkerProcess
from s3batch.incremental import Incremental
from s3batch.models import S3BatchInput
from tests.helpers import wait_for
from tests.helpers.history import history_events
from tests.helpers.jobs import execute, start
from tests.helpers.output import report
from tests.helpers.workers import ROOT


def _snapshot(s3: Any, bucket: str, key: str) -> tuple[str, bytes]:
    got = s3.get_object(Bucket=bucket, Key=key)
    return got["ETag"], got["Body"].read()


async def test_a_stale_first_workflow_task_answered_after_its_run_ended_changes_nothing(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, tmp_path: Path, workers: Any
) -> None:
    src, out = buckets
    for i in range(3):
        s3.put_object(Bucket=src, Key=f"in/a{i}.csv", Body=b"id,name\r\n%d,a\r\n" % i)
    job = S3BatchInput(bucket=src, prefix="in/", output_bucket=out, output_prefix="o/", incremental=Incremental())
    first = workers("first")
    r1 = await execute(client, task_queue, job, "stale-r1")
    assert r1.status == "succeeded" and r1.totals.files_succeeded == 3, r1
    assert first.terminate() == 0

    stale = WorkerProcess(
        task_queue, tmp_path, "stale", script=ROOT / "tests" / "stale_task_worker.py", cwd=ROOT,
        env={"S3BATCH_HANDLER_MODULES": "tests.fault_handlers"},
    )
    try:
        await asyncio.to_thread(stale.wait_ready)
        await asyncio.sleep(1)  # its one poll reaches the server
        stale.pause()
        for i in range(2):
            s3.put_object(Bucket=src, Key=f"in/b{i}.csv", Body=b"id,name\r\n%d,b\r\n" % i)
        handle = await start(client, task_queue, job, "stale-r2")
        wid = handle.id

        async def held() -> bool:
            events = await history_events(client, wid)
            return any(e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED for e in events)

        await wait_for(held, 30, "the frozen worker holding the run's first workflow task")
        workers("other")
        r2 = await handle.result()  # after the held task's timeout (10 s), on the other worker
        assert r2.status == "succeeded" and r2.totals.files_succeeded == 2, r2
        events = await history_events(client, wid)
        assert any(e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT for e in events)
        report_at = r2.report_key
        ledger_at = "o/ledger/ledger.json"
        before = _snapshot(s3, out, report_at), _snapshot(s3, out, ledger_at)
    finally:
        stale.unpause()
    # The stale task is answered within a second or two; whatever it ran would have written by now.
    await asyncio.sleep(5)
    assert stale.proc.poll() is None, stale.log()[-2000:]
    assert (_snapshot(s3, out, report_at), _snapshot(s3, out, ledger_at)) == before
    run_prefix = report_at.removesuffix("_report.json")
    assert sorted(f["key"] for f in report(s3, out, run_prefix)["files"]) == ["in/b0.csv", "in/b1.csv"]
    stale.terminate()

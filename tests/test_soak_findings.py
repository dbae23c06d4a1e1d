"""What the soak found (issue 34: ``make soak``, ``scripts/soak``), each pinned by a small deterministic test.

1. A short activity (the job's check, a listing page, a report segment, the report, an incremental job's ledger)
   running on a worker that died held its job for its whole 5-minute start-to-close timeout: nothing noticed the
   worker was gone (seed 1: a job stuck in ``check_job`` 5 minutes after a SIGKILL). They now heartbeat while
   they run (``activities/boundary.keep_alive``), given the job's heartbeat timeout (patch
   ``short-activities-heartbeat``).
2. An incremental run whose ledger PUT landed but whose answer was lost (a connection reset) failed: botocore
   sent the conditional PUT again, it found the ledger that very write had made (412), and the run failed with
   ``SourceChanged`` although its report said ``succeeded`` and the ledger had recorded it (seed 1, a proxy
   resetting PUTs). The run now sees that the ledger is its own.
3. ``s3batch redrive`` (``client.prepare_redrive``) of a job over a manifest crashed with pydantic's
   ``ValidationError`` (the redrive's input, ``only_failed_of`` with a ``manifest``, is refused by the contract): a
   cancelled manifest job of the soak could not be redriven. It now says that a manifest job is not redriven and
   what to do instead (``NothingToRedrive``, exit 3, as a redrive of its rejected records already did).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from s3batch.activities.boundary import boundary
from s3batch.workflows.batch import S3BatchWorkflow
from temporalio.client import Client, WorkflowFailureError
from temporalio.testing import ActivityEnvironment
from temporalio.worker import Worker

from s3batch import client as api
from s3batch.dev.faultproxy import FaultProxy, Rule
from s3batch.dev.stack import Stack
from s3batch.models import S3BatchInput
from tests.helpers import wait_for
from tests.helpers.data import make_csv, put_files
from tests.helpers.jobs import new_id
from tests.helpers.output import read_jsonl


def test_a_short_activity_heartbeats_while_it_runs_when_given_a_heartbeat_timeout() -> None:
    env = ActivityEnvironment()
    beats: list[tuple[Any, ...]] = []
    env.on_heartbeat = lambda *details: beats.append(details)

    @boundary(keepalive=True)
    def short() -> str:
        time.sleep(1.0)
        return "done"

    assert env.run(short) == "done"
    assert beats == [], "no heartbeat timeout, no heartbeat (a job started before the patch)"
    env.info = dataclasses.replace(env.info, heartbeat_timeout=timedelta(seconds=0.4))
    assert env.run(short) == "done"
    assert len(beats) >= 2, beats  # every 0.2 s (at least) for 1 s


async def test_a_check_whose_worker_was_killed_is_retried_after_the_heartbeat_timeout(
    stack: Stack, client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, workers: Any
) -> None:
    src, out = buckets
    s3.put_object(Bucket=src, Key="in/a.csv", Body=make_csv(10))
    with FaultProxy(stack.config.s3_port) as proxy:
        # The check's first request, the LIST of the source prefix, is held: the check is in flight, on worker a.
        held = proxy.add(Rule("delay", method="GET", path=rf"^/{src}\?.*list-type=2", times=1, delay=120))
        a = workers("a", AWS_ENDPOINT_URL_S3=proxy.url)
        spec = S3BatchInput(bucket=src, prefix="in/", output_bucket=out, output_prefix="o/",
                            heartbeat_timeout_seconds=3)
        handle = await client.start_workflow(S3BatchWorkflow.run, spec, id=new_id("killcheck"), task_queue=task_queue)
        await wait_for(lambda: held.fired == 1, 60, "the check's LIST held by the proxy")
        a.kill()
        killed = time.monotonic()
        workers("b")
        result = await asyncio.wait_for(handle.result(), 90)
    took = time.monotonic() - killed
    assert result.status == "succeeded"
    assert len(read_jsonl(s3, out, "o/in/a.csv/")) == 10
    # Before: the check stayed "started" on the dead worker for its 5-minute start-to-close timeout.
    assert took < 60, f"the job ended {took:.0f} s after its check's worker was killed"


async def test_an_incremental_run_whose_ledger_write_answer_was_lost_succeeds(
    stack: Stack, client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, workers: Any, tmp_path: Path
) -> None:
    src, out = buckets
    put_files(s3, src, {f"in/f{i}.jsonl": f'{{"v": {i}}}\n'.encode() for i in range(3)})
    spec = S3BatchInput.model_validate({"bucket": src, "prefix": "in/", "output_bucket": out, "output_prefix": "inc/",
                                        "incremental": {}})
    with FaultProxy(stack.config.s3_port) as proxy:
        # The ledger's PUT reaches S3, then its connection is reset before the answer: botocore sends it again.
        lost = proxy.add(Rule("reset", method="PUT", path=r"/inc/ledger/ledger\.json$", times=1))
        workers("a", AWS_ENDPOINT_URL_S3=proxy.url)
        first = new_id("ledger-lost")
        result = await client.execute_workflow(S3BatchWorkflow.run, spec, id=first, task_queue=task_queue)
        puts = [e.status for e in proxy.entries("PUT", r"/inc/ledger/ledger\.json$")]
        assert lost.fired == 1
        assert puts == [None, 412], puts  # the write, its answer lost; botocore's retry, refused by its own ledger
        assert result.status == "succeeded"  # before: failed with SourceChanged
        ledger = json.loads(s3.get_object(Bucket=out, Key="inc/ledger/ledger.json")["Body"].read())
        assert ledger["last_run"] == first
        next_id = new_id("ledger-next")
        again = await client.execute_workflow(S3BatchWorkflow.run, spec, id=next_id, task_queue=task_queue)
    assert again.totals.files_listed == 0, "the next run finds every file recorded"


async def test_a_manifest_job_is_not_redriven_and_says_so(
    client: Client, worker: Worker, s3: Any, buckets: tuple[str, str], task_queue: str
) -> None:
    src, out = buckets
    s3.put_object(Bucket=src, Key="in/a.csv", Body=make_csv(5))
    s3.put_object(Bucket=src, Key="lists/today.csv", Body=f"{src},in/a.csv\n{src},in/gone.csv\n".encode())
    spec = S3BatchInput.model_validate({"manifest": f"s3://{src}/lists/today.csv", "output_bucket": out,
                                        "output_prefix": "m/"})
    job_id = new_id("manifest-redrive")
    with pytest.raises(WorkflowFailureError):  # in/gone.csv failed (NotFound), over max_failed_files 0
        await client.execute_workflow(S3BatchWorkflow.run, spec, id=job_id, task_queue=task_queue)
    with pytest.raises(api.NothingToRedrive, match=r"took its files from the manifest s3://.*/lists/today\.csv"):
        await api.prepare_redrive(client, job_id)  # before: pydantic's ValidationError

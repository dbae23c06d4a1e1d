"""The work-around of the SDK's legacy-query hazard (:mod:`s3batch.sdk_workarounds`): a worker evicts a run once it
has answered a legacy query of it, so its next workflow task rebuilds the run from the history alone.

The hazard itself (a takeover's query applying a file's completion no workflow task has handled, then a history a
replay cannot repeat) needs a query to land between two completions during a takeover: with random timings around
that case it struck about one job in eleven without the work-around (docs/explanation/guarantees.md); here, the
mechanism: which activations are legacy queries, and the eviction after one, on a real server.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from temporalio.bridge.proto.workflow_activation import WorkflowActivation
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.worker import Worker

import tests.slow_handlers  # noqa: F401 - registers slow_passthrough (50 ms a chunk)
from s3batch.dev.sample_data import customers_csv, upload_chunks
from s3batch.messages import Progress
from s3batch.models import S3BatchInput
from s3batch.sdk_workarounds import LEGACY_QUERY_ID, evict_after_legacy_queries, is_legacy_query
from tests.helpers import wait_for


def activation(*query_ids: str, resolve: bool = False) -> WorkflowActivation:
    act = WorkflowActivation(run_id="r")
    for query_id in query_ids:
        act.jobs.add().query_workflow.query_id = query_id
    if resolve:
        act.jobs.add().resolve_activity.seq = 1
    return act


def test_only_a_legacy_query_task_counts() -> None:
    assert is_legacy_query(activation(LEGACY_QUERY_ID))
    assert not is_legacy_query(activation("q-1"))  # a query sent with a workflow task: the run is the worker's
    assert not is_legacy_query(activation(resolve=True))
    assert not is_legacy_query(activation())


def test_the_patch_is_in_place_once() -> None:
    from temporalio.worker import _workflow

    assert evict_after_legacy_queries() and evict_after_legacy_queries()
    patched = _workflow._WorkflowWorker._handle_activation
    assert evict_after_legacy_queries() and _workflow._WorkflowWorker._handle_activation is patched


def test_an_sdk_without_the_method_is_left_alone_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from temporalio.worker import _workflow

    class Other:  # another SDK's workflow worker: no _handle_activation
        pass

    monkeypatch.setattr(_workflow, "_WorkflowWorker", Other)
    with caplog.at_level(logging.WARNING, logger="s3batch.sdk_workarounds"):
        assert evict_after_legacy_queries() is False
    assert not hasattr(Other, "_handle_activation")
    assert "_WorkflowWorker._handle_activation" in caplog.text and "not worked around" in caplog.text


async def test_the_wrapper_evicts_after_a_legacy_query_only_and_survives_a_failed_eviction(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from temporalio.worker import _workflow

    handled: list[str] = []
    evicted: list[str] = []

    class Core:
        fail = False

        def request_workflow_eviction(self, run_id: str) -> None:
            if self.fail:
                raise RuntimeError("core is gone")
            evicted.append(run_id)

    class SdkWorker:  # stands for the SDK's workflow worker: the wrapper calls its method, then the core
        core = Core()

        def _bridge_worker(self) -> Core:
            return self.core

        async def _handle_activation(self, act: WorkflowActivation) -> None:
            handled.append(act.run_id)

    monkeypatch.setattr(_workflow, "_WorkflowWorker", SdkWorker)
    assert evict_after_legacy_queries()
    worker = SdkWorker()
    await worker._handle_activation(activation("q-1"))
    await worker._handle_activation(activation(resolve=True))
    assert handled == ["r", "r"] and evicted == []
    await worker._handle_activation(activation(LEGACY_QUERY_ID))
    assert handled == ["r"] * 3 and evicted == ["r"]
    SdkWorker.core.fail = True
    with caplog.at_level(logging.WARNING, logger="s3batch.sdk_workarounds"):
        await worker._handle_activation(activation(LEGACY_QUERY_ID))
    assert handled == ["r"] * 4 and "could not evict run r after a legacy query: core is gone" in caplog.text


def running_workflows(worker: Worker) -> dict[str, Any]:
    return worker._workflow_worker._running_workflows  # type: ignore[union-attr]


async def test_a_run_rebuilt_to_answer_a_legacy_query_is_evicted_then_runs_on(
    client: Client, s3: Any, buckets: tuple[str, str]
) -> None:
    src, out = buckets
    upload_chunks(s3, src, "in/a.csv", customers_csv(8_000, seed=4))
    queue = f"tq-legacy-{uuid.uuid4().hex[:8]}"
    job = S3BatchInput(
        bucket=src, prefix="in/", output_bucket=out, output_prefix="o/", handler="slow_passthrough",
        chunk_records=50, heartbeat_timeout_seconds=5,
    )

    def worker() -> Worker:
        return Worker(client, task_queue=queue, max_concurrent_activities=4, activity_executor=ThreadPoolExecutor(4))

    # A worker takes the job's first workflow task, then goes away with the run in its cache (the file's activity
    # goes on elsewhere once B polls: 160 chunks of 50 ms).
    async with worker() as a:
        handle = await client.start_workflow("S3BatchWorkflow", job, id=f"legacy-{uuid.uuid4().hex[:8]}",
                                             task_queue=queue)
        await wait_for(lambda: handle.result_run_id in running_workflows(a), 30, "the run cached on A")
    # B has not got the run: the query comes to it as a legacy query (its sticky worker is gone), B rebuilds the
    # run to answer it, then evicts it.
    async with worker() as b:
        answer = await handle.query("progress", result_type=Progress)
        assert answer.files_in_flight == 1
        await wait_for(lambda: handle.result_run_id not in running_workflows(b), 3, "the run evicted from B")
        # Evicted for the query, not for its end (a run that ends leaves the cache too).
        assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
        # The job runs on: its next workflow task rebuilds the run from the history.
        result = await asyncio.wait_for(handle.result(), 120)
    assert result["status"] == "succeeded" and result["totals"]["records_written"] == 8_000

"""``S3BatchPlugin`` on a worker of your own gets what ``s3batch-worker`` gets (issue 10, step 2), and a
running file hears of a cancellation within seconds, not after the SDK's 24 s heartbeat throttle
(issue 12, point 4)."""

from __future__ import annotations

import base64
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest
from s3batch.workflows.batch import S3BatchWorkflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import CancelledError
from temporalio.worker import Worker

import tests.slow_handlers  # noqa: F401 - registers slow_passthrough for the in-process workers
from s3batch import layout
from s3batch.codec import ENCODING
from s3batch.config import Settings
from s3batch.dev.stack import Stack
from s3batch.messages import S3BatchResult
from s3batch.models import S3BatchInput
from s3batch.plugin import DEFAULT_HEARTBEAT_THROTTLE, S3BatchPlugin
from s3batch.s3io import make_client
from tests.helpers import wait_for
from tests.helpers.data import make_csv
from tests.helpers.history import history_events
from tests.helpers.output import has_part, report

KEY = bytes(range(32))


def test_the_plugin_reads_no_environment_unless_given_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("S3BATCH_ENCRYPTION_KEY", base64.b64encode(KEY).decode())
    monkeypatch.setenv("S3BATCH_MAX_CHUNK_RECORDS", "5")
    monkeypatch.setenv("S3BATCH_HEARTBEAT_THROTTLE_SECONDS", "7")
    plain = S3BatchPlugin()
    assert plain.codec is None
    assert plain.settings.max_chunk_records == Settings.explicit().max_chunk_records == 1_000_000
    assert plain.heartbeat_throttle == DEFAULT_HEARTBEAT_THROTTLE == timedelta(seconds=2)
    configured = S3BatchPlugin.from_settings(Settings())
    assert configured.codec is not None and configured.codec.strict
    assert configured.settings.max_chunk_records == 5
    assert configured.heartbeat_throttle == timedelta(seconds=7)


async def test_a_worker_of_your_own_gets_converter_codec_pool_throttle_and_search_attributes(
    stack: Stack, s3: Any, buckets: tuple[str, str], task_queue: str
) -> None:
    src, out = buckets
    s3.put_object(Bucket=src, Key="in/a.csv", Body=make_csv(50))
    # The worker's client knows nothing of s3batch: everything comes from the worker's plugin.
    bare = await Client.connect(stack.config.temporal_address)
    plugin = S3BatchPlugin(make_client(), encryption_key=KEY)
    worker = Worker(bare, task_queue=task_queue, plugins=[plugin], max_concurrent_activities=3)
    config = worker.config(active_config=True)
    executor = config.get("activity_executor")
    assert isinstance(executor, ThreadPoolExecutor) and executor._max_workers == 3
    assert config.get("max_heartbeat_throttle_interval") == timedelta(seconds=2)
    assert config.get("default_heartbeat_throttle_interval") == timedelta(seconds=2)
    assert worker.client.data_converter.payload_codec is plugin.codec
    assert bare.data_converter.payload_codec is None  # the user's own client is left as it was

    starter = await Client.connect(stack.config.temporal_address, plugins=[S3BatchPlugin(encryption_key=KEY)])
    job = S3BatchInput(bucket=src, prefix="in/", output_bucket=out, output_prefix="o/")
    wid = f"own-worker-{uuid.uuid4().hex[:8]}"
    async with worker:
        result = await starter.execute_workflow(
            S3BatchWorkflow.run, job, id=wid, task_queue=task_queue, result_type=S3BatchResult
        )
        assert plugin.s3_activities.search_attributes_registered
    assert result.status == "succeeded" and result.totals.records_written == 50
    # The result was encoded by the worker: with the plugin's codec, although its client had none.
    events = await history_events(starter, wid)
    [done] = [e for e in events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED]
    [payload] = done.workflow_execution_completed_event_attributes.result.payloads
    assert payload.metadata["encoding"] == ENCODING
    assert executor._shutdown  # the pool the plugin made stopped with its worker


async def test_a_cancel_reaches_a_running_file_within_seconds(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str
) -> None:
    """With the SDK's throttle (80 % of the 30 s heartbeat timeout) the cancellation would reach the
    file with its next heartbeat, about 24 s after the previous one; the plugin's 2 s bring it within
    a few seconds. The bound is loose on purpose (a loaded machine); scripts/bench.py measures it."""
    src, out = buckets
    s3.put_object(Bucket=src, Key="in/big.csv", Body=make_csv(20_000))
    # 10-record chunks at 50 ms each: the file would run for 100 s.
    job = S3BatchInput(
        bucket=src,
        prefix="in/",
        output_bucket=out,
        output_prefix="o/",
        handler="slow_passthrough",
        chunk_records=10,
        heartbeat_timeout_seconds=30,
    )
    # No throttle given: the worker gets the plugin's (from the client's plugins).
    worker = Worker(client, task_queue=task_queue, max_concurrent_activities=2)
    async with worker:
        handle = await client.start_workflow(
            S3BatchWorkflow.run, job, id=f"cancel-fast-{uuid.uuid4().hex[:8]}", task_queue=task_queue
        )
        # The file runs and has sent its first heartbeat (sent at once; the next ones are throttled).
        await wait_for(lambda: has_part(s3, out, layout.file_dir("o/", "in/big.csv")), 60, "a first committed part")

        async def heartbeat_time() -> Any:
            pending = (await handle.describe()).raw_description.pending_activities
            return pending[0].last_heartbeat_time.ToDatetime() if pending else None

        first = await wait_for(heartbeat_time, 30, "a heartbeat on the server")

        async def newer() -> bool:
            seen = await heartbeat_time()
            return seen is not None and seen > first

        # Progress: the server holds a newer heartbeat within seconds (the SDK's throttle: 24 s).
        await wait_for(newer, 12, "a newer heartbeat on the server")
        cancelled_at = time.monotonic()
        await handle.cancel()
        with pytest.raises(WorkflowFailureError) as failure:
            await handle.result()
        latency = time.monotonic() - cancelled_at
    assert isinstance(failure.value.cause, CancelledError)
    assert latency < 12, f"the cancellation took {latency:.1f} s to stop the file and write the report"
    rep = report(s3, out)
    assert rep["status"] == "cancelled" and [f["status"] for f in rep["files"]] == ["cancelled"]

"""Encryption end to end, against the real Temporal dev server and SeaweedFS: with a key, what the
server stores of a failed file and a failed job names no bucket, prefix or key (failure messages and
stack traces are encrypted too) while a client with the key reads the same failures as without
encryption; keys rotate under running jobs; a job whose payloads cannot be decoded fails at once,
clearly, instead of retrying its workflow task forever."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from s3batch.workflows.batch import S3BatchWorkflow
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import (
    DataConverter,
    DefaultFailureConverter,
    DefaultFailureConverterWithEncodedAttributes,
    PayloadCodec,
)
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker

from s3batch.codec import PLAINTEXT_REFUSED, UNKNOWN_KEY, EncryptionCodec, key_id
from s3batch.codec_server import CodecServer, ServerConfig
from s3batch.converter import data_converter
from s3batch.dev.stack import Stack, StackConfig
from s3batch.messages import S3BatchResult
from s3batch.models import S3BatchInput
from s3batch.plugin import S3BatchPlugin
from s3batch.s3io import make_client
from scripts.ui_screenshot import chromium
from tests.helpers import BIN
from tests.helpers.jobs import job_error

ROOT = Path(__file__).resolve().parent.parent

KEY = os.urandom(32)
ENCRYPTED = base64.b64encode(b"binary/encrypted").decode()  # how it shows in protobuf JSON
OLD_KEY = os.urandom(32)


async def keyed(stack: Stack, keys: Any = KEY) -> Client:
    plugin = S3BatchPlugin(make_client(), encryption_key=keys)
    return await Client.connect(stack.config.temporal_address, plugins=[plugin])


def new_worker(client: Client, task_queue: str) -> Worker:
    return Worker(client, task_queue=task_queue, max_concurrent_activities=4, activity_executor=ThreadPoolExecutor(4))


async def raw_history(stack: Stack, workflow_id: str) -> tuple[str, list[Any]]:
    """The history as a client without the key (no plugin, no codec) sees it: JSON and events."""
    bare = await Client.connect(stack.config.temporal_address)
    history = await bare.get_workflow_handle(workflow_id).fetch_history()
    return history.to_json(), list(history.events)


def failures(events: list[Any]) -> list[Any]:
    """Every failure stored in the history, causes included."""
    found = []
    for event in events:
        for attrs in (
            event.activity_task_failed_event_attributes,
            event.workflow_execution_failed_event_attributes,
            event.workflow_task_failed_event_attributes,
        ):
            failure = attrs.failure if attrs.HasField("failure") else None
            while failure is not None:
                found.append(failure)
                failure = failure.cause if failure.HasField("cause") else None
    return found


def test_the_failure_converter_encodes_messages_only_with_a_key() -> None:
    assert data_converter(None, None).failure_converter_class is DefaultFailureConverter
    codec = S3BatchPlugin(encryption_key=KEY).codec
    assert data_converter(None, codec).failure_converter_class is DefaultFailureConverterWithEncodedAttributes

    class Custom(DefaultFailureConverter):
        pass

    # A failure converter of the user's that would leave messages in plain text is refused, not kept.
    with pytest.raises(ValueError, match="leaves failure messages in plain text"):
        data_converter(DataConverter(failure_converter_class=Custom), codec)
    assert data_converter(DataConverter(failure_converter_class=Custom), None).failure_converter_class is Custom


async def test_failed_files_and_jobs_reach_the_server_encrypted(
    stack: Stack, s3: Any, buckets: tuple[str, str]
) -> None:
    src, out = buckets
    tag = uuid.uuid4().hex[:8]
    prefix = f"secret-prefix-{tag}/"
    bad_key = f"{prefix}secret-file-{tag}.csv"
    s3.put_object(Bucket=src, Key=bad_key, Body=b"\xff\xfename,city\n1,2\n")  # a header that is not UTF-8
    s3.put_object(Bucket=src, Key=f"{prefix}fine-{tag}.jsonl", Body=b'{"a": 1}\n')
    missing = f"secret-missing-{tag}"
    secrets = [src, out, prefix, f"secret-file-{tag}", f"secret-out-{tag}", missing]

    client = await keyed(stack)
    task_queue = f"tq-{uuid.uuid4().hex[:8]}"
    file_job, bucket_job = f"enc-fail-{tag}", f"enc-missing-{tag}"
    async with new_worker(client, task_queue):
        with pytest.raises(WorkflowFailureError) as failed_file:
            await client.execute_workflow(
                S3BatchWorkflow.run,
                S3BatchInput(bucket=src, prefix=prefix, output_bucket=out, output_prefix=f"secret-out-{tag}/"),
                id=file_job,
                task_queue=task_queue,
            )
        with pytest.raises(WorkflowFailureError) as failed_job:
            await client.execute_workflow(
                S3BatchWorkflow.run,
                S3BatchInput(bucket=missing, output_bucket=out, output_prefix=f"secret-out-{tag}/"),
                id=bucket_job,
                task_queue=task_queue,
            )

    # With the key, the failures read as they always did: type and message.
    cause = failed_file.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "JobFailed", cause
    assert "1 of 2 files failed" in cause.message and f"s3://{out}/secret-out-{tag}/" in cause.message
    cause = job_error(failed_job.value)
    assert cause.type == "NotFound" and f"s3://{missing}" in cause.message

    for job_id, top_type in ((file_job, "JobFailed"), (bucket_job, None)):
        raw, events = await raw_history(stack, job_id)
        for secret in secrets:
            assert secret not in raw, f"{secret!r} in the history of {job_id} read without the key"
        stored = failures(events)
        assert stored, f"no failure in the history of {job_id}"
        # What stays visible: the placeholder message, the types, no stack trace.
        for failure in stored:
            assert failure.message == "Encoded failure" and failure.stack_trace == "", failure
            assert failure.encoded_attributes.metadata["encoding"] == b"binary/encrypted"
        [closed] = [e for e in events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED]
        top = closed.workflow_execution_failed_event_attributes.failure
        if top_type:
            assert top.application_failure_info.type == top_type
        else:
            # The check is a local activity: its error is the job's failure itself.
            assert top.application_failure_info.type == "NotFound", top

    _, events = await raw_history(stack, file_job)
    # The activities' summaries (the Web UI's labels: the file's key) are payloads, encrypted too.
    summaries = [
        e.user_metadata.summary
        for e in events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED and e.HasField("user_metadata")
    ]
    assert summaries and all(p.metadata["encoding"] == b"binary/encrypted" for p in summaries)

    # The failed file's error decodes with the key: its key and the reason (it is recorded in the
    # activity's result, or in its failure if the activity failed).
    activity_failures = [
        e.activity_task_failed_event_attributes.failure
        for e in events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED
    ]
    decoded = [await client.data_converter.decode_failure(f) for f in activity_failures]
    reported = [str(err) for err in decoded] + [await file_result_error(client, file_job)]
    assert any(f"secret-file-{tag}.csv" in text and "UTF-8" in text for text in reported), reported


async def file_result_error(client: Client, job_id: str) -> str:
    """The failed file's error as the job recorded it (in an activity result: a payload)."""
    history = await client.get_workflow_handle(job_id).fetch_history()
    texts = []
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            result = event.activity_task_completed_event_attributes.result
            texts.extend(str(v) for v in await client.data_converter.decode(list(result.payloads)))
    return "\n".join(texts)


async def test_keys_rotate_under_a_running_job(stack: Stack, s3: Any, buckets: tuple[str, str]) -> None:
    src, out = buckets
    s3.put_object(Bucket=src, Key="a.jsonl", Body=b'{"a": 1}\n{"a": 2}\n')
    old_client = await keyed(stack, OLD_KEY)
    task_queue = f"tq-{uuid.uuid4().hex[:8]}"
    job_id = f"enc-rotate-{uuid.uuid4().hex[:8]}"
    # Started by a client that still has only the old key; run by workers that have the new one
    # first and still know the old one.
    await old_client.start_workflow(
        S3BatchWorkflow.run, S3BatchInput(bucket=src, output_bucket=out), id=job_id, task_queue=task_queue
    )
    rotated = await keyed(stack, [KEY, OLD_KEY])
    async with new_worker(rotated, task_queue):
        result = await rotated.get_workflow_handle(job_id, result_type=S3BatchResult).result()
    assert result.totals.records_written == 2
    _, events = await raw_history(stack, job_id)
    ids = {
        p.metadata["encryption-key-id"]
        for e in events
        for p in [
            *e.workflow_execution_started_event_attributes.input.payloads,
            *e.activity_task_scheduled_event_attributes.input.payloads,
        ]
    }
    assert ids == {key_id(OLD_KEY), key_id(KEY)}


async def wait_closed(client: Client, job_id: str, timeout: float = 30) -> list[Any]:
    """Events of a job once it closed; a failed workflow task (which the server retries forever)
    fails the test at once."""
    deadline = time.monotonic() + timeout
    while True:
        _, events = await raw_history_of(client, job_id)
        task_failures = [e for e in events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED]
        if task_failures:
            await client.get_workflow_handle(job_id).terminate("test: workflow task failed")
            raise AssertionError(f"{job_id}: its workflow task fails and would be retried forever")
        if any(e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED for e in events):
            return events
        assert time.monotonic() < deadline, f"{job_id} did not fail in {timeout} s"
        await asyncio.sleep(0.2)


async def raw_history_of(client: Client, job_id: str) -> tuple[str, list[Any]]:
    history = await client.get_workflow_handle(job_id).fetch_history()
    return history.to_json(), list(history.events)


async def test_a_job_whose_payloads_cannot_be_decoded_fails_clearly(stack: Stack, buckets: tuple[str, str]) -> None:
    src, out = buckets
    client = await keyed(stack)
    task_queue = f"tq-{uuid.uuid4().hex[:8]}"
    bare = await Client.connect(stack.config.temporal_address)
    other = await keyed(stack, OLD_KEY)
    job = {"bucket": src, "output_bucket": out}
    plain_job, other_key_job = f"enc-plain-{uuid.uuid4().hex[:8]}", f"enc-other-{uuid.uuid4().hex[:8]}"
    async with new_worker(client, task_queue):
        # Started without the key (e.g. the temporal CLI without the codec server): refused.
        await bare.start_workflow("S3BatchWorkflow", job, id=plain_job, task_queue=task_queue)
        # Started with a key these workers do not have.
        await other.start_workflow("S3BatchWorkflow", job, id=other_key_job, task_queue=task_queue)
        for job_id in (plain_job, other_key_job):
            events = await wait_closed(bare, job_id)
            assert not [e for e in events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED]

    with pytest.raises(WorkflowFailureError) as err:
        await client.get_workflow_handle(plain_job).result()
    cause = err.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == PLAINTEXT_REFUSED and cause.non_retryable
    assert "json/plain" in cause.message and src not in cause.message

    with pytest.raises(WorkflowFailureError) as err:
        await client.get_workflow_handle(other_key_job).result()
    cause = err.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == UNKNOWN_KEY
    assert key_id(OLD_KEY).decode() in cause.message and key_id(KEY).decode() in cause.message

    # Without the key, the type of the failure is still visible (and the job is FAILED, not hanging).
    raw, _ = await raw_history(stack, other_key_job)
    assert UNKNOWN_KEY in raw and src not in raw


async def test_the_temporal_cli_reads_an_encrypted_job_through_the_codec_server(
    stack: Stack, s3: Any, buckets: tuple[str, str]
) -> None:
    src, out = buckets
    s3.put_object(Bucket=src, Key="cli-secret.jsonl", Body=b'{"a": 1}\n')
    client = await keyed(stack)
    task_queue = f"tq-{uuid.uuid4().hex[:8]}"
    job_id = f"enc-cli-{uuid.uuid4().hex[:8]}"
    async with new_worker(client, task_queue):
        await client.execute_workflow(
            S3BatchWorkflow.run, S3BatchInput(bucket=src, output_bucket=out), id=job_id, task_queue=task_queue
        )
    token = "cli-token-" + uuid.uuid4().hex
    server = CodecServer(("127.0.0.1", 0), EncryptionCodec(KEY), ServerConfig(token=token, timeout=5))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    endpoint = f"http://127.0.0.1:{server.server_port}"
    temporal = [stack.temporal_command()[0], "workflow", "show", "-w", job_id, "-o", "json"]
    temporal += ["--address", stack.config.temporal_address, "--codec-endpoint", endpoint]

    async def show(*extra: str) -> subprocess.CompletedProcess[str]:
        return await asyncio.to_thread(subprocess.run, [*temporal, *extra], capture_output=True, text=True, timeout=60)

    def started_input(shown: str) -> bytes:
        first = json.loads(shown)["events"][0]["workflowExecutionStartedEventAttributes"]
        return base64.b64decode(first["input"]["payloads"][0]["data"])

    try:
        # The CLI sends X-Namespace and the --codec-auth header: the history comes back decoded.
        shown = await show("--codec-auth", f"Bearer {token}")
        assert shown.returncode == 0, shown.stderr
        assert ENCRYPTED not in shown.stdout
        assert json.loads(started_input(shown.stdout))["bucket"] == src
        # Without the token, or with another one, nothing is decoded (the CLI retries, then fails).
        for extra in ([], ["--codec-auth", "Bearer wrong-token-0123456789"]):
            refused = await show("--command-timeout", "3s", *extra)
            assert refused.returncode != 0 and src not in refused.stdout + refused.stderr, (extra, refused.stderr)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def page_text_with(url: str, needle: str, timeout: float) -> str:
    """Open ``url`` in headless Chromium and return the page's HTML once it contains ``needle``
    (or when ``timeout`` has passed)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium(), args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page()
            page.goto(url)
            deadline = time.monotonic() + timeout
            text = ""
            while time.monotonic() < deadline:
                text = page.content()
                if needle in text:
                    break
                page.wait_for_timeout(250)
            return text
        finally:
            browser.close()


@pytest.mark.skipif(chromium() is None, reason="Debian's chromium is not installed here")
async def test_the_web_ui_shows_an_encrypted_job_through_the_codec_server(
    s3: Any, buckets: tuple[str, str], tmp_path: Path
) -> None:
    """The real Web UI of a dev server started with --ui-codec-endpoint, in a real browser: its
    requests (preflight, Origin, X-Namespace) pass the codec server's checks and the page shows the
    decrypted job input; with the UI's origin not allowed, it shows nothing decrypted."""
    src, out = buckets
    s3.put_object(Bucket=src, Key="ui-secret.jsonl", Body=b'{"a": 1}\n')
    config = StackConfig.random_ports(tmp_path)
    codec_config = ServerConfig(token=None, allow_origins=[config.ui_url], timeout=5)
    server = CodecServer(("127.0.0.1", 0), EncryptionCodec(KEY), codec_config)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    command = [*Stack(config).temporal_command(), "--ui-codec-endpoint", f"http://127.0.0.1:{server.server_port}"]
    log = open(tmp_path / "temporal.log", "wb")  # noqa: SIM115 - the child keeps it
    temporal = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path, start_new_session=True)
    log.close()
    try:
        client = None
        deadline = time.monotonic() + 60
        while client is None:
            try:
                plugin = S3BatchPlugin(make_client(), encryption_key=KEY)
                client = await Client.connect(config.temporal_address, plugins=[plugin])
            except RuntimeError:
                assert time.monotonic() < deadline and temporal.poll() is None, "second dev server did not start"
                await asyncio.sleep(0.5)
        task_queue = f"tq-{uuid.uuid4().hex[:8]}"
        job_id = f"enc-ui-{uuid.uuid4().hex[:8]}"
        async with new_worker(client, task_queue):
            handle = await client.start_workflow(
                S3BatchWorkflow.run, S3BatchInput(bucket=src, output_bucket=out), id=job_id, task_queue=task_queue
            )
            await handle.result()
        page = f"{config.ui_url}/namespaces/default/workflows/{job_id}/{handle.result_run_id}/history"
        shown = await asyncio.to_thread(page_text_with, page, src, 60)
        assert src in shown, "the Web UI did not show the decrypted input"
        # The same page, from an origin the codec server does not allow: the UI reports that its
        # codec server failed, and shows nothing decrypted.
        codec_config.allow_origins = frozenset()
        shown = await asyncio.to_thread(page_text_with, page, "data-encoder-status-error", 60)
        assert "Codec Server could not connect" in shown and src not in shown
    finally:
        os.killpg(temporal.pid, signal.SIGTERM)
        temporal.wait(15)
        server.shutdown()
        server.server_close()


class PreRotationCodec(PayloadCodec):
    """Encodes exactly as s3batch did before key rotation (commit c8f4068): no encryption-format, no
    associated data, key ID = sha256(key)[:16]. Only encodes: it plays a client of that release."""

    def __init__(self, key: bytes) -> None:
        self._aead = AESGCM(key)
        self._key_id = hashlib.sha256(key).hexdigest()[:16].encode()

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        out = []
        for p in payloads:
            nonce = os.urandom(12)
            data = nonce + self._aead.encrypt(nonce, p.SerializeToString(), None)
            metadata = {"encoding": b"binary/encrypted", "encryption-key-id": self._key_id}
            out.append(Payload(metadata=metadata, data=data))
        return out

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        raise NotImplementedError


async def test_a_job_started_before_key_rotation_runs_on_the_new_workers(
    stack: Stack, s3: Any, buckets: tuple[str, str]
) -> None:
    src, out = buckets
    s3.put_object(Bucket=src, Key="a.jsonl", Body=b'{"a": 1}\n')
    converter = dataclasses.replace(pydantic_data_converter, payload_codec=PreRotationCodec(KEY))
    old_client = await Client.connect(stack.config.temporal_address, data_converter=converter)
    task_queue = f"tq-{uuid.uuid4().hex[:8]}"
    job_id = f"enc-legacy-{uuid.uuid4().hex[:8]}"
    await old_client.start_workflow(
        S3BatchWorkflow.run, S3BatchInput(bucket=src, output_bucket=out), id=job_id, task_queue=task_queue
    )
    _, events = await raw_history(stack, job_id)
    [legacy] = events[0].workflow_execution_started_event_attributes.input.payloads
    assert "encryption-format" not in legacy.metadata
    client = await keyed(stack)  # strict, new format
    async with new_worker(client, task_queue):
        result = await client.get_workflow_handle(job_id, result_type=S3BatchResult).result()
    assert result.totals.records_written == 1


async def test_a_bad_key_setting_stops_the_worker_and_the_cli_with_one_clear_line(stack: Any, tmp_path: Path) -> None:
    env = {**os.environ, "S3BATCH_ENCRYPTION_KEY": "not-base64-of-32-bytes"}
    cli = subprocess.run(
        [str(BIN / "s3batch"), "status", "some-job"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert cli.returncode == 2, cli
    assert "S3BATCH_ENCRYPTION_KEY" in cli.stderr and "Traceback" not in cli.stderr, cli.stderr
    worker = subprocess.run(
        [sys.executable, str(ROOT / "worker.py")], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert worker.returncode == 1, worker
    assert "encryption settings are not usable" in worker.stderr and "Traceback" not in worker.stderr, worker.stderr

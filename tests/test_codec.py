"""Payload encryption: a job runs with every payload encrypted, the server stores only ciphertext,
and the codec server decrypts for the Web UI."""

from __future__ import annotations

import base64
import json
import os
import threading
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from http.server import ThreadingHTTPServer
from typing import Any

import pytest
from google.protobuf import json_format
from temporalio.api.common.v1 import Payload, Payloads
from temporalio.client import Client
from temporalio.worker import Worker

from s3batch.codec import EncryptionCodec, make_handler, parse_key
from s3batch.devstack import Stack
from s3batch.models import S3BatchInput
from s3batch.plugin import S3BatchPlugin
from s3batch.s3io import make_client
from workflows.batch import S3BatchWorkflow

KEY = os.urandom(32)


def test_key_must_be_32_bytes_of_base64() -> None:
    assert parse_key(base64.b64encode(KEY).decode()) == KEY
    with pytest.raises(ValueError, match="32 bytes"):
        parse_key(base64.b64encode(b"short").decode())
    with pytest.raises(ValueError, match="not valid base64"):
        parse_key("not base64 at all!")


async def test_wrong_key_fails_clearly() -> None:
    encoded = await EncryptionCodec(KEY).encode([])
    assert encoded == []
    [payload] = await EncryptionCodec(KEY).encode([Payload(data=b"x")])
    with pytest.raises(ValueError, match="same S3BATCH_ENCRYPTION_KEY"):
        await EncryptionCodec(os.urandom(32)).decode([payload])


async def test_encrypted_job_and_codec_server(stack: Stack, s3: Any, buckets: tuple[str, str]) -> None:
    src, out = buckets
    key_name = f"secret-project-{uuid.uuid4().hex[:6]}/data.jsonl"
    s3.put_object(Bucket=src, Key=key_name, Body=b'{"a": 1}\n')
    client = await Client.connect(
        stack.config.temporal_address, plugins=[S3BatchPlugin(make_client(), encryption_key=KEY)]
    )
    task_queue = f"tq-{uuid.uuid4().hex[:8]}"
    job_id = f"enc-{uuid.uuid4().hex[:8]}"
    async with Worker(client, task_queue=task_queue, activity_executor=ThreadPoolExecutor(4)):
        result = await client.execute_workflow(
            S3BatchWorkflow.run,
            S3BatchInput(bucket=src, output_bucket=out, output_prefix="enc/"),
            id=job_id,
            task_queue=task_queue,
        )
    assert result.totals.records_written == 1

    # Without the key, the stored history is opaque: no bucket, no object key in clear.
    plain = await Client.connect(stack.config.temporal_address, plugins=[S3BatchPlugin(encryption_key=b"")])
    history = await plain.get_workflow_handle(job_id).fetch_history()
    raw = history.to_json()
    assert src not in raw and "secret-project" not in raw
    started = history.events[0].workflow_execution_started_event_attributes
    assert started.input.payloads[0].metadata["encoding"] == b"binary/encrypted"

    # The codec server turns the stored payload back into the job input, for the Web UI.
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(EncryptionCodec(KEY), "http://localhost:8233"))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        stored = started.input.payloads[0]
        body = json_format.MessageToJson(Payloads(payloads=[stored])).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{server.server_port}/decode", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            assert response.headers["Access-Control-Allow-Origin"] == "http://localhost:8233"
            decoded = json.loads(response.read())
    finally:
        server.shutdown()
    job = json.loads(base64.b64decode(decoded["payloads"][0]["data"]))
    assert job["bucket"] == src and job["output_prefix"] == "enc/"

"""Handlers with side effects: stable idempotency keys per record and per chunk (``chunk_context``),
and the example HTTP handler against a real HTTP server that counts the keys it receives while a
real worker is SIGKILLed mid-file."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.worker import Worker

from s3batch.dev.workers import WorkerProcess
from s3batch.formats.common import Record
from s3batch.handlers import ChunkContext, HandlerResult, chunk_context, register
from s3batch.models import S3BatchInput
from s3batch.s3io import strip_etag
from tests.helpers import wait_for
from tests.helpers.assertions import assert_exactly_once
from tests.helpers.data import make_csv
from tests.helpers.jobs import start
from tests.helpers.output import report
from tests.helpers.workers import worker_process


class _Counting(BaseHTTPRequestHandler):
    keys: Counter[str]
    attempts: Counter[str]
    lock: threading.Lock

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        self.rfile.read(length)
        with self.lock:
            self.keys[self.headers.get("Idempotency-Key", "")] += 1
            self.attempts[self.headers.get("S3Batch-Attempt", "")] += 1
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def endpoint() -> Iterator[tuple[str, Counter[str], Counter[str]]]:
    """A real HTTP server on a free loopback port: its URL, the count of each key and of each attempt."""
    keys: Counter[str] = Counter()
    attempts: Counter[str] = Counter()
    handler = type("Handler", (_Counting,), {"keys": keys, "attempts": attempts, "lock": threading.Lock()})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/records", keys, attempts
    finally:
        server.shutdown()
        server.server_close()


def test_keys_depend_on_the_job_version_and_line_only() -> None:
    ctx = ChunkContext("job-1", "src", "in/a.csv", "etag1", 3, 1)
    again = ctx._replace(attempt=4)  # the same chunk on a later attempt
    assert ctx.record_key(17) == again.record_key(17) and ctx.chunk_key == again.chunk_key
    assert len(ctx.record_key(17)) == 32 and ctx.record_key(17) != ctx.record_key(18)
    others = [ctx._replace(job_id="job-2"), ctx._replace(key="in/b.csv"), ctx._replace(etag="etag2")]
    assert all(o.record_key(17) != ctx.record_key(17) for o in others)
    later = ctx._replace(chunk=4)
    assert later.chunk_key != ctx.chunk_key and later.record_key(17) == ctx.record_key(17)
    with pytest.raises(RuntimeError, match="only available inside a handler"):
        chunk_context()


async def test_a_handler_sees_its_chunk_context(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, worker: Worker
) -> None:
    src, out = buckets
    seen: list[tuple[ChunkContext, int]] = []

    def capture(records: Sequence[Record]) -> HandlerResult:
        seen.extend((chunk_context(), r.line) for r in records)
        return HandlerResult([r.value for r in records], [], dropped=0)

    register("capture_context", capture, replace=True)
    s3.put_object(Bucket=src, Key="in/a.csv", Body=make_csv(250))
    spec = S3BatchInput(bucket=src, prefix="in/", output_bucket=out, output_prefix="o/", handler="capture_context",
                        chunk_records=100)
    handle = await start(client, task_queue, spec, "ctx")
    assert (await handle.result()).status == "succeeded"
    etag = strip_etag(s3.head_object(Bucket=src, Key="in/a.csv")["ETag"])
    first = seen[0][0]
    assert (first.job_id, first.bucket, first.key, first.etag, first.attempt) == (handle.id, src, "in/a.csv", etag, 1)
    assert [c.chunk for c, _ in seen] == [i // 100 for i in range(250)]
    assert [line for _, line in seen] == list(range(2, 252))


@pytest.mark.slow
async def test_http_side_effects_once_per_key_across_a_sigkill(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, tmp_path: Path,
    endpoint: tuple[str, Counter[str], Counter[str]],
) -> None:
    url, keys, attempts = endpoint
    src, out = buckets
    rows, chunk = 3_000, 200
    s3.put_object(Bucket=src, Key="in/a.csv", Body=make_csv(rows))
    env = {"S3BATCH_HANDLER_MODULES": "examples.idempotent_http", "IDEMPOTENT_HTTP_URL": url}
    spec = S3BatchInput(bucket=src, prefix="in/", output_bucket=out, output_prefix="o/", handler="http_idempotent",
                        chunk_records=chunk, heartbeat_timeout_seconds=4)
    first = worker_process(task_queue, tmp_path, "a", **env)
    second: WorkerProcess | None = None
    try:
        first.wait_ready()
        handle = await start(client, task_queue, spec, "http")
        await wait_for(lambda: len(keys) >= 700, 60, "700 records posted", alive=[first])
        first.kill()
        assert len(keys) < rows, "the kill must land mid-file"
        second = worker_process(task_queue, tmp_path, "b", **env)
        second.wait_ready()
        assert (await handle.result()).status == "succeeded"
    finally:
        first.stop()
        if second:
            second.stop()
    etag = strip_etag(s3.head_object(Bucket=src, Key="in/a.csv")["ETag"])
    context = ChunkContext(handle.id, src, "in/a.csv", etag, 0, 1)
    assert set(keys) == {context.record_key(line) for line in range(2, rows + 2)}  # every record, by its key
    entry = report(s3, out, "o/")["files"][0]
    resumed = entry["resumed_from_record"]
    assert entry["attempts"] >= 2 and 0 < resumed < rows
    # Sent twice: only records of the chunk in flight at the kill (after the last committed one).
    repeated = {k for k, n in keys.items() if n > 1}
    in_flight = {context.record_key(line) for line in range(resumed + 2, resumed + 2 + chunk)}
    assert repeated <= in_flight, f"{len(repeated)} keys repeated outside the chunk in flight"
    assert max(keys.values()) <= 2 and sum(attempts.values()) == sum(keys.values())
    assert_exactly_once(s3, out, "o/in/a.csv/", rows)

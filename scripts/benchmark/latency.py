"""Case 15: many small files where S3 answers in 20 ms, as real S3 does (a local server answers in about 1 ms).

A TCP proxy in a process of its own (:class:`LatencyProxy`, ``python -m scripts.benchmark.latency``) sits in
front of the S3 server and holds each request ``delay`` seconds before forwarding it (the first bytes a
connection sends after the server's last answer; answers pass at once). The same ~1 KB files go through it
three ways in one run: the plain sequential loop of case 3, the same loop on a pool of 16 threads, and
s3batch (a worker of its own whose S3 endpoint is the proxy).
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from scripts.benchmark.baselines import plain_small_loop, small_file
from scripts.benchmark.common import ROOT, SRC, Bench, CaseClock, fmt_rate, log, run_job, verdict
from scripts.benchmark.data import ensure_small_files


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float, state: dict[str, bool],
                upstream: bool) -> None:
    try:
        while data := await reader.read(1 << 16):
            if upstream:
                if state["answered"]:  # the first bytes of a new request
                    state["answered"] = False
                    await asyncio.sleep(delay)
            else:
                state["answered"] = True
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def serve(target_port: int, delay: float) -> None:
    """Proxy 127.0.0.1:<printed port> to 127.0.0.1:``target_port``, each request held ``delay`` seconds."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target_port)
        state = {"answered": True}
        await asyncio.gather(_pipe(reader, up_writer, delay, state, True),
                             _pipe(up_reader, writer, delay, state, False))

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


class LatencyProxy:
    """The proxy's process (started on enter, killed on exit); ``endpoint`` is its URL."""

    def __init__(self, target_port: int, delay: float) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "scripts.benchmark.latency", str(target_port), str(delay)],
                                     cwd=ROOT, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.endpoint = f"http://127.0.0.1:{int(self.proc.stdout.readline())}"

    def __enter__(self) -> LatencyProxy:
        return self

    def __exit__(self, *_: object) -> None:
        self.proc.kill()
        self.proc.wait()


def threaded_small_loop(s3: Any, prefix: str, out_prefix: str, threads: int) -> int:
    """The plain loop of case 3 with its GET/parse/PUT of each file on a pool of ``threads`` threads."""
    keys = [item["Key"] for page in s3.get_paginator("list_objects_v2").paginate(Bucket=SRC, Prefix=prefix)
            for item in page.get("Contents", [])]
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda key: small_file(s3, key, out_prefix), keys))
    return len(keys)


async def case_latency(b: Bench) -> None:
    """Case 15: files/s of s3batch, the sequential loop and the 16-thread loop, all through the proxy."""
    import boto3
    from botocore.config import Config

    z = b.sizes
    clock = CaseClock()
    count, delay = z.latency_files, z.latency_s
    ensure_small_files(b.s3, "latency", count, z.small_rows)
    s3_port = int(b.s3.meta.endpoint_url.rsplit(":", 1)[1].strip("/"))
    with LatencyProxy(s3_port, delay) as proxy:
        slow = boto3.client("s3", endpoint_url=proxy.endpoint, config=Config(
            retries={"mode": "standard", "max_attempts": 5}, max_pool_connections=32))
        queue = f"bench-15-{uuid.uuid4().hex[:6]}"
        worker = b.worker("15-latency", queue, z.small_concurrency, env={"AWS_ENDPOINT_URL_S3": proxy.endpoint})
        worker.wait_ready()
        t0 = time.perf_counter()
        files, _, _ = await asyncio.to_thread(plain_small_loop, slow, "small/latency/", "15/plain/")
        sequential = time.perf_counter() - t0
        log(f"case 15: sequential loop {sequential:.1f}s ({files / sequential:,.1f} files/s)")
        t0 = time.perf_counter()
        n = await asyncio.to_thread(threaded_small_loop, slow, "small/latency/", "15/threads/", 16)
        threaded = time.perf_counter() - t0
        log(f"case 15: 16-thread loop {threaded:.1f}s ({n / threaded:,.1f} files/s)")
        r = await run_job(b.client, queue, prefix="small/latency/", out_prefix="15/s3batch/",
                          max_concurrent_files=z.small_concurrency, chunk_records=z.chunk_records)
        worker.stop()
    assert r["totals"]["files_succeeded"] == files == n == count, (r["totals"], files, n, count)
    s = r["seconds"]
    log(f"case 15: s3batch {s:.1f}s ({files / s:,.1f} files/s)")
    b.results["15_latency"] = {
        "files": files, "delay_s": delay, "sequential_seconds": sequential, "threads_16_seconds": threaded,
        "s3batch_seconds": s, "vs_sequential": sequential / s, "vs_threads_16": threaded / s, "load": clock.summary(),
    }
    what = f"15. {files:,} x ~1 KB, S3 answering in {1000 * delay:.0f} ms"
    b.add(what, "files/s vs the sequential loop", fmt_rate(files / s), fmt_rate(files / sequential),
          f"{sequential / s:.2f}x", ">= 5x", verdict(sequential / s >= 5.0))
    b.add(what, "files/s vs the loop on 16 threads", fmt_rate(files / s), fmt_rate(files / threaded),
          f"{threaded / s:.2f}x", ">= 1x", verdict(threaded / s >= 1.0))


if __name__ == "__main__":
    asyncio.run(serve(int(sys.argv[1]), float(sys.argv[2])))

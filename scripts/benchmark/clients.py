"""Case 14: the CPU one small GET and one small PUT cost in each S3 client, side by side on the same objects in
one run (issue 31): boto3 as s3batch used it for everything before (``make_client``), a shared boto3 client
tuned for small requests, obstore (Rust ``object_store``, credentials from boto3's chain) and awscrt's S3
client. Each client GETs ``n`` objects of ~1 KB and PUTs each back under a prefix of its own, sequentially
and then from 16 threads; CPU is this process's (``time.process_time``: every thread, native ones included).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from scripts.benchmark.common import OUT, SRC, Bench, log
from scripts.benchmark.data import ensure_small_files

Op = Callable[[str, str], None]
"""GET source key, PUT its bytes at output key."""


def boto3_op(client: Any) -> Op:
    def op(key: str, out: str) -> None:
        body = client.get_object(Bucket=SRC, Key=key)["Body"].read()
        client.put_object(Bucket=OUT, Key=out, Body=body, ContentType="application/x-ndjson",
                          Metadata={"s3batch-checkpoint": '{"chunk":1}'})
    return op


def obstore_op() -> Op:
    from s3batch.objects import data_stores
    from s3batch.s3io import make_client

    stores = data_stores(make_client())
    assert stores is not None, "obstore is not installed"

    def op(key: str, out: str) -> None:
        stream = stores.get(SRC, key, etag=None, start=0, end=None).body
        body = b"".join(iter(lambda: stream.read(1 << 20), b""))
        stores.put(OUT, out, body, "application/x-ndjson", {"s3batch-checkpoint": '{"chunk":1}'})
    return op


def awscrt_op() -> Op | None:
    try:
        from awscrt import auth, http, io, s3
    except ImportError:
        return None
    import boto3

    session = boto3.session.Session()
    creds = session.get_credentials().get_frozen_credentials()
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3", "")
    host = endpoint.split("://", 1)[-1].rstrip("/")
    group = io.EventLoopGroup(1)
    bootstrap = io.ClientBootstrap(group, io.DefaultHostResolver(group))
    provider = auth.AwsCredentialsProvider.new_static(creds.access_key, creds.secret_key, creds.token)
    client = s3.S3Client(bootstrap=bootstrap, region=session.region_name or "us-east-1",
                         credential_provider=provider, tls_mode=s3.S3RequestTlsMode.DISABLED)

    def request(kind: Any, method: str, path: str, body: bytes | None) -> bytes:
        headers = http.HttpHeaders([("host", host), ("content-length", str(len(body or b"")))])
        if body is not None:
            headers.add("content-type", "application/x-ndjson")
            headers.add("x-amz-meta-s3batch-checkpoint", '{"chunk":1}')
        import io as pyio

        req = http.HttpRequest(method, path, headers, pyio.BytesIO(body) if body is not None else None)
        got: list[bytes] = []
        made = client.make_request(type=kind, request=req, on_body=lambda chunk, **_: got.append(bytes(chunk)))
        made.finished_future.result(30)
        return b"".join(got)

    def op(key: str, out: str) -> None:
        body = request(s3.S3RequestType.GET_OBJECT, "GET", f"/{SRC}/{key}", None)
        request(s3.S3RequestType.PUT_OBJECT, "PUT", f"/{OUT}/{out}", body)
    return op


def measure(op: Op, keys: list[str], tag: str, threads: int) -> tuple[float, float]:
    """(CPU ms, wall ms) per file of ``op`` over ``keys``."""
    cpu0, t0 = time.process_time(), time.perf_counter()
    if threads == 1:
        for key in keys:
            op(key, f"14/{tag}/{key}")
    else:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda k: op(k, f"14/{tag}/{k}"), keys))
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
    return 1000 * cpu / len(keys), 1000 * wall / len(keys)


async def case_clients(b: Bench) -> None:
    """Case 14: CPU per small file (one GET + one PUT) in each client, sequential and 16 threads."""
    import boto3
    from botocore.config import Config

    from s3batch.s3io import make_client

    z = b.sizes
    count = min(z.small_files, 2000)
    ensure_small_files(b.s3, "a", count, z.small_rows)
    keys = [o["Key"] for p in b.s3.get_paginator("list_objects_v2").paginate(Bucket=SRC, Prefix="small/a/")
            for o in p.get("Contents", [])][:count]
    tuned = boto3.session.Session().client("s3", config=Config(
        max_pool_connections=32, retries={"mode": "standard", "max_attempts": 6}, parameter_validation=False,
        request_checksum_calculation="when_required", response_checksum_validation="when_required",
        tcp_keepalive=True))
    clients: dict[str, Op | None] = {"boto3 (make_client)": boto3_op(make_client()), "boto3 tuned": boto3_op(tuned),
                                     "obstore": None, "awscrt": awscrt_op()}
    with contextlib.suppress(ImportError, AssertionError):
        clients["obstore"] = obstore_op()
    results: dict[str, dict[str, list[float]]] = {}
    for threads in (1, 16):
        for name, op in clients.items():
            if op is None:
                continue
            op(keys[0], f"14/warm/{name}")
            cpu, wall = measure(op, keys, f"{name.split()[0]}-{threads}", threads)
            results.setdefault(name, {})[str(threads)] = [round(cpu, 3), round(wall, 3)]
            log(f"case 14: {name}, {threads} thread(s): {cpu:.2f} ms CPU, {wall:.2f} ms wall per file")
    b.results["14_clients"] = {"files": len(keys), "ms_per_file_cpu_wall": results}
    base = results["boto3 (make_client)"]
    for name, r in results.items():
        b.add("14. S3 client, one small GET + PUT", f"{name}: CPU ms per file, 1 / 16 threads",
              f"{r['1'][0]:.2f} / {r['16'][0]:.2f}", f"{base['1'][0]:.2f} / {base['16'][0]:.2f} (boto3)",
              f"{base['1'][0] / r['1'][0]:.2f}x / {base['16'][0] / r['16'][0]:.2f}x", "", "info")

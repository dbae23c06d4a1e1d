"""Case 9: the big CSV into a PostgreSQL table, s3batch's sink (checkpoint in the same transaction)
vs the plain script a user would write (psycopg ``COPY`` of the same rows, no checkpoint), same run,
same server (a throwaway one: ``s3batch.dev.postgres``)."""

from __future__ import annotations

import asyncio
import csv
import io
import time
import uuid
from typing import Any

import psycopg

from s3batch.dev.postgres import PostgresServer, server_bindir
from scripts.benchmark.common import SRC, Bench, CaseClock, fmt_rate, log, median, run_job, verdict
from scripts.benchmark.data import put_csv

WARM_ROWS = 20_000
"""Rows of the unmeasured job the case's worker runs first (see :func:`warm_up`)."""

CONNECTION = "bench"
"""The connection name the case's worker knows (``S3BATCH_POSTGRES_BENCH_DSN``)."""

_TABLE = (
    "CREATE TABLE public.{} (customer_id bigint PRIMARY KEY, email text NOT NULL, name text NOT NULL, "
    "country text NOT NULL, amount numeric(14, 2) NOT NULL, created_at timestamptz NOT NULL)"
)


def plain_copy(s3: Any, key: str, dsn: str, table: str) -> int:
    """What a user writes without s3batch: streaming GET, csv.reader, one psycopg COPY of every row,
    one commit. No checkpoint, no retry, no rejects, no report. Returns the rows written."""
    body = s3.get_object(Bucket=SRC, Key=key)["Body"]
    reader = csv.reader(io.TextIOWrapper(io.BufferedReader(body, 1024 * 1024), encoding="utf-8", newline=""))
    header = next(reader)
    written = 0
    with psycopg.connect(dsn) as conn, conn.cursor() as cur:
        statement = f"COPY public.{table} ({', '.join(header)}) FROM STDIN"
        with cur.copy(statement) as copy:  # type: ignore[arg-type]  # a literal statement of this script
            for row in reader:
                copy.write_row(row)
                written += 1
    return written


async def warm_up(b: Bench, server: PostgresServer, queue: str) -> float:
    """One small job into a throwaway table, unmeasured, before the repetitions: the worker's first job pays
    once what a long-running worker has paid already (its connection pool's first connections, the first
    calls into pyarrow's kernels and the SDK's). Returns its seconds (in the results, for comparison)."""
    table = f"customers_warm_{uuid.uuid4().hex[:6]}"
    server.execute(_TABLE.format(table))
    put_csv(b.s3, "warm/customers.csv", WARM_ROWS)
    sink = {"type": "postgres", "connection": CONNECTION, "table": f"public.{table}"}
    r = await run_job(b.client, queue, prefix="warm/", out_prefix="9_postgres/warm/", sink=sink,
                      chunk_records=b.sizes.chunk_records, max_concurrent_files=1)
    assert r["totals"]["records_written"] == WARM_ROWS, r["totals"]
    return float(r["seconds"])


async def case_postgres(b: Bench) -> None:
    """Case 9: rows/s into PostgreSQL, s3batch (one worker process, insert mode) vs ``plain_copy``."""
    bindir = server_bindir()
    if bindir is None:
        b.add("9. into PostgreSQL", "rows/s vs plain psycopg COPY", "n/a", "n/a", "", ">= 0.8x",
              "n/a (no PostgreSQL server binaries)")
        return
    z = b.sizes
    key = "big/customers.csv"
    server = PostgresServer(bindir)
    server.start()
    try:
        queue = f"bench-pg-{uuid.uuid4().hex[:6]}"
        worker = b.worker("pg", queue, 1, env={f"S3BATCH_POSTGRES_{CONNECTION.upper()}_DSN": server.dsn})
        worker.wait_ready()
        warm_s = await warm_up(b, server, queue)
        clock = CaseClock()
        plain_s: list[float] = []
        s3b_s: list[float] = []
        for rep in range(z.reps):
            order = ("plain", "s3batch") if rep % 2 == 0 else ("s3batch", "plain")
            for side in order:
                table = f"customers_{side}_{rep}_{uuid.uuid4().hex[:6]}"
                server.execute(_TABLE.format(table))
                if side == "plain":
                    t0 = time.perf_counter()
                    n = await asyncio.to_thread(plain_copy, b.s3, key, server.dsn, table)
                    plain_s.append(time.perf_counter() - t0)
                    assert n == z.big_rows, f"plain COPY wrote {n} rows, expected {z.big_rows}"
                else:
                    sink = {"type": "postgres", "connection": CONNECTION, "table": f"public.{table}"}
                    r = await run_job(b.client, queue, prefix="big/", out_prefix=f"9_postgres/r{rep}/", sink=sink,
                                      chunk_records=z.chunk_records, max_concurrent_files=1)
                    assert r["totals"]["records_written"] == z.big_rows, r["totals"]
                    s3b_s.append(r["seconds"])
                [(count,)] = server.execute(f"SELECT count(*) FROM public.{table}")
                assert count == z.big_rows, f"{side}: {count} rows in the table, expected {z.big_rows}"
                seconds = (plain_s if side == "plain" else s3b_s)[-1]
                log(f"case 9 rep {rep}: {side} {seconds:.2f}s ({z.big_rows / seconds:,.0f} rows/s)")
        worker.stop()
    finally:
        server.remove()
    p, s = median(plain_s), median(s3b_s)
    ratio = p / s
    b.results["9_postgres"] = {
        "rows": z.big_rows, "chunk_records": z.chunk_records, "plain_seconds": plain_s, "s3batch_seconds": s3b_s,
        "plain_rows_per_s": z.big_rows / p, "s3batch_rows_per_s": z.big_rows / s, "ratio": ratio,
        "warm_up": {"rows": WARM_ROWS, "seconds": warm_s},
        "load": clock.summary(),
    }
    b.add("9. into PostgreSQL (insert)", "rows/s vs plain psycopg COPY", fmt_rate(z.big_rows / s),
          fmt_rate(z.big_rows / p), f"{ratio:.2f}x", ">= 0.8x", verdict(ratio >= 0.8))

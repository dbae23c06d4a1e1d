"""Case 6: the cost of a crash (SIGKILL mid-file, s3batch vs the naive design) and the SIGTERM hand-off."""

from __future__ import annotations

import asyncio
import json
import signal
import time
import uuid
from typing import Any

from scripts.benchmark.common import (
    JOB_TIMEOUT,
    OUT,
    SRC,
    Bench,
    CaseClock,
    Sizes,
    attempt_started,
    committed_records,
    count_parts,
    log,
    part_exists,
    verdict,
    wait_until,
)
from scripts.benchmark.data import object_size, put_csv


def _crash_env(z: Sizes) -> dict[str, str]:
    if z.crash_handler == "passthrough":
        return {}
    # Quick mode: a slow handler from the test suite, so that a tiny file can be killed mid-way.
    return {"S3BATCH_HANDLER_MODULES": "tests.slow_handlers", "S3BATCH_TEST_HANDLER_DELAY": str(z.crash_delay)}


async def _start_crash_job(b: Bench, design: str, queue: str, out_prefix: str) -> Any:
    """The one-file job of case 6, on the naive design or on s3batch; its handle."""
    z = b.sizes
    wid = f"bench-crash-{design}-{uuid.uuid4().hex[:6]}"
    if design == "naive":
        return await b.client.start_workflow(
            "BenchNaiveFileWorkflow",
            {"bucket": SRC, "key": "crash/customers.csv", "out_bucket": OUT, "out_prefix": out_prefix,
             "chunk": z.crash_chunk, "delay": z.crash_delay, "heartbeat_timeout": z.heartbeat_timeout},
            id=wid, task_queue=queue, result_type=dict)
    from s3batch.workflows.batch import S3BatchWorkflow

    from s3batch.models import S3BatchInput

    return await b.client.start_workflow(
        S3BatchWorkflow.run,
        S3BatchInput(bucket=SRC, prefix="crash/", output_bucket=OUT, output_prefix=out_prefix,
                     handler=z.crash_handler, chunk_records=z.crash_chunk, max_concurrent_files=1,
                     heartbeat_timeout_seconds=z.heartbeat_timeout),
        id=wid, task_queue=queue)


async def _crash_one(b: Bench, design: str) -> dict[str, Any]:
    """SIGKILL the worker of a one-file job once ``kill_fraction`` of the file is written; time the
    restart (attempt 2 running) and the recovery (the next part after the kill point written)."""
    z = b.sizes
    queue = f"bench-6{design[0]}-{uuid.uuid4().hex[:6]}"
    naive = design == "naive"
    env = _crash_env(z)
    first = b.worker(f"6-{design}-a", queue, 1, naive=naive, env=env).wait_ready()
    out_prefix = f"6/{design}/"
    file_prefix = f"{out_prefix}crash/customers.csv/" if not naive else out_prefix
    handle = await _start_crash_job(b, design, queue, out_prefix)
    total_parts = -(-z.crash_rows // z.crash_chunk)
    target = max(2, int(total_parts * z.kill_fraction))
    # The second worker is up before the kill, as in a real deployment; it is started once the
    # first one holds the file (first part written), so it cannot take the file from it.
    await wait_until(lambda: part_exists(b.s3, f"{file_prefix}part-00000.jsonl"), timeout=300, interval=0.02)
    second = b.worker(f"6-{design}-b", queue, 1, naive=naive, env=env).wait_ready()
    await wait_until(lambda: part_exists(b.s3, f"{file_prefix}part-{target - 1:05d}.jsonl"), timeout=300, interval=0.02)
    if not (await handle.describe()).raw_description.pending_activities:
        raise RuntimeError("the file was done before the kill (a slow start of the second worker?): give case 6 a "
                           "longer file (crash_rows) or a slower handler (crash_delay)")
    first.kill()
    killed = time.monotonic()
    await asyncio.sleep(0.3)  # a PUT whose bytes were all sent may still land: let it
    if naive:
        parts = count_parts(b.s3, file_prefix)
        committed = parts * z.crash_chunk
    else:
        parts, committed = committed_records(b.s3, file_prefix)
    log(f"case 6 {design}: killed with {parts} parts ({committed:,} records) written")
    while not await attempt_started(handle, 2):
        await asyncio.sleep(0.05)
        if time.monotonic() - killed > z.heartbeat_timeout + 120:
            raise TimeoutError("no retry after the kill")
    restart = time.monotonic() - killed
    next_key = f"{file_prefix}part-{parts:05d}.jsonl"
    await wait_until(lambda: part_exists(b.s3, next_key), timeout=600, interval=0.02)
    recovered = time.monotonic() - killed
    result = await asyncio.wait_for(handle.result(), JOB_TIMEOUT)
    second.stop()
    if naive:
        resumed_from = int(result["resumed_from_record"])
        attempts = int(result["attempt"])
        records = int(result["records"])
    else:
        from s3batch import layout

        report = json.loads(b.s3.get_object(Bucket=OUT, Key=layout.report_key(out_prefix))["Body"].read())
        entry = report["files"][0]
        resumed_from, attempts, records = entry["resumed_from_record"], entry["attempts"], entry["records"]
    assert records == z.crash_rows, (records, z.crash_rows)
    redone = max(0, committed - resumed_from)
    log(f"case 6 {design}: restart {restart:.1f}s, recovered {recovered:.1f}s, resumed from {resumed_from:,}, "
        f"committed work redone {redone:,}")
    return {"parts_at_kill": parts, "fraction_at_kill": round(parts / total_parts, 2),
            "records_committed_at_kill": committed, "resumed_from_record": resumed_from,
            "committed_records_redone": redone, "in_flight_records_redone_at_most": z.crash_chunk,
            "kill_to_restart_s": restart, "kill_to_recovered_s": recovered, "attempts": attempts}


async def _sigterm_handoff(b: Bench) -> dict[str, Any]:
    """SIGTERM (a deploy) mid-file: seconds until attempt 2 runs on the other worker."""
    from s3batch.workflows.batch import S3BatchWorkflow

    from s3batch.models import S3BatchInput

    z = b.sizes
    queue = f"bench-6t-{uuid.uuid4().hex[:6]}"
    env = _crash_env(z)
    first = b.worker("6-sigterm-a", queue, 1, env=env).wait_ready()
    handle = await b.client.start_workflow(
        S3BatchWorkflow.run,
        S3BatchInput(bucket=SRC, prefix="crash/", output_bucket=OUT, output_prefix="6/sigterm/",
                     handler=z.crash_handler, chunk_records=z.crash_chunk, max_concurrent_files=1,
                     heartbeat_timeout_seconds=30),
        id=f"bench-sigterm-{uuid.uuid4().hex[:6]}", task_queue=queue)
    target = max(2, int(-(-z.crash_rows // z.crash_chunk) * z.kill_fraction))
    file_prefix = "6/sigterm/crash/customers.csv/"
    await wait_until(lambda: part_exists(b.s3, f"{file_prefix}part-00000.jsonl"), 300, 0.02)
    second = b.worker("6-sigterm-b", queue, 1, env=env).wait_ready()
    await wait_until(lambda: part_exists(b.s3, f"{file_prefix}part-{target - 1:05d}.jsonl"), 300, 0.02)
    if not (await handle.describe()).raw_description.pending_activities:
        raise RuntimeError("the file was done before the SIGTERM (a slow start of the second worker?): nothing "
                           "to hand off; give case 6 a longer file (crash_rows) or a slower handler (crash_delay)")
    signalled = time.monotonic()
    first.proc.send_signal(signal.SIGTERM)
    while not await attempt_started(handle, 2):
        await asyncio.sleep(0.02)
        if time.monotonic() - signalled > 60:
            raise TimeoutError("no hand-off after SIGTERM")
    handoff = time.monotonic() - signalled
    await asyncio.wait_for(handle.result(), JOB_TIMEOUT)
    first.stop()
    second.stop()
    log(f"case 6: SIGTERM hand-off {handoff:.2f}s (heartbeat timeout 30 s)")
    return {"handoff_s": handoff, "heartbeat_timeout_s": 30}


async def case_crash(b: Bench) -> None:
    z = b.sizes
    clock = CaseClock()
    if object_size(b.s3, "crash/customers.csv") is None:
        put_csv(b.s3, "crash/customers.csv", z.crash_rows)
    s3b = await _crash_one(b, "s3batch")
    naive = await _crash_one(b, "naive")
    term = await _sigterm_handoff(b)
    hb = z.heartbeat_timeout
    b.results["6_crash"] = {"rows": z.crash_rows, "chunk_records": z.crash_chunk, "heartbeat_timeout_s": hb,
                            "handler": z.crash_handler, "s3batch": s3b, "naive": naive, "sigterm": term,
                            "load": clock.summary()}
    b.add("6. crash cost (SIGKILL)", f"committed records processed again (+ in-flight chunk <= {z.crash_chunk:,})",
          f"{s3b['committed_records_redone']:,}", f"{naive['committed_records_redone']:,} (naive)", "",
          "<= one chunk", verdict(s3b["committed_records_redone"] == 0))
    b.add("6. crash cost (SIGKILL)", f"s kill -> retry running (heartbeat timeout {hb} s)",
          f"{s3b['kill_to_restart_s']:.1f}", f"{naive['kill_to_restart_s']:.1f} (naive)", "",
          f"<= {hb + 2} s", verdict(s3b["kill_to_restart_s"] <= hb + 2))
    b.add("6. crash cost (SIGKILL)", "s kill -> first new part past the kill point",
          f"{s3b['kill_to_recovered_s']:.1f}", f"{naive['kill_to_recovered_s']:.1f} (naive)",
          f"{naive['kill_to_recovered_s'] / s3b['kill_to_recovered_s']:.1f}x", "", "info")
    b.add("6. SIGTERM hand-off", "s SIGTERM -> attempt 2 running elsewhere", f"{term['handoff_s']:.2f}", "", "",
          "<= 2 s", verdict(term["handoff_s"] <= 2))

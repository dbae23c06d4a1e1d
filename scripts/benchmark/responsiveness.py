"""Case 8: how often a running file's progress changes on the server, and how soon a cancel lands."""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from typing import Any

from scripts.benchmark.common import (
    FILE_ACTIVITIES,
    OUT,
    SRC,
    Bench,
    CaseClock,
    log,
    median,
    part_exists,
    verdict,
    wait_until,
)
from scripts.benchmark.data import object_size, put_csv

_RESP_SAMPLE = 0.2
"""Seconds between two samples of a running file's progress (case 8)."""
_BASELINE_THROTTLE = 24.0
"""The SDK's own heartbeat throttle for the default 30 s heartbeat timeout (0.8 x the timeout)."""


async def _file_activity(handle: Any) -> tuple[Any, Any]:
    """(workflow description, the pending file activity or None)."""
    desc = await handle.describe()
    pending = [p for p in desc.raw_description.pending_activities if p.activity_type.name in FILE_ACTIVITIES]
    return desc, pending[0] if pending else None


async def _progress_changes(handle: Any, window: float) -> dict[str, Any]:
    """Sample the running file for ``window`` seconds: when its heartbeat details (the checkpoint,
    whose byte offset is what ``s3batch watch`` shows in flight) and the workflow's ``progress``
    query change on the server."""
    seen_details: bytes | None = None
    seen_query: Any = None
    details_at: list[float] = []
    query_at: list[float] = []
    t0 = time.monotonic()
    while (now := time.monotonic()) - t0 < window:
        _, pending = await _file_activity(handle)
        if pending is None:
            raise RuntimeError("the file finished while its progress was sampled: make it longer (resp_rows)")
        details = pending.heartbeat_details.SerializeToString()
        if pending.heartbeat_details.payloads and details != seen_details:
            details_at.append(now - t0)
            seen_details = details
        query = await handle.query("progress", result_type=dict)
        moving = (query["records"], query["records_written"], query["bytes_read"])
        if moving != seen_query:
            query_at.append(now - t0)
            seen_query = moving
        await asyncio.sleep(max(0.0, _RESP_SAMPLE - (time.monotonic() - now)))

    def gaps(times: list[float]) -> list[float]:
        return [round(b - a, 2) for a, b in itertools.pairwise(times)]

    # The first sample sets the reference; only later samples are changes.
    return {"window_s": window, "sample_s": _RESP_SAMPLE,
            "checkpoint_changes": len(details_at) - 1, "checkpoint_intervals_s": gaps(details_at),
            "query_changes": len(query_at) - 1, "query_intervals_s": gaps(query_at)}


async def _cancel_latency(handle: Any) -> dict[str, Any]:
    """``handle.cancel()`` on the running file: seconds until its activity is no longer pending
    (it stopped at a chunk boundary and reported the cancellation), and until the workflow closed."""
    from temporalio.client import WorkflowExecutionStatus

    t0 = time.monotonic()
    await handle.cancel()
    stopped = closed = None
    while closed is None:
        desc, pending = await _file_activity(handle)
        now = time.monotonic() - t0
        if stopped is None and pending is None:
            stopped = now
        if desc.status != WorkflowExecutionStatus.RUNNING:
            closed = now
            status = desc.status.name if desc.status else "?"
        elif now > 120:
            raise TimeoutError("the cancelled job was still running after 120 s")
        await asyncio.sleep(0.05)
    return {"stopped_s": round(stopped if stopped is not None else closed, 2), "closed_s": round(closed, 2),
            "status": status}


async def _responsiveness_run(b: Bench, label: str, env: dict[str, str], cancels: int) -> dict[str, Any]:
    """One worker: a job whose file's progress is sampled for ``resp_window`` seconds, then cancelled;
    then ``cancels - 1`` more jobs cancelled at spread moments (0.3 s, 0.8 s, ... after their first
    part), since a cancel waits for the next heartbeat and so depends on where in the throttle it lands."""
    z = b.sizes
    queue = f"bench-8{label[0]}-{uuid.uuid4().hex[:6]}"
    w = b.worker(f"8-{label}", queue, 1, env={"S3BATCH_HANDLER_MODULES": "tests.slow_handlers",
                                                "S3BATCH_TEST_HANDLER_DELAY": str(z.resp_delay), **env}).wait_ready()
    changes: dict[str, Any] = {}
    runs: list[dict[str, Any]] = []
    for rep in range(cancels):
        out_prefix = f"8/{label}/{rep}/"
        job = {"bucket": SRC, "prefix": "resp/", "output_bucket": OUT, "output_prefix": out_prefix,
               "handler": "slow_passthrough", "chunk_records": z.resp_chunk, "max_concurrent_files": 1}
        handle = await b.client.start_workflow("S3BatchWorkflow", job, id=f"bench-resp-{label}-{uuid.uuid4().hex[:6]}",
                                               task_queue=queue, result_type=dict)
        await wait_until(lambda p=out_prefix: part_exists(b.s3, f"{p}resp/customers.csv/part-00000.jsonl"), 120, 0.05)
        if rep == 0:
            changes = await _progress_changes(handle, z.resp_window)
        else:
            await asyncio.sleep(0.3 + 0.5 * (rep - 1))
        runs.append(await _cancel_latency(handle))
    w.stop(25)
    intervals = changes["checkpoint_intervals_s"]
    stopped = [r["stopped_s"] for r in runs]
    closed = [r["closed_s"] for r in runs]
    result = {**changes, "cancels": runs, "checkpoint_median_interval_s": median(intervals) if intervals else None,
              "stopped_median_s": median(stopped), "stopped_max_s": max(stopped),
              "closed_median_s": median(closed), "closed_max_s": max(closed),
              "all_cancelled": all(r["status"] == "CANCELED" for r in runs)}
    log(f"case 8 {label}: checkpoint changed {changes['checkpoint_changes']}x in {z.resp_window:g}s "
        f"(median {result['checkpoint_median_interval_s']}s), progress query {changes['query_changes']}x; "
        f"{cancels} cancels: file stopped {stopped}s, workflow closed {closed}s")
    return result


def _cancel_cell(r: dict[str, Any], what: str) -> str:
    n = len(r["cancels"])
    return f"{r[what + '_median_s']:.1f}" + (f" (max {r[what + '_max_s']:.1f}, {n} cancels)" if n > 1 else "")


def _interval_cell(r: dict[str, Any] | None) -> str:
    if r is None:
        return ""
    if r["checkpoint_median_interval_s"] is None:
        return f"> {r['window_s']:g} ({r['checkpoint_changes']} changes)"
    return f"{r['checkpoint_median_interval_s']:.1f} ({r['checkpoint_changes']} changes in {r['window_s']:g} s)"


async def case_responsiveness(b: Bench) -> None:
    """Case 8: progress refresh and cancel latency on one big file in flight (default heartbeat
    timeout, 30 s), with the worker's own throttle and, as the baseline, the SDK's 24 s."""
    z = b.sizes
    clock = CaseClock()
    if object_size(b.s3, "resp/customers.csv") is None:
        put_csv(b.s3, "resp/customers.csv", z.resp_rows)
    now = await _responsiveness_run(b, "current", {}, z.resp_cancels)
    base = None
    if z.resp_baseline:
        sdk = {"S3BATCH_HEARTBEAT_THROTTLE_SECONDS": str(_BASELINE_THROTTLE)}
        base = await _responsiveness_run(b, "sdk-throttle", sdk, 1)
    b.results["8_responsiveness"] = {"rows": z.resp_rows, "chunk_records": z.resp_chunk,
                                     "handler_s_per_chunk": z.resp_delay, "heartbeat_timeout_s": 30,
                                     "current": now, "baseline_sdk_throttle": base, "load": clock.summary()}
    what = f"1 file in flight, a chunk every ~{z.resp_delay:g} s"
    b.add("8. responsiveness", f"s between progress changes (in-flight bytes; {what})", _interval_cell(now),
          _interval_cell(base) + (" (SDK throttle 24 s)" if base else ""), "", "<= 5 s",
          verdict(now["checkpoint_median_interval_s"] is not None and now["checkpoint_median_interval_s"] <= 5))
    b.add("8. responsiveness", "changes of the progress query (files, records, bytes) while the file is read",
          f"{now['query_changes']} in {now['window_s']:g} s",
          f"{base['query_changes']} in {base['window_s']:g} s" if base else "", "", "", "info")
    b.add("8. responsiveness", "s cancel -> file activity stopped", _cancel_cell(now, "stopped"),
          _cancel_cell(base, "stopped") + " (SDK throttle 24 s)" if base else "", "", "<= 5 s",
          verdict(now["stopped_max_s"] <= 5))
    b.add("8. responsiveness", "s cancel -> workflow closed (cancelled, report written)", _cancel_cell(now, "closed"),
          _cancel_cell(base, "closed") + " (SDK throttle 24 s)" if base else "", "", "<= 8 s",
          verdict(now["closed_max_s"] <= 8 and now["all_cancelled"]))

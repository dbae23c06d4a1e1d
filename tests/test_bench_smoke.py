"""The benchmark script still runs: a ``--quick`` run of a few cases produces a well-formed table and
JSON. Timing is never asserted (the figures of a quick run mean nothing)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import unmeasured

ROOT = Path(__file__).resolve().parent.parent

_COLUMNS = ["case", "metric", "s3batch", "baseline", "ratio", "target", "verdict"]


@pytest.mark.servers  # starts servers or builds of its own
def test_bench_quick_run_prints_a_table_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    # Cases 1, 3, 7 and 8 cover the plain baselines, an s3batch job on a worker process, the history
    # walk, a cancelled job and the JSON; 13 the one-file job's history and the floor workflow; 14 the S3 clients
    # side by side, 15 the latency proxy and a worker behind it; the crash and two-worker cases start many
    # processes and take too long here.
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench.py"), "--quick", "--cases", "1,3,7,8,13,14,15",
         "--json", str(out), "--root", str(tmp_path / "bench")],
        cwd=ROOT,
        env=unmeasured(),  # its workers untraced by coverage, as when the bench is run
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]

    lines = [line for line in proc.stdout.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    assert header == _COLUMNS
    body = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]
    assert {row[0].split(".")[0] for row in body} == {"1", "3", "7", "8", "13", "14", "15"}
    assert all(len(row) == len(_COLUMNS) and row[2] for row in body)

    data = json.loads(out.read_text())
    assert data["quick"] is True
    assert data["cases"] == [1, 3, 7, 8, 13, 14, 15]
    assert data["machine"]["cpu_count"] >= 1
    assert data["machine"]["packages"]["temporalio"]
    assert [list(row) for row in data["table"]] == [_COLUMNS] * len(data["table"])
    assert len(data["table"]) == len(body)
    results = data["results"]
    assert set(results) == {
        "1_big_file", "3_small_files", "7_history", "8_responsiveness", "13_scaling", "14_clients", "15_latency"
    }
    big = results["1_big_file"]
    assert big["plain_rows_per_s"] > 0 and big["s3batch_rows_per_s"] > 0 and big["ratio"] > 0
    assert results["3_small_files"]["files"] == data["sizes"]["small_files"]
    history = results["7_history"]
    assert history["files"] == data["sizes"]["history_files"]
    assert history["largest_run_events"] > 0 and history["largest_run_bytes"] > 0
    # The file was sampled mid-flight (its checkpoint seen at least once) and the cancel closed the job.
    responsive = results["8_responsiveness"]["current"]
    assert responsive["checkpoint_changes"] >= 0 and responsive["all_cancelled"]
    assert [c["status"] for c in responsive["cancels"]] == ["CANCELED"] * data["sizes"]["resp_cancels"]
    assert all(0 <= c["stopped_s"] <= c["closed_s"] for c in responsive["cancels"])
    one_file = results["13_scaling"]["by_size"][0]  # taken apart from its history, beside the floor workflow
    assert one_file["floor_seconds"] > 0 and one_file["phases"]["first_task"] > 0
    assert set(one_file["phases"]["activities"]) == {"s3batch.process_file", "s3batch.write_report"}
    assert 0 < sum(one_file["phases"]["activities"].values()) < one_file["phases"]["history"]
    clients = results["14_clients"]["ms_per_file_cpu_wall"]
    assert {"boto3 (make_client)", "boto3 tuned", "obstore"} <= set(clients)
    latency = results["15_latency"]
    assert latency["files"] == data["sizes"]["latency_files"]
    assert latency["sequential_seconds"] > 0 and latency["threads_16_seconds"] > 0 and latency["s3batch_seconds"] > 0
    for name, case in results.items():
        if name != "14_clients":
            assert {"wall_s", "cores_busy_others"} <= set(case["load"])

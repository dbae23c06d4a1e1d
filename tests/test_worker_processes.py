"""Every core of a worker (issue 11, point 2): one ``s3batch-worker`` with ``S3BATCH_WORKER_PROCESSES=2``
is a supervisor of two worker processes. Real workers on the real test stack: a job spread over both
processes, the SIGTERM drain, a SIGKILLed supervisor (no child survives), a SIGKILLed child
(restarted); and the core count, the slot split and the combined health file as pure functions."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from s3batch import health
from s3batch.config import Settings, cores_from
from s3batch.dev.workers import WorkerProcess
from s3batch.errors import WORKER_SHUTDOWN
from s3batch.supervisor import shares
from tests.helpers import wait_for
from tests.helpers.assertions import assert_exactly_once
from tests.helpers.data import make_csv, put_files
from tests.helpers.history import history_events
from tests.helpers.jobs import slow_job, start
from tests.helpers.output import committed_parts, report
from tests.helpers.workers import ROOT, TEST_HANDLERS, worker_process

# ----------------------------------------------------------------------------- pure functions


@pytest.mark.parametrize(
    ("affinity", "cpu_max", "cores"),
    [
        (4, None, 4),  # no cgroup v2 file: the affinity
        (4, "max 100000\n", 4),  # no quota
        (4, "200000 100000\n", 2),  # --cpus 2
        (4, "150000 100000", 2),  # --cpus 1.5: rounded up
        (4, "50000 100000", 1),  # half a core: still one process
        (2, "800000 100000", 2),  # a quota above the CPUs it may run on
        (0, None, 1),
        (3, "", 3),
        (3, "garbage", 3),
        (3, "-1 100000", 3),
        (3, "100000 0", 3),
    ],
)
def test_cores_from_affinity_and_cgroup_quota(affinity: int, cpu_max: str | None, cores: int) -> None:
    assert cores_from(affinity, cpu_max) == cores


def test_processes_setting_defaults_to_the_cores_and_never_exceeds_the_file_slots() -> None:
    assert Settings.explicit(worker_processes=3, max_concurrent_files=8).processes() == 3
    assert Settings.explicit(worker_processes=3, max_concurrent_files=2).processes() == 2
    auto = Settings.explicit(max_concurrent_files=1_000)
    assert auto.worker_processes == 0
    assert 1 <= auto.processes() == cores_from(len(os.sched_getaffinity(0)), _cpu_max())


def _cpu_max() -> str | None:
    try:
        return Path("/sys/fs/cgroup/cpu.max").read_text()
    except OSError:
        return None


def test_file_slots_are_shared_out_between_the_processes() -> None:
    assert shares(8, 2) == [4, 4]
    assert shares(8, 3) == [3, 3, 2]
    assert shares(5, 2) == [3, 2]
    assert shares(1, 2) == [1, 1]  # at least one each (Settings.processes() never asks for this)


def test_combined_health_is_polling_only_while_every_process_polls(tmp_path: Path) -> None:
    now = time.time()
    polling = {"state": "polling", "written_at": now - 4, "server_ok_at": now - 3}
    both = health.combine([polling, {**polling, "written_at": now - 1}], pid=7, task_queue="q", now=now)
    assert both["state"] == "polling" and both["written_at"] == now - 4 and both["server_ok_at"] == now - 3
    path = tmp_path / "h.json"
    path.write_text(json.dumps(both))
    ok, why = health.check(path, now=now)
    assert ok and "2 processes" in why, why

    one_missing = health.combine([polling, None], pid=7, task_queue="q", now=now)
    path.write_text(json.dumps(one_missing))
    ok, why = health.check(path, now=now)
    assert not ok and why == "1 of 2 worker processes polling"

    starting = health.combine([polling, {**polling, "state": "starting"}], pid=7, task_queue="q", now=now)
    assert starting["state"] == "starting"

    stuck = health.combine([polling, {**polling, "written_at": now - 100}], pid=7, task_queue="q", now=now)
    path.write_text(json.dumps(stuck))
    ok, why = health.check(path, now=now)
    assert not ok and "stuck or gone" in why, "one stuck process makes the worker stale"

    no_server = health.combine([polling, {**polling, "server_ok_at": None}], pid=7, task_queue="q", now=now)
    path.write_text(json.dumps(no_server))
    assert not health.check(path, now=now)[0]
    assert health.check(path, now=now, liveness=True)[0]


def test_a_worker_process_whose_supervisor_is_gone_does_not_start() -> None:
    # The supervisor died between starting the process and the process asking to die with it.
    env = {**os.environ, "S3BATCH_SUPERVISOR_PID": "1"}
    done = subprocess.run([sys.executable, "-m", "s3batch.worker"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "its supervisor is gone" in done.stderr, done.stderr


# ----------------------------------------------------------------------------- real workers

def supervised(task_queue: str, log_dir: Path, name: str, **env: str) -> WorkerProcess:
    """One ``s3batch-worker`` of two worker processes with the test handlers; not yet ready."""
    return WorkerProcess(
        task_queue, log_dir, name, cwd=ROOT, processes=2, env={"S3BATCH_HANDLER_MODULES": TEST_HANDLERS, **env}
    )


def child_pids(worker: WorkerProcess) -> dict[int, list[int]]:
    """The pids of each worker process index, in the order the supervisor started them (its log)."""
    pids: dict[int, list[int]] = {}
    for index, pid in re.findall(r"worker process (\d+) started \(pid (\d+)", worker.log()):
        pids.setdefault(int(index), []).append(int(pid))
    return pids


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie waiting for its new parent to reap it is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def health_command(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "s3batch.health", "--file", str(path)], capture_output=True, text=True, timeout=30
    )


async def file_activity_identities(client: Client, workflow_id: str) -> list[str]:
    """The worker identity (``pid@host``) of every started attempt of a file activity."""
    events = await history_events(client, workflow_id)
    types = {
        e.event_id: e.activity_task_scheduled_event_attributes.activity_type.name
        for e in events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    }
    return [
        e.activity_task_started_event_attributes.identity
        for e in events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
        and "file" in types[e.activity_task_started_event_attributes.scheduled_event_id].lower()
    ]


@pytest.mark.slow
async def test_one_worker_of_two_processes_runs_a_job_on_both_exactly_once(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, tmp_path: Path
) -> None:
    src, out = buckets
    rows, files = 1_000, 6
    put_files(s3, src, {f"in/f{i}.csv": make_csv(rows) for i in range(files)})
    health_file = tmp_path / "health.json"
    worker = supervised(task_queue, tmp_path, "two", S3BATCH_MAX_CONCURRENT_FILES="4",
                        S3BATCH_HEALTH_FILE=str(health_file))
    try:
        worker.wait_ready()
        pids = child_pids(worker)
        assert sorted(pids) == [0, 1] and all(len(p) == 1 for p in pids.values()), worker.log()
        children = {p[0] for p in pids.values()}
        assert worker.proc.pid not in children
        # The image's check command on the supervisor's file: healthy once both processes poll.
        checked = await wait_for(lambda: (r := health_command(health_file)).returncode == 0 and r, 30, "healthy")
        assert "2 processes" in checked.stdout, checked.stdout
        assert re.search(r"file slots 2\+2", worker.log()), "S3BATCH_MAX_CONCURRENT_FILES is split"

        handle = await start(client, task_queue, slow_job(src, out), "two-procs")
        result = await handle.result()
        assert result.status == "succeeded" and result.totals.files_succeeded == files
        identities = await file_activity_identities(client, handle.id)
    finally:
        worker.stop()

    assert len(identities) == files, "each file ran once (one attempt)"
    ran_in = {int(identity.split("@")[0]) for identity in identities}
    assert ran_in == children, f"files ran in {ran_in}, the worker processes are {children}"
    entries = report(s3, out, "o/")["files"]
    assert len(entries) == files and all(e["status"] == "succeeded" for e in entries)
    for i in range(files):
        assert_exactly_once(s3, out, f"o/in/f{i}.csv/", rows)
    assert worker.proc.returncode == 0, worker.log()


@pytest.mark.slow
async def test_sigterm_to_the_supervisor_drains_every_process_and_exits_zero(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, tmp_path: Path
) -> None:
    src, out = buckets
    rows = 40_000
    s3.put_object(Bucket=src, Key="in/big.csv", Body=make_csv(rows))
    # The first worker is slow (40 chunks of 0.5 s), so the file is still in flight once the second has
    # started, however loaded the machine; the second finishes the rest quickly.
    first = supervised(task_queue, tmp_path, "a", S3BATCH_TEST_HANDLER_DELAY="0.5")
    second: WorkerProcess | None = None
    try:
        first.wait_ready()
        children = [p[0] for p in child_pids(first).values()]
        handle = await start(client, task_queue, slow_job(src, out, chunk_records=1_000,
                                                          heartbeat_timeout_seconds=30), "sigterm-procs")
        await wait_for(lambda: len(committed_parts(s3, out, "o/in/big.csv/")) >= 4, 60, "4 committed parts")
        second = worker_process(task_queue, tmp_path, "b", S3BATCH_TEST_HANDLER_DELAY="0.02").wait_ready()
        signalled = time.monotonic()
        first.proc.send_signal(signal.SIGTERM)

        async def retried() -> Any:
            pending = (await handle.describe()).raw_description.pending_activities
            return [p for p in pending if p.attempt >= 2 and p.state == 2]  # STARTED on attempt 2

        [pending] = await wait_for(retried, 60, "attempt 2 of the file running on the other worker")
        assert pending.last_failure.application_failure_info.type == WORKER_SHUTDOWN, pending.last_failure
        assert pending.last_worker_identity.startswith(f"{second.proc.pid}@")
        assert first.proc.wait(25) == 0, first.log()
        print(f"\nsupervisor of 2 processes exited {time.monotonic() - signalled:.1f} s after SIGTERM")
        assert not any(running(pid) for pid in children), "every worker process has exited"
        assert first.log().count("worker stopped") == 2, first.log()
        result = await handle.result()
        assert result.status == "succeeded"
    finally:
        first.stop()
        if second is not None:
            second.stop()

    [entry] = report(s3, out, "o/")["files"]
    # Handed over by the drain (attempt 1 stopped at a chunk boundary), not by the 30 s heartbeat timeout.
    assert entry["attempts"] >= 2 and entry["resumed_from_record"] > 0, entry
    assert_exactly_once(s3, out, "o/in/big.csv/", rows)


@pytest.mark.slow
async def test_sigkill_of_the_supervisor_leaves_no_worker_process_behind(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, tmp_path: Path
) -> None:
    src, out = buckets
    rows = 40_000
    s3.put_object(Bucket=src, Key="in/big.csv", Body=make_csv(rows))
    first = supervised(task_queue, tmp_path, "a", S3BATCH_TEST_HANDLER_DELAY="0.1")
    second: WorkerProcess | None = None
    try:
        first.wait_ready()
        children = [p[0] for p in child_pids(first).values()]
        handle = await start(client, task_queue, slow_job(src, out, chunk_records=1_000,
                                                          heartbeat_timeout_seconds=5), "sigkill-procs")
        await wait_for(lambda: len(committed_parts(s3, out, "o/in/big.csv/")) >= 4, 60, "4 committed parts")
        first.kill()  # a crashed container: the supervisor gets no chance to stop its children
        # The kernel kills them (PR_SET_PDEATHSIG): none is left polling Temporal.
        await wait_for(lambda: not any(running(pid) for pid in children), 10, f"worker processes {children} gone")
        second = worker_process(task_queue, tmp_path, "b").wait_ready()
        result = await handle.result()
        assert result.status == "succeeded"
    finally:
        first.stop()
        if second is not None:
            second.stop()

    [entry] = report(s3, out, "o/")["files"]
    assert entry["attempts"] >= 2 and entry["resumed_from_record"] > 0, entry
    assert_exactly_once(s3, out, "o/in/big.csv/", rows)
    assert "worker stopped" not in first.log(), "killed, not drained"


@pytest.mark.slow
async def test_a_killed_worker_process_is_restarted_by_the_supervisor(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, tmp_path: Path
) -> None:
    src, out = buckets
    health_file = tmp_path / "health.json"
    worker = supervised(task_queue, tmp_path, "a", S3BATCH_HEALTH_FILE=str(health_file),
                        S3BATCH_HEALTH_INTERVAL_SECONDS="1")
    try:
        worker.wait_ready()
        await wait_for(lambda: health_command(health_file).returncode == 0, 30, "healthy")
        [victim] = child_pids(worker)[1]
        os.kill(victim, signal.SIGKILL)
        await wait_for(lambda: len(child_pids(worker)[1]) == 2, 30, "worker process 1 started again", alive=[worker])
        assert re.search(rf"worker process 1 \(pid {victim}\) exited with signal SIGKILL", worker.log()), worker.log()
        [_, replacement] = child_pids(worker)[1]
        assert replacement != victim and running(replacement)
        await wait_for(lambda: worker.log().count("worker polling") == 3, 30, "the new process polling")
        await wait_for(lambda: health_command(health_file).returncode == 0, 30, "healthy again", alive=[worker])

        # And it works: a job on the restarted pair.
        put_files(s3, src, {f"in/f{i}.csv": make_csv(200) for i in range(4)})
        result = await (await start(client, task_queue, slow_job(src, out), "restarted")).result()
        assert result.status == "succeeded" and result.totals.files_succeeded == 4
    finally:
        worker.stop()
    assert worker.proc.returncode == 0, worker.log()
    assert not health_file.exists(), "removed on stop"

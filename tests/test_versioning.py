"""Upgrades with Worker Versioning (issue 32), on the real dev server: workers of two build IDs of one
Worker Deployment on one task queue, the second a release whose workflow change is incompatible with
running jobs and not behind ``workflow.patched`` (``tests.incompatible_release``).

- a job running when the new version is made current finishes on the version it started on;
- a job started after it runs on the new version only (read from each run's history: the worker
  version of every completed workflow task);
- a job spanning continue-as-new moves to the new version at the next boundary: its run, which would
  have started all its files on the old version, sees the new one current when a file ends, starts no
  more, hands its file in flight over at a chunk boundary and continues as new; the new run, on the new
  version, resumes that file from its checkpoint;
- a rollback sends new jobs back to the old version;
- nothing is processed twice (every chunk the handler saw, by version and job) and no workflow task
  fails anywhere (the new version never replays a run of the old one).

It also measures the time with no committed chunk during the switch (printed).
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle
from temporalio.common import VersioningBehavior, WorkerDeploymentVersion
from temporalio.worker import WorkerConfig, WorkerDeploymentConfig

from s3batch.client.deployments import describe_deployment, promote
from s3batch.config import Settings
from s3batch.dev.workers import WorkerProcess
from s3batch.messages import S3BatchResult
from s3batch.models import S3BatchInput
from s3batch.plugin import S3BatchPlugin
from s3batch.s3io import make_client
from tests.helpers import run, wait_for
from tests.helpers.data import put_files
from tests.helpers.jobs import new_id, progress
from tests.helpers.output import read_jsonl
from tests.helpers.workers import worker_process

pytestmark = pytest.mark.slow

CHUNK = 100
"""Records a chunk: 50 ms each in ``version_count``."""


@dataclass
class Chunk:
    build: str
    job: str
    file: int
    records: int
    at: float


def chunks(count_file: Path) -> list[Chunk]:
    """Every chunk the handler processed, in the order written."""
    if not count_file.exists():
        return []
    rows = [line.split() for line in count_file.read_text().splitlines()]
    return [Chunk(b, j, int(f), int(n), float(t)) for b, j, f, n, t in rows]


def put_job_files(s3: Any, bucket: str, job: str, rows: list[int]) -> None:
    """A CSV file of ``rows[i]`` rows as ``in/<job>/<i>.csv`` for each i, each row naming its job and file."""
    bodies = {
        f"in/{job}/{i:02d}.csv": ("job,id\n" + "".join(f"{job},{i}-{r}\n" for r in range(n))).encode()
        for i, n in enumerate(rows)
    }
    put_files(s3, bucket, bodies)


async def start_job(
    client: Client, task_queue: str, src: str, out: str, job: str, files_per_run: int = 500, **kw: Any
) -> WorkflowHandle[Any, Any]:
    spec = S3BatchInput(
        bucket=src,
        prefix=f"in/{job}/",
        output_bucket=out,
        output_prefix=f"o/{job}/",
        handler="version_count",
        chunk_records=CHUNK,
        group_max_files=1,
        heartbeat_timeout_seconds=20,
        **kw,
    )
    return await client.start_workflow(
        "S3BatchWorkflow",
        args=[spec.model_dump(mode="json", exclude_unset=True), {"files_per_run": files_per_run}],
        id=new_id(f"version-{job}"),
        task_queue=task_queue,
        result_type=S3BatchResult,
    )


async def run_builds(client: Client, handle: WorkflowHandle[Any, Any]) -> list[set[str]]:
    """For each run of the job, oldest first, the build IDs of the workers that completed its workflow
    tasks; fails on any failed workflow task (a non-determinism would show here)."""
    runs = [r async for r in client.list_workflows(f"WorkflowId = '{handle.id}'")]
    builds = []
    for one in sorted(runs, key=lambda r: r.start_time):
        events = (await client.get_workflow_handle(handle.id, run_id=one.run_id).fetch_history()).events
        failed = [e for e in events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED]
        assert not failed, [e.workflow_task_failed_event_attributes.failure.message for e in failed]
        builds.append(
            {
                e.workflow_task_completed_event_attributes.deployment_version.build_id
                for e in events
                if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
            }
        )
    return builds


def assert_output_once(s3: Any, out: str, job: str, rows: list[int]) -> None:
    for i, n in enumerate(rows):
        ids = [r["id"] for r in read_jsonl(s3, out, f"o/{job}/in/{job}/{i:02d}.csv/")]
        assert ids == [f"{i}-{r}" for r in range(n)], f"{job} file {i}: {len(ids)} records, not exactly once"


@pytest.fixture
def processes() -> Iterator[list[WorkerProcess]]:
    started: list[WorkerProcess] = []
    yield started
    for w in started:
        w.stop()


async def test_a_new_version_takes_new_runs_while_running_ones_finish_on_theirs_and_a_rollback_undoes_it(
    stack: Any, client: Client, s3: Any, buckets: tuple[str, str], tmp_path: Path, processes: list[WorkerProcess]
) -> None:
    src, out = buckets
    task_queue = f"tq-{uuid.uuid4().hex[:12]}"
    deployment = f"s3batch-{uuid.uuid4().hex[:8]}"
    count_file = tmp_path / "chunks.txt"
    env = {"S3BATCH_DEPLOYMENT_NAME": deployment, "S3BATCH_TEST_COUNT_FILE": str(count_file)}
    v1 = worker_process(task_queue, tmp_path, "v1", **env, S3BATCH_BUILD_ID="v1",
                        S3BATCH_HANDLER_MODULES="tests.version_handlers")
    v2 = worker_process(task_queue, tmp_path, "v2", **env, S3BATCH_BUILD_ID="v2",
                        S3BATCH_HANDLER_MODULES="tests.version_handlers,tests.incompatible_release")
    processes.extend([v1, v2])
    v1.wait_ready()
    v2.wait_ready()
    assert f"version {deployment}:v1" in v1.log() and f"version {deployment}:v2" in v2.log()
    await promote(client, deployment, "v1")

    # A: two files in flight together (3 s each), one run: it is running when v2 becomes current.
    # B: six files, two at once, all in one run unless a new version moves it: an 8 s one (started
    # first, the biggest) beside five of 0.5 s one after the other.
    sizes = {"a": [6_000] * 2, "b": [16_000] + [1_000] * 5, "c": [500] * 2, "d": [500] * 2}
    for job, rows in sizes.items():
        put_job_files(s3, src, job, rows)
    a = await start_job(client, task_queue, src, out, "a", max_concurrent_files=2)
    b = await start_job(client, task_queue, src, out, "b", max_concurrent_files=2)

    async def b_mid_first_run() -> bool:
        p = await progress(b)
        return p.run == 0 and p.files_succeeded >= 1 and p.files_in_flight > 0

    await wait_for(b_mid_first_run, 30, "job b in its first run, one file done, one in flight", alive=[v1, v2])
    assert (await progress(a)).files_in_flight == 2
    before = await progress(b)
    switched = (await promote(client, deployment, "v2")).current
    promoted_at = time.time()
    assert switched == "v2"
    c = await start_job(client, task_queue, src, out, "c")

    async def v1_runs() -> int | None:  # a's run, pinned to v1 (the server's visibility, so polled)
        v1_view = (await describe_deployment(client, deployment)).version("v1")
        return v1_view.running if v1_view else None

    assert await wait_for(v1_runs, 5, "a run of v1 counted by s3batch deploy status")
    for handle in (a, b, c):
        result = await asyncio.wait_for(handle.result(), 90)
        assert result.status == "succeeded", result

    back = await run("s3batch", "deploy", "rollback", "--deployment-name", deployment)
    assert back.code == 0 and "made v1 current again (was v2)" in back.stdout, back
    assert (await describe_deployment(client, deployment)).current == "v1"
    d = await start_job(client, task_queue, src, out, "d")
    assert (await asyncio.wait_for(d.result(), 60)).status == "succeeded"

    # Each run on one version; a on v1 (where it started), c on v2, d on v1 again, b from v1 to v2.
    builds = {job: await run_builds(client, h) for job, h in {"a": a, "b": b, "c": c, "d": d}.items()}
    assert builds["a"] == [{"v1"}], builds
    assert builds["c"] == [{"v2"}] and builds["d"] == [{"v1"}], builds
    assert all(len(run) == 1 for run in builds["b"]), builds
    assert builds["b"][0] == {"v1"} and builds["b"][-1] == {"v2"}, builds
    assert builds["b"] == sorted(builds["b"], key=lambda run: sorted(run)), f"b went back to v1: {builds}"

    shown = await run("s3batch", "status", b.id)
    assert shown.code == 0 and f"on {deployment}:v1 (pinned); run" in shown.stdout, shown
    assert shown.stdout.rstrip().endswith(f"on {deployment}:v2 (pinned)"), shown.stdout

    # Every record processed once, by the version its run was on.
    seen = chunks(count_file)
    for job, rows in sizes.items():
        handled = sum(ch.records for ch in seen if ch.job == job)
        assert handled == sum(rows), f"job {job}: {handled} records processed for {sum(rows)}"
        assert_output_once(s3, out, job, rows)
    by_job = {job: {ch.build for ch in seen if ch.job == job} for job in sizes}
    assert by_job == {"a": {"v1"}, "b": {"v1", "v2"}, "c": {"v2"}, "d": {"v1"}}, by_job
    b_v1 = [ch.at for ch in seen if ch.job == "b" and ch.build == "v1"]
    b_v2 = [ch.at for ch in seen if ch.job == "b" and ch.build == "v2"]
    assert max(b_v1) < min(b_v2), "job b processed on v1 after it moved to v2"
    # B moved at its next file end: no file started on v1 after that (one may have started as the
    # promotion landed), and its big file, in flight then, went on, resumed, on v2.
    b_files_v1 = {ch.file for ch in seen if ch.job == "b" and ch.build == "v1"}
    b_files_v2 = {ch.file for ch in seen if ch.job == "b" and ch.build == "v2"}
    assert len(b_files_v1) <= before.files_succeeded + before.files_in_flight + 1 < 6, (b_files_v1, before)
    assert 0 in b_files_v1 & b_files_v2, f"b's big file not handed over mid-file: v1 {b_files_v1}, v2 {b_files_v2}"

    # The switch: the longest time without a chunk of job b (the job that moved), and of any job.
    moved_gap = min(b_v2) - max(b_v1)
    stream = sorted(ch.at for ch in seen if ch.at >= promoted_at - 1 and ch.job in "abc")
    longest = max((later - earlier for earlier, later in itertools.pairwise(stream)), default=0.0)
    print(f"\nswitch to v2: job b moved with {moved_gap:.2f}s between its last v1 chunk and its first v2 chunk; "
          f"longest gap between chunks of any job after the promotion {longest:.2f}s")
    assert moved_gap < 10, moved_gap


def test_worker_version_from_the_environment_and_the_controllers_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("S3BATCH_DEPLOYMENT_NAME", "S3BATCH_BUILD_ID", "TEMPORAL_DEPLOYMENT_NAME", "TEMPORAL_WORKER_BUILD_ID"):
        monkeypatch.delenv(name, raising=False)
    assert Settings().worker_version() is None
    assert S3BatchPlugin.from_settings(Settings()).deployment_version is None

    monkeypatch.setenv("TEMPORAL_DEPLOYMENT_NAME", "orders")
    monkeypatch.setenv("TEMPORAL_WORKER_BUILD_ID", "5f8c")
    version = Settings().worker_version()
    assert version is not None and (version.deployment_name, version.build_id) == ("orders", "5f8c")
    monkeypatch.setenv("S3BATCH_BUILD_ID", "1.2.3")  # s3batch's own variable wins
    version = Settings().worker_version()
    assert version is not None and version.build_id == "1.2.3"

    monkeypatch.delenv("TEMPORAL_DEPLOYMENT_NAME")
    version = Settings().worker_version()
    assert version is not None and version.deployment_name == "s3batch"

    monkeypatch.delenv("S3BATCH_BUILD_ID")
    monkeypatch.delenv("TEMPORAL_WORKER_BUILD_ID")
    monkeypatch.setenv("S3BATCH_DEPLOYMENT_NAME", "s3batch")
    monkeypatch.setenv("S3BATCH_GIT_COMMIT", "0123456789abcdef0123")
    version = Settings().worker_version()
    assert version is not None and version.build_id.endswith("-0123456789ab")

    monkeypatch.setenv("S3BATCH_DEPLOYMENT_NAME", "s3batch.prod")
    with pytest.raises(ValueError, match="contains a dot"):
        Settings()


def test_the_plugin_makes_its_workers_poll_as_its_version_unless_they_have_their_own() -> None:
    version = WorkerDeploymentVersion("s3batch", "v7")
    config = S3BatchPlugin(make_client(), deployment_version=version).configure_worker(WorkerConfig())
    deployment = config.get("deployment_config")
    assert deployment is not None and deployment.version == version and deployment.use_worker_versioning
    assert deployment.default_versioning_behavior == VersioningBehavior.PINNED

    own = WorkerDeploymentConfig(WorkerDeploymentVersion("mine", "1"), use_worker_versioning=True)
    plugin = S3BatchPlugin(make_client(), deployment_version=version)
    config = plugin.configure_worker(WorkerConfig(deployment_config=own))
    assert config.get("deployment_config") is own
    assert S3BatchPlugin(make_client()).configure_worker(WorkerConfig()).get("deployment_config") is None
    with pytest.raises(ValueError, match="contains a dot"):
        S3BatchPlugin(deployment_version=WorkerDeploymentVersion("s3batch.prod", "v1"))

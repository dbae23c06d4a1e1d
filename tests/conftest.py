"""Fixtures: one real local stack (Temporal dev server + SeaweedFS) per test session, on free
loopback ports; a fresh task queue and fresh buckets per test; an in-process worker; worker
subprocesses (``workers``); the reliability row of a fault test (``reliability``). Helpers that are
not fixtures are in ``tests/helpers/``.

Under pytest-xdist each worker is a session of its own: its own stack, on ports from a range of its
own (``S3BATCH_PORT_RANGE``, set below from the worker's number), so no test shares a server with
another worker's. Tests that need a server (a fixture of the stack or a PostgreSQL, or the
``servers`` mark) are marked ``servers`` at collection: ``-m "not servers"`` is the quick loop
(``make test-quick``).
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from temporalio.client import Client
from temporalio.worker import Worker

from s3batch.dev.stack import PORT_RANGE_ENV, Stack, StackConfig, ensure_buckets, s3_client
from s3batch.dev.workers import WorkerProcess
from s3batch.plugin import S3BatchPlugin
from s3batch.s3io import make_client
from tests.helpers.sampled import TracedExamples
from tests.helpers.workers import record_reliability, worker_process

SERVER_FIXTURES = frozenset({"stack", "s3", "client", "buckets", "worker", "workers", "pg"})
"""Fixtures that start or use a real server: a test needing one is marked ``servers``."""


def _port_slot() -> None:
    """Give this xdist worker its own share of the port range (10000-22000, see ``s3batch.dev.stack``)."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not worker or not count or PORT_RANGE_ENV in os.environ:
        return
    index, total = int(worker.removeprefix("gw")), max(int(count), 1)
    width = 12000 // total
    os.environ[PORT_RANGE_ENV] = f"{10000 + index * width}-{10000 + (index + 1) * width - 20}"


_port_slot()

# No per-example deadline: it is a timing assertion, and a loaded machine (the suite's parallel workers
# share two cores) misses it without any defect (a 200 ms deadline failed at 216 ms). A test that sets
# its own settings keeps them.
settings.register_profile("s3batch", deadline=None)
settings.load_profile("s3batch")


LONG_FIRST = (
    "test_soak.py",
    "test_soak_checker.py",
    "test_sink_postgres_model.py",
    "test_report_scale.py",
    "test_cli_walls.py",
    "test_bench_smoke.py",
    "test_upgrade.py",
)
"""Modules of the longest tests, longest first (make test prints the 40 slowest): handed to the xdist workers
first, so the suite does not end with one worker still in a two-minute test while the others wait (in
collection order, the soak's group came last)."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if SERVER_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.servers)
    rank = {name: index for index, name in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each module's order is kept


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """A ``@given`` test traced by coverage for its first examples only (:mod:`tests.helpers.sampled`)."""
    handle = getattr(getattr(item, "obj", None), "hypothesis", None)
    if handle is None:
        return (yield)
    inner, sample = handle.inner_test, TracedExamples()
    handle.inner_test = sample.wrap(inner)
    try:
        return (yield)
    finally:
        handle.inner_test = inner
        sample.end()


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = Path(tmp_path_factory.mktemp("stack"))
    config = StackConfig.random_ports(root)
    # The server delays the first task of a run that continues as new less than a second after its own
    # start (history.workflowIdReuseMinimalInterval, a guard against a tight loop of runs), so a test's job
    # of many small runs waited most of a second a run; the tests' jobs are not about that guard.
    config.dynamic_config["history.workflowIdReuseMinimalInterval"] = "0s"
    stack = Stack(config)
    stack.start()
    # Everything built from the environment (boto3, envconfig, worker subprocesses) uses this stack.
    saved = {k: os.environ.get(k) for k in stack.config.env()}
    os.environ.update(stack.config.env())
    try:
        yield stack
    finally:
        stack.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(scope="session")
def s3(stack: Stack) -> Any:
    return s3_client(stack.config)


@pytest.fixture(scope="session")
async def client(stack: Stack) -> Client:
    return await Client.connect(stack.config.temporal_address, plugins=[S3BatchPlugin(make_client())])


@pytest.fixture
def task_queue() -> str:
    return f"tq-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def buckets(s3: Any) -> tuple[str, str]:
    """A fresh source and output bucket for this test."""
    tag = uuid.uuid4().hex[:10]
    src, out = f"src-{tag}", f"out-{tag}"
    ensure_buckets(s3, src, out)
    return src, out


@pytest.fixture
async def worker(client: Client, task_queue: str) -> AsyncIterator[Worker]:
    """An in-process worker on this test's task queue.

    Heartbeats reach the server at least every second whatever the job's heartbeat timeout (the SDK's
    default is 0.8 x the timeout), so tests that read checkpoints from the server (``s3batch status``,
    ``watch``) can give jobs a generous heartbeat timeout that a loaded machine never misses.
    """
    w = Worker(
        client,
        task_queue=task_queue,
        max_concurrent_activities=8,
        activity_executor=ThreadPoolExecutor(8),
        max_heartbeat_throttle_interval=timedelta(seconds=1),
        default_heartbeat_throttle_interval=timedelta(seconds=1),
    )
    async with w:
        yield w


FAULT_SUITE_HANDLERS = "tests.slow_handlers,tests.fault_handlers"


CALL_FAILED = pytest.StashKey[bool]()
"""Set on a test item whose call (the test's body) failed: its fixtures' teardown may then say more."""


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[pytest.TestReport]:
    report = yield
    if report.when == "call" and report.failed:
        item.stash[CALL_FAILED] = True
    return report


@pytest.fixture
def workers(
    request: pytest.FixtureRequest, task_queue: str, tmp_path: Path
) -> Iterator[Callable[..., WorkerProcess]]:
    """Start worker subprocesses (``worker_process``) on this test's task queue, each awaited until
    it polls, with the slow and fault test handlers; all are stopped at the end. When the test failed,
    the end of each worker's log is printed with it (a failure seen once in CI can be read afterwards:
    the SDK logs there why a workflow task failed)."""
    started: list[WorkerProcess] = []

    def start(name: str, **env: str) -> WorkerProcess:
        proc = worker_process(task_queue, tmp_path, name, S3BATCH_HANDLER_MODULES=FAULT_SUITE_HANDLERS, **env)
        started.append(proc)
        proc.wait_ready()
        return proc

    yield start
    for proc in started:
        proc.stop()
    if request.node.stash.get(CALL_FAILED, False):
        for proc in started:
            print(f"---- the end of worker {proc.name}'s log ----\n{proc.log()[-6000:]}", file=sys.stderr)


@pytest.fixture
def reliability(request: pytest.FixtureRequest) -> Callable[..., None]:
    """Record one row of the reliability table (docs/explanation/reliability.md) for this test: the fault and
    what was observed (an ``output_check``'s ``in_order`` and ``exact`` flags are asserted, not listed)."""

    def record(fault: str, **observed: Any) -> None:
        observed.pop("in_order", None)
        observed.pop("exact", None)
        record_reliability({"fault": fault, "test": request.node.nodeid, **observed})

    return record

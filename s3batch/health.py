"""Health signal of a running worker: a heartbeat file, and ``python -m s3batch.health`` to read it.

While the worker runs, :class:`HealthReporter` rewrites a small JSON file every few seconds with
whether the worker is polling and when the Temporal frontend last answered. The check command
reads that file, so a container ``HEALTHCHECK`` or a Kubernetes ``exec`` probe needs no open port:

    python -m s3batch.health              # healthy: polling, and the server answered recently
    python -m s3batch.health --liveness   # alive: polling, whatever the server's state

Exit status 0 means healthy, 1 unhealthy; one line on stdout says why. The file is removed as
soon as the worker begins to shut down (it no longer polls), so a draining or stopped worker is
unhealthy, and a hung or killed one is unhealthy once its last heartbeat is older than the
maximum age.

Environment:
    S3BATCH_HEALTH_FILE: where the file is written (the worker writes none when unset; the
        container image sets ``/tmp/s3batch-health.json``).
    S3BATCH_HEALTH_INTERVAL_SECONDS: how often the worker rewrites it (default 5).
    S3BATCH_HEALTH_MAX_AGE_SECONDS: older heartbeats are unhealthy (default 30).

A worker of several processes (``S3BATCH_WORKER_PROCESSES``, :mod:`s3batch.supervisor`) keeps the
same file and the same check: each process writes its own ``<file>.<index>`` and the supervisor
rewrites ``<file>`` from them (:func:`write_combined`), healthy only while every process polls, and
as old as the oldest of their heartbeats.

This module imports only the standard library at the top, so the check costs little more than
Python's start-up (about 0.2 s).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from temporalio.client import Client
    from temporalio.worker import Worker

FILE_ENV = "S3BATCH_HEALTH_FILE"
INTERVAL_ENV = "S3BATCH_HEALTH_INTERVAL_SECONDS"
MAX_AGE_ENV = "S3BATCH_HEALTH_MAX_AGE_SECONDS"
DEFAULT_INTERVAL = 5.0
DEFAULT_MAX_AGE = 30.0

log = logging.getLogger("s3batch.health")


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number") from None
    if value <= 0:
        raise ValueError(f"{name}={raw!r} must be positive")
    return value


def interval() -> float:
    """Seconds between two heartbeats: ``S3BATCH_HEALTH_INTERVAL_SECONDS``, default 5."""
    return _env_float(INTERVAL_ENV, DEFAULT_INTERVAL)


def health_file() -> Path | None:
    """The heartbeat file named by ``S3BATCH_HEALTH_FILE``, or None when it is unset."""
    raw = os.environ.get(FILE_ENV, "").strip()
    return Path(raw) if raw else None


class HealthReporter:
    """Keeps the heartbeat file fresh while the worker polls; removes it when the worker stops.

    Use it inside the worker's ``async with`` so that it exits first, at the start of the drain::

        async with worker, HealthReporter.from_env(client, worker, task_queue=tq):
            await stop.wait()

    Args:
        path: The file to write; None makes the reporter do nothing.
        client: The worker's client, used to ask the frontend whether it is serving.
        worker: The worker whose ``is_running`` tells whether it has started polling.
        task_queue: Recorded in the file, for people reading it.
        interval: Seconds between two heartbeats.
    """

    def __init__(
        self,
        path: Path | None,
        client: Client,
        worker: Worker,
        *,
        task_queue: str = "",
        interval: float = DEFAULT_INTERVAL,
    ) -> None:
        self.path = path
        self._client = client
        self._worker = worker
        self._task_queue = task_queue
        self._interval = interval
        self._task: asyncio.Task[None] | None = None
        self._last_server_ok: float | None = None
        self._server_was_ok = True

    @classmethod
    def from_env(cls, client: Client, worker: Worker, *, task_queue: str = "") -> HealthReporter:
        return cls(
            health_file(),
            client,
            worker,
            task_queue=task_queue,
            interval=interval(),
        )

    async def __aenter__(self) -> HealthReporter:
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._remove()  # a file left by an earlier process in the same container says nothing
            self._task = asyncio.create_task(self._run(), name="s3batch-health")
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._remove()

    async def _run(self) -> None:
        while True:
            polling = await self.beat()
            # Until the worker has validated its namespace and started polling, look again soon, so
            # that it reports healthy within a moment of being ready rather than a whole interval.
            await asyncio.sleep(self._interval if polling else min(self._interval, 0.25))

    async def beat(self) -> bool:
        """Write one heartbeat; returns whether the worker is polling."""
        polling = self._worker.is_running
        if await self._server_ok():
            self._last_server_ok = time.time()
        state = {
            "pid": os.getpid(),
            "state": "polling" if polling else "starting",
            "task_queue": self._task_queue,
            "written_at": time.time(),
            "server_ok_at": self._last_server_ok,
        }
        self._write(state)
        return polling

    async def _server_ok(self) -> bool:
        # GetSystemInfo is the call every SDK makes on connect: cheap, allowed for any authenticated
        # client (Temporal Cloud API keys and mTLS included) and independent of the namespace.
        from temporalio.api.workflowservice.v1 import GetSystemInfoRequest

        try:
            await self._client.workflow_service.get_system_info(
                GetSystemInfoRequest(), timeout=timedelta(seconds=min(self._interval, 5.0))
            )
        except Exception as err:  # noqa: BLE001 - any failure means "not answering"; logged once
            if self._server_was_ok:
                log.warning("Temporal frontend not answering (health check): %s", err)
            self._server_was_ok = False
            return False
        if not self._server_was_ok:
            log.info("Temporal frontend answering again")
        self._server_was_ok = True
        return True

    def _write(self, state: dict[str, Any]) -> None:
        assert self.path is not None
        write_state(self.path, state)

    def _remove(self) -> None:
        if self.path is not None:
            remove(self.path)


def write_state(path: Path, state: dict[str, Any]) -> None:
    """Replace the heartbeat file ``path`` with ``state`` atomically (a reader never sees half a file)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(state))
        os.replace(tmp, path)
    except OSError as err:
        log.warning("cannot write health file %s: %s", path, err)


def remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def process_file(path: Path, index: int) -> Path:
    """The heartbeat file of worker process ``index`` of a supervisor whose file is ``path``."""
    return path.with_name(f"{path.name}.{index}")


def _read_state(path: Path) -> dict[str, Any] | None:
    try:
        state = json.loads(path.read_text())
        float(state["written_at"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return state if isinstance(state, dict) else None


def combine(states: list[dict[str, Any] | None], *, pid: int, task_queue: str, now: float) -> dict[str, Any]:
    """A supervisor's heartbeat from those of its processes (None: a process with no readable file).

    Polling only if every process polls; written as long ago as the oldest process's heartbeat (a
    stuck process makes the whole worker stale); the server last answered when it last answered
    the process that heard from it least recently.
    """
    present = [s for s in states if s is not None]
    polling = sum(1 for s in present if s.get("state") == "polling")
    complete = len(present) == len(states)
    server_ok = [float(t) for s in present if (t := s.get("server_ok_at")) is not None]
    return {
        "pid": pid,
        "state": "polling" if complete and polling == len(states) else "starting",
        "task_queue": task_queue,
        "processes": len(states),
        "processes_polling": polling,
        "written_at": min(float(s["written_at"]) for s in present) if complete and present else now,
        "server_ok_at": min(server_ok) if server_ok and complete and len(server_ok) == len(states) else None,
    }


def write_combined(path: Path, processes: int, *, task_queue: str) -> bool:
    """Rewrite a supervisor's heartbeat file ``path`` from its ``processes`` processes' files
    (:func:`process_file`); returns whether every process polls."""
    states = [_read_state(process_file(path, i)) for i in range(processes)]
    state = combine(states, pid=os.getpid(), task_queue=task_queue, now=time.time())
    write_state(path, state)
    return bool(state["state"] == "polling")


def check(
    path: Path, *, max_age: float = DEFAULT_MAX_AGE, liveness: bool = False, now: float | None = None
) -> tuple[bool, str]:
    """Judge a heartbeat file.

    Args:
        path: The file the worker writes.
        max_age: A heartbeat (or the server's last answer) older than this many seconds is unhealthy.
        liveness: Only ask whether the worker is alive and polling, not whether the server answers
            (for a Kubernetes liveness probe: restarting workers does not bring a server back).
        now: The current time (tests).

    Returns:
        Whether the worker is healthy, and one line saying why.
    """
    now = time.time() if now is None else now
    try:
        state = json.loads(path.read_text())
        written_at = float(state["written_at"])
    except FileNotFoundError:
        return False, f"no heartbeat file at {path}: the worker is not running, or is shutting down"
    except (OSError, ValueError, KeyError, TypeError) as err:
        return False, f"unreadable heartbeat file {path}: {err}"
    age = now - written_at
    if age > max_age:
        return False, f"last heartbeat {age:.0f}s ago (limit {max_age:.0f}s): the worker is stuck or gone"
    processes = state.get("processes")
    if state.get("state") != "polling":
        if processes:
            return False, f"{state.get('processes_polling', 0)} of {processes} worker processes polling"
        return False, f"worker is {state.get('state')!r}, not polling yet"
    if not liveness:
        server_ok_at = state.get("server_ok_at")
        if server_ok_at is None:
            return False, "worker has not reached the Temporal frontend yet"
        if now - float(server_ok_at) > max_age:
            return False, f"Temporal frontend has not answered for {now - float(server_ok_at):.0f}s"
    queue = state.get("task_queue") or "?"
    who = f"pid {state.get('pid')}, {processes} processes" if processes else f"pid {state.get('pid')}"
    return True, f"polling task queue {queue!r} ({who}), heartbeat {max(age, 0):.1f}s ago"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m s3batch.health", description="Exit 0 if the s3batch worker is healthy, 1 if not."
    )
    parser.add_argument("--file", help=f"heartbeat file (default: ${FILE_ENV})")
    parser.add_argument("--max-age", type=float, help=f"seconds (default: ${MAX_AGE_ENV} or {DEFAULT_MAX_AGE:g})")
    parser.add_argument("--liveness", action="store_true", help="ignore whether the Temporal server answers")
    args = parser.parse_args(argv)
    try:
        path = Path(args.file) if args.file else health_file()
        max_age = args.max_age if args.max_age is not None else _env_float(MAX_AGE_ENV, DEFAULT_MAX_AGE)
    except ValueError as err:
        sys.stdout.write(f"unhealthy: {err}\n")
        return 1
    if path is None:
        sys.stdout.write(f"unhealthy: {FILE_ENV} is not set, so the worker writes no heartbeat\n")
        return 1
    healthy, reason = check(path, max_age=max_age, liveness=args.liveness)
    sys.stdout.write(f"{'healthy' if healthy else 'unhealthy'}: {reason}\n")
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())

"""Every core of a worker: ``s3batch-worker`` with several processes (``S3BATCH_WORKER_PROCESSES``).

A file's activity is Python-bound (parsing, handlers, encoding hold the GIL), so one worker process
uses one core whatever the container has. With ``Settings.processes()`` above 1, ``s3batch-worker``
becomes this supervisor: it starts that many worker processes, each one today's single worker
(``python -m s3batch.worker`` with ``S3BATCH_WORKER_PROCESSES=1``) polling the same task queue with
its share of ``S3BATCH_MAX_CONCURRENT_FILES``, and it does no Temporal work itself. The Temporal
server spreads files over the processes as over any workers.

Why ``subprocess`` re-running the worker module, not ``multiprocessing``: a child is then exactly
the process a one-process worker is (settings read from its environment, its own Temporal runtime,
its own SIGTERM drain and exit status), nothing is pickled, and nothing is forked from a process
holding threads; ``multiprocessing``'s spawn context would re-import the same module anyway, with
less say over the environment and the exit.

- **Children die with the supervisor.** Each child asks the kernel (Linux ``PR_SET_PDEATHSIG``) to
  SIGKILL it when the supervisor dies, so a SIGKILLed supervisor (a crashed or killed container)
  leaves no process polling Temporal: its files resume on other workers after their heartbeat
  timeout, as for a killed one-process worker.
- **SIGTERM/SIGINT** is forwarded to every child; each drains as a one-process worker does (files
  stop at their next chunk boundary and hand over about a second later) and the supervisor exits
  0 once all have exited (1 if one failed or overstayed the drain budget plus a margin).
- **A child that exits** while the supervisor is not stopping is restarted, after 1 s, doubling up to
  30 s while it keeps exiting within 30 s of its start.
- **Health**: child ``i`` writes ``<S3BATCH_HEALTH_FILE>.<i>``; the supervisor rewrites
  ``S3BATCH_HEALTH_FILE`` from them (:func:`s3batch.health.write_combined`), so
  ``python -m s3batch.health`` is healthy only while every process polls.
- **Metrics**: with ``S3BATCH_METRICS_ADDRESS=host:port``, child ``i`` serves on ``host:port+i``.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from types import FrameType

from s3batch import health
from s3batch.config import Settings

log = logging.getLogger("s3batch.supervisor")

SUPERVISOR_PID_ENV = "S3BATCH_SUPERVISOR_PID"
"""Set in a child's environment: the supervisor's pid. Marks the process as a child (see :func:`die_with_parent`)."""

FIRST_BACKOFF = 1.0
MAX_BACKOFF = 30.0
STABLE_SECONDS = 30.0
"""A child that ran this long before exiting is restarted after FIRST_BACKOFF again."""
DRAIN_MARGIN = 15.0
"""After SIGTERM, children still running after the drain budget plus this are SIGKILLed."""
PR_SET_PDEATHSIG = 1


def shares(slots: int, processes: int) -> list[int]:
    """``slots`` file slots shared out between ``processes`` processes, as evenly as possible, at
    least one each: ``shares(8, 3) == [3, 3, 2]``."""
    base, extra = divmod(slots, processes)
    return [max(1, base + (1 if i < extra else 0)) for i in range(processes)]


def die_with_parent(parent_pid: int) -> None:
    """Have the kernel SIGKILL this process when its parent exits (Linux; elsewhere nothing).

    Called first thing in a child. If the parent died before the request took effect, the child has
    already been re-parented: it exits at once rather than run unsupervised.
    """
    if sys.platform == "linux":
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            log.warning("prctl(PR_SET_PDEATHSIG) failed (errno %d): this process may outlive its supervisor",
                        ctypes.get_errno())
    if os.getppid() != parent_pid:
        sys.stderr.write(f"s3batch-worker: {SUPERVISOR_PID_ENV}={parent_pid} is not this process's parent: "
                         "its supervisor is gone (or the variable leaked into this environment; unset it)\n")
        os._exit(1)


@dataclass
class _Child:
    index: int
    slots: int
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    start_at: float = 0.0
    backoff: float = FIRST_BACKOFF


class Supervisor:
    """Runs ``processes`` worker processes until SIGTERM/SIGINT; :meth:`run` returns the exit status.

    Args:
        settings: The worker's settings (task queue, slots, drain budget, metrics address).
        processes: How many worker processes (at least 2; one needs no supervisor).
        command: The command of a child (default: this interpreter running ``s3batch.worker``).
    """

    def __init__(self, settings: Settings, processes: int, command: list[str] | None = None) -> None:
        self.settings = settings
        self.command = command or [sys.executable, "-m", "s3batch.worker"]
        self.children = [_Child(i, n) for i, n in enumerate(shares(settings.max_concurrent_files, processes))]
        self.health_path = health.health_file()
        self.health_interval = health.interval()
        self._next_beat = 0.0
        self._stop_signal: int | None = None

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        if self.health_path is not None:
            self.health_path.parent.mkdir(parents=True, exist_ok=True)
            health.remove(self.health_path)
        log.info(
            "supervisor (pid %d) running %d worker processes on task queue %r, file slots %s",
            os.getpid(),
            len(self.children),
            self.settings.task_queue,
            "+".join(str(c.slots) for c in self.children),
        )
        while self._stop_signal is None:
            now = time.monotonic()
            for child in self.children:
                self._look_after(child, now)
            self._beat(now)
            time.sleep(0.1)
        return self._drain(self._stop_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._stop_signal = signum

    def _look_after(self, child: _Child, now: float) -> None:
        """Start a child that is due, and schedule the restart of one that exited."""
        if child.proc is None:
            if now >= child.start_at:
                self._start(child, now)
            return
        code = child.proc.poll()
        if code is None:
            return
        ran = now - child.started_at
        if ran >= STABLE_SECONDS:
            child.backoff = FIRST_BACKOFF
        delay, child.backoff = child.backoff, min(child.backoff * 2, MAX_BACKOFF)
        log.warning(
            "worker process %d (pid %d) exited with %s after %.0fs; restarting it in %.0fs",
            child.index, child.proc.pid, _status(code), ran, delay,
        )
        child.proc, child.start_at = None, now + delay
        if self.health_path is not None:
            health.remove(health.process_file(self.health_path, child.index))  # a killed child leaves one

    def _start(self, child: _Child, now: float) -> None:
        child.proc = subprocess.Popen(self.command, env=self._child_env(child), stdin=subprocess.DEVNULL)
        child.started_at = now
        log.info("worker process %d started (pid %d, %d file slots)", child.index, child.proc.pid, child.slots)

    def _child_env(self, child: _Child) -> dict[str, str]:
        env = {
            **os.environ,
            "S3BATCH_WORKER_PROCESSES": "1",
            "S3BATCH_MAX_CONCURRENT_FILES": str(child.slots),
            SUPERVISOR_PID_ENV: str(os.getpid()),
        }
        if self.health_path is not None:
            env[health.FILE_ENV] = str(health.process_file(self.health_path, child.index))
        host, _, port = self.settings.metrics_address.rpartition(":")
        if port.isdigit() and int(port) > 0:
            env["S3BATCH_METRICS_ADDRESS"] = f"{host}:{int(port) + child.index}"
        return env

    def _beat(self, now: float) -> None:
        if self.health_path is None or now < self._next_beat:
            return
        polling = health.write_combined(self.health_path, len(self.children), task_queue=self.settings.task_queue)
        # Until every process polls, look again soon (as a one-process worker's reporter does).
        self._next_beat = now + (self.health_interval if polling else min(self.health_interval, 0.25))

    def _drain(self, signum: int) -> int:
        """Forward ``signum`` to every child, wait for all to exit; 0 if all exited 0."""
        if self.health_path is not None:
            health.remove(self.health_path)  # draining: unhealthy at once, as a one-process worker
        running = [c.proc for c in self.children if c.proc is not None and c.proc.poll() is None]
        log.info("%s: stopping %d worker processes (they drain and hand their files over)",
                 signal.Signals(signum).name, len(running))
        for proc in running:
            proc.send_signal(signum)
        deadline = time.monotonic() + self.settings.graceful_shutdown_seconds + DRAIN_MARGIN
        failed = 0
        for proc in running:
            try:
                code = proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.error("worker process pid %d still running after the drain budget: killing it", proc.pid)
                proc.kill()
                code = proc.wait()
            if code != 0:
                failed += 1
                log.error("worker process pid %d exited with %s while stopping", proc.pid, _status(code))
        log.info("supervisor stopped")
        return 1 if failed else 0


def _status(code: int) -> str:
    return f"signal {signal.Signals(-code).name}" if code < 0 else f"status {code}"

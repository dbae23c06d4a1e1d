"""A real s3batch worker in a subprocess, for the tests, the benchmark and the dev scripts.

``WorkerProcess`` starts ``python -m s3batch.worker`` (or another release's ``worker.py``, see
:mod:`s3batch.dev.releases`) with the current environment (the local stack's, once
``s3batch-stack env`` or a test fixture set it), a task queue of its own and a log file, and stops it
the way a deploy does (SIGTERM, then SIGKILL if it overstays).

It runs one worker process (``S3BATCH_WORKER_PROCESSES=1``) unless asked for more, whatever the
machine's cores: a signal to it (SIGKILL, SIGSTOP) then reaches the very process that runs the files.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path


class WorkerProcess:
    """A worker in a subprocess, with the current environment plus ``env`` (which wins) and a log
    file ``<log_dir>/worker-<name>.log``.

    ``python`` is the interpreter (default: the current one); ``script`` a ``worker.py`` to run
    (with ``args``) instead of the module ``s3batch.worker``; ``cwd`` its working directory (default: the current
    one, so handler modules named by ``S3BATCH_HANDLER_MODULES`` import from there); ``drop_env``
    names variables of this process not to pass on; ``processes`` is ``S3BATCH_WORKER_PROCESSES``
    (above 1: a supervisor and that many worker processes, see :mod:`s3batch.supervisor`).
    """

    what = "worker"
    ready_timeout: float = 90
    """A hang guard, not a measure: a worker process imports pyarrow, boto3 and the SDK (about 1 s alone), and
    on a machine loaded to 12 by parallel suites a supervisor's two processes took over 30 s."""

    def __init__(
        self,
        task_queue: str,
        log_dir: Path,
        name: str,
        *,
        python: Path | str = sys.executable,
        script: Path | None = None,
        args: tuple[str, ...] = (),
        cwd: Path | None = None,
        drop_env: tuple[str, ...] = (),
        env: Mapping[str, str] | None = None,
        processes: int = 1,
    ) -> None:
        self.name = name
        self.processes = processes
        self.log_path = log_dir / f"worker-{name}.log"
        full_env = {
            **{k: v for k, v in os.environ.items() if k not in drop_env},
            "S3BATCH_TASK_QUEUE": task_queue,
            "S3BATCH_GRACEFUL_SHUTDOWN_SECONDS": "20",
            "PYTHONUNBUFFERED": "1",
            "S3BATCH_WORKER_PROCESSES": str(processes),
            **(env or {}),
        }
        command = [str(python), str(script), *args] if script else [str(python), "-m", "s3batch.worker"]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                command, cwd=cwd, env=full_env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float | None = None) -> WorkerProcess:
        """Wait until the worker logs ``worker polling`` (each of its ``processes``); fails at once if it
        exited, with its log."""
        timeout = self.ready_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.log().count("worker polling") >= self.processes:
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.what} {self.name} exited with {self.proc.returncode}:\n{self.log()[-4000:]}")
            time.sleep(0.05)
        raise TimeoutError(f"{self.what} {self.name} not ready after {timeout:g}s:\n{self.log()[-4000:]}")

    def peak_rss_kib(self) -> int | None:
        """``VmHWM`` (peak resident set) of the live process, in KiB; None once it has exited."""
        return memory_kib(self.proc.pid).get("VmHWM")

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def terminate(self, timeout: float = 30) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def pause(self) -> None:
        """Freeze the worker (SIGSTOP): alive but silent, like a process stuck in a long GC or swap."""
        self.proc.send_signal(signal.SIGSTOP)

    def unpause(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def stop(self, timeout: float = 10) -> None:
        """End the worker if it still runs: SIGTERM (it drains and exits, and under coverage saves its
        data), then SIGKILL if it has not exited within ``timeout`` seconds."""
        if self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGCONT)  # a frozen worker must run to see the SIGTERM
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def memory_kib(pid: int) -> dict[str, int]:
    """``VmRSS`` and ``VmHWM`` (peak RSS) of a process, in KiB, from ``/proc/<pid>/status`` (empty
    if the process is gone)."""
    values: dict[str, int] = {}
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return values
    for line in lines:
        name, _, rest = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            values[name] = int(rest.split()[0])
    return values

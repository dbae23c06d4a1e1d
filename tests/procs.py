"""Real worker processes for the crash and deploy tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class WorkerProcess:
    """``worker.py`` in a subprocess, with the stack's environment and a log file.

    ``python``, ``script`` and ``cwd`` default to this checkout's worker under the current
    interpreter (``tests.release.ReleaseWorker`` runs another release's instead); ``drop_env`` names
    variables of this process not to pass on.
    """

    what = "worker"
    ready_timeout: float = 30

    def __init__(
        self,
        task_queue: str,
        log_dir: Path,
        name: str,
        *,
        python: Path | str = sys.executable,
        script: Path = ROOT / "worker.py",
        cwd: Path = ROOT,
        drop_env: tuple[str, ...] = (),
        **env: str,
    ) -> None:
        self.log_path = log_dir / f"worker-{name}.log"
        full_env = {
            **{k: v for k, v in os.environ.items() if k not in drop_env},
            "S3BATCH_TASK_QUEUE": task_queue,
            "S3BATCH_HANDLER_MODULES": "tests.slow_handlers",
            "S3BATCH_GRACEFUL_SHUTDOWN_SECONDS": "20",
            "PYTHONUNBUFFERED": "1",
            **env,
        }
        log = open(self.log_path, "wb")  # noqa: SIM115 - the child owns it
        self.proc = subprocess.Popen(
            [str(python), str(script)],
            cwd=cwd,
            env=full_env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        log.close()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float | None = None) -> None:
        timeout = self.ready_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if "worker polling" in self.log():
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.what} exited with {self.proc.returncode}:\n{self.log()}")
            time.sleep(0.1)
        raise TimeoutError(f"{self.what} not ready after {timeout}s:\n{self.log()}")

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def terminate(self, timeout: float = 30) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

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


# ---------------------------------------------------------------- helpers for the fault suite


def pause(worker: WorkerProcess) -> None:
    """Freeze the worker (SIGSTOP): alive but silent, like a process stuck in a long GC or swap."""
    worker.proc.send_signal(signal.SIGSTOP)


def unpause(worker: WorkerProcess) -> None:
    worker.proc.send_signal(signal.SIGCONT)


def memory_kib(pid: int) -> dict[str, int]:
    """``VmRSS`` and ``VmHWM`` (peak RSS) of a process, in KiB, from ``/proc/<pid>/status``."""
    values: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            values[name] = int(rest.split()[0])
    return values


RELIABILITY_FILE_ENV = "S3BATCH_RELIABILITY_FILE"
"""When set, the fault tests append one JSON row per observed fault to this file
(``scripts/reliability_report.py`` sets it and turns the rows into docs/RELIABILITY.md)."""


def record_reliability(row: dict[str, object]) -> None:
    path = os.environ.get(RELIABILITY_FILE_ENV)
    if path:
        import json

        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")

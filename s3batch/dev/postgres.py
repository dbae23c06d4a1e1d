"""A throwaway PostgreSQL server for the tests and the benchmark (``PostgresServer``): ``initdb`` and
``pg_ctl`` in a temporary folder, on a free loopback port, removed at the end. The server binaries are
found at run time (``pg_config --bindir``, then ``/usr/lib/postgresql/*/bin``, then ``PATH``); as
root they run as the ``postgres`` user (they refuse root). :func:`server_bindir` is None without them:
the callers skip, saying why. Dev tooling: nothing of s3batch's runtime imports it."""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

import psycopg

from s3batch.dev.stack import free_port_block


def server_bindir() -> Path | None:
    """The folder of ``initdb`` and ``pg_ctl``, or None."""
    candidates: list[str] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False)
        candidates.append(out.stdout.strip())
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    candidates += [os.path.dirname(p) for p in filter(None, [shutil.which("initdb")])]
    for folder in candidates:
        if folder and (Path(folder) / "initdb").exists() and (Path(folder) / "pg_ctl").exists():
            return Path(folder)
    return None


class PostgresServer:
    """One PostgreSQL cluster in its own temporary folder (``start``, ``stop``, ``restart``, ``dsn``)."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.port = free_port_block([0])  # in this process's range: parallel test workers never collide
        self.root = Path(tempfile.mkdtemp(prefix="s3batch-pg-"))
        self.data = self.root / "data"
        self._as: list[str] = []
        if os.geteuid() == 0:
            # The server refuses to run as root: the folder belongs to the postgres user, who runs it.
            user = pwd.getpwnam("postgres")
            os.chown(self.root, user.pw_uid, user.pw_gid)
            self._as = ["runuser", "-u", "postgres", "--"]
        self.dsn = f"postgresql://app@127.0.0.1:{self.port}/postgres"

    def _run(self, *argv: str) -> None:
        done = subprocess.run([*self._as, *argv], capture_output=True, text=True, check=False, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv[:2])} failed ({done.returncode}): {done.stdout}{done.stderr}")

    def start(self) -> None:
        if not self.data.exists():
            self._run(str(self.bindir / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "app", "--no-sync")
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-o", options, "-l", str(self.root / "log"),
                  "-w", "start")

    def stop(self, mode: str = "fast") -> None:
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def restart(self) -> None:
        self.stop("immediate")
        self.start()

    def remove(self) -> None:
        with contextlib.suppress(RuntimeError):
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)

    def execute(self, statement: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            cur = conn.execute(statement, params)
            return cur.fetchall() if cur.description else []

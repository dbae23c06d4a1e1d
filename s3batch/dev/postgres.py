"""A PostgreSQL server of its own: throwaway for the tests and the benchmark, or the local one of
``s3batch-stack postgres`` (:func:`local_up`, :func:`local_down`) to try an import into a table.

``PostgresServer`` runs ``initdb`` and ``pg_ctl`` in a folder of its own (a temporary one, removed at the end,
unless given one) on a loopback port. The server binaries are found at run time (``pg_config --bindir``, then
``/usr/lib/postgresql/*/bin``, then ``PATH``); as root they run as the ``postgres`` user (they refuse root).
:func:`server_bindir` is None without them: the callers skip, saying why. Dev tooling: nothing of s3batch's
runtime imports it."""

from __future__ import annotations

import contextlib
import glob
import json
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from s3batch.dev.stack import free_port_block, port_free
from s3batch.sinks.spec import postgres_variable


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
    """One PostgreSQL cluster in a folder of its own (``start``, ``stop``, ``restart``, ``dsn``).

    Args:
        root: Its folder (default: a new temporary one); the cluster is ``root/data``, its log ``root/log``.
        port: Its port on 127.0.0.1 (default: a free one in this process's range: parallel test workers
            never collide).
    """

    def __init__(self, bindir: Path, root: Path | None = None, port: int | None = None) -> None:
        self.bindir = bindir
        self.port = port or free_port_block([0])
        self.root = root or Path(tempfile.mkdtemp(prefix="s3batch-pg-"))
        self.root.mkdir(parents=True, exist_ok=True)
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
        if self._as and subprocess.run([*self._as, "test", "-w", str(self.root)], check=False).returncode:
            raise RuntimeError(
                f"the postgres user (the server refuses to run as root) cannot write {self.root}: a folder above it "
                "is closed to other users; give a folder it can reach (e.g. under /tmp)"
            )
        if not self.data.exists():
            self._run(str(self.bindir / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "app", "--no-sync")
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-o", options, "-l", str(self.root / "log"),
                  "-w", "start")

    def running(self) -> bool:
        """Whether the cluster's server runs (``pg_ctl status``)."""
        if not self.data.exists():
            return False
        argv = [*self._as, str(self.bindir / "pg_ctl"), "-D", str(self.data), "status"]
        return subprocess.run(argv, capture_output=True, check=False, timeout=60).returncode == 0

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
        import psycopg  # here: s3batch-stack imports this module, and needs no database driver

        with psycopg.connect(self.dsn, autocommit=True) as conn:
            cur = conn.execute(statement, params)
            return cur.fetchall() if cur.description else []


# ------------------------------------------------------------------------------ s3batch-stack postgres

LOCAL_CONNECTION = "local"
"""The connection name ``s3batch-stack postgres`` gives its server by default (``"connection": "local"``)."""
LOCAL_PORT = 15432
"""Its port by default (or ``--pg-port``; a free one when this one is taken)."""


def local_state(root: Path) -> Path:
    """Where ``s3batch-stack postgres`` records the server it started (its port and connection name)."""
    return root / "postgres.json"


def local_up(root: Path, port: int | None = None, connection: str = LOCAL_CONNECTION) -> dict[str, Any]:
    """Start the local PostgreSQL of the stack folder ``root`` (its data in ``root/postgres``, kept across
    restarts), or find it running; what :func:`local_lines` prints.

    Raises:
        RuntimeError: No PostgreSQL server binaries, or the server did not start (its output).
    """
    bindir = server_bindir()
    if bindir is None:
        raise RuntimeError(
            "PostgreSQL server binaries (initdb, pg_ctl) not found: install PostgreSQL 15 (Debian: "
            "apt-get install postgresql-15), or set PATH to its bin folder"
        )
    state = local_state(root)
    saved = json.loads(state.read_text()) if state.exists() else {}
    if saved and PostgresServer(bindir, root / "postgres", saved["port"]).running():
        return {**saved, "already_running": True}
    chosen = port or saved.get("port") or LOCAL_PORT
    if not port and not port_free(chosen):
        chosen = free_port_block([0])
    server = PostgresServer(bindir, root / "postgres", chosen)
    server.start()
    found = {"port": chosen, "dsn": server.dsn, "connection": connection, "data": str(server.data)}
    state.write_text(json.dumps(found))
    return found


def local_lines(found: dict[str, Any]) -> list[str]:
    """What ``s3batch-stack postgres up`` prints: the DSN, the variable to export, a sink that uses it. Every
    line but the ``export`` is a shell comment: ``eval "$(s3batch-stack postgres up)"`` sets the variable."""
    variable = postgres_variable(found["connection"], "DSN")
    sink = json.dumps({"type": "postgres", "connection": found["connection"], "table": "public.your_table"})
    running = "   (already running)" if found.get("already_running") else ""
    return [
        f"# PostgreSQL {found['dsn']}   data in {found['data']}{running}",
        f"export {variable}={found['dsn']}",
        f"# psql {found['dsn']}",
        f"# s3batch start ... --sink '{sink}'",
        "# s3batch-stack postgres down   stops it (the data stays)",
    ]


def local_down(root: Path) -> bool:
    """Stop the local PostgreSQL of ``root`` (its data stays); False when none was started."""
    state = local_state(root)
    bindir = server_bindir()
    if not state.exists() or bindir is None:
        return False
    server = PostgresServer(bindir, root / "postgres", json.loads(state.read_text())["port"])
    if server.running():
        server.stop()
    state.unlink()
    return True

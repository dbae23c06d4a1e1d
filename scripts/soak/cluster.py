"""The system the soak runs and breaks: the local stack (:class:`s3batch.dev.stack.Stack`: the Temporal dev
server on its SQLite file, SeaweedFS), a PostgreSQL server (:class:`s3batch.dev.postgres.PostgresServer`),
the S3 fault proxy (:class:`s3batch.dev.faultproxy.FaultProxy`) and worker slots
(:class:`s3batch.dev.workers.WorkerProcess`), each restartable on the same ports and data.

Workers declare a Worker Deployment version (``soak`` / ``b1``, ``b2``...): an upgrade (:meth:`Cluster.upgrade`)
starts the next build beside the current one, makes it current, and moves the other slots to it once no run
is pinned to the old build any more. Some slots reach S3 through the proxy, one directly; one slot is a
supervisor of two worker processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from temporalio.client import Client

from s3batch.dev.faultproxy import FaultProxy
from s3batch.dev.postgres import PostgresServer, server_bindir
from s3batch.dev.stack import Stack, StackConfig, ensure_buckets, s3_client
from s3batch.dev.workers import WorkerProcess

ROOT = Path(__file__).resolve().parents[2]
SOURCE_BUCKET, OUTPUT_BUCKET = "soak-src", "soak-out"
CONNECTION = "soak"
"""The PostgreSQL connection name the jobs use (``S3BATCH_POSTGRES_SOAK_DSN``)."""
DEPLOYMENT = "soak"
TABLES = {
    "soak_insert": "rid text NOT NULL, k text, name text NOT NULL, qty integer CHECK (qty >= 0), "
    "loaded_at timestamptz NOT NULL DEFAULT now()",
    "soak_upsert": "k text PRIMARY KEY, rid text NOT NULL, name text NOT NULL, qty integer CHECK (qty >= 0)",
}
"""The tables the PostgreSQL jobs write (shared by every job: a row names its job in ``rid``). The insert table
has no unique key: a row written twice is there twice."""


@dataclass
class Slot:
    """One worker slot: a worker process (or a supervisor of ``processes``), restarted on the same settings."""

    name: str
    processes: int
    via_proxy: bool
    build: str
    proc: WorkerProcess | None = None
    generation: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Held by a fault on this slot (one at a time)."""
    stopped: bool = False
    """SIGSTOPped by the nemesis."""

    def pids(self) -> list[int]:
        """The processes that run files: the worker, or the supervisor's children."""
        if self.proc is None or self.proc.proc.poll() is not None:
            return []
        if self.processes == 1:
            return [self.proc.proc.pid]
        pid = self.proc.proc.pid
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            return []
        return [int(c) for c in children]


class Cluster:
    """Start, break and heal the soak's servers and workers."""

    def __init__(self, root: Path, slots: int = 3, break_mode: str | None = None) -> None:
        self.root = root
        self.stack = Stack(StackConfig.random_ports(root / "stack"))
        self.pg: PostgresServer | None = None
        self.proxy: FaultProxy | None = None
        self.count_file = root / "handled.tsv"
        self.break_mode = break_mode
        self.build_number = 1
        self.slots = [
            Slot(f"w{i}", processes=2 if i == 2 else 1, via_proxy=i != 1, build="b1") for i in range(slots)
        ]
        self.retiring: list[Slot] = []
        """Slots of an older build, kept until no run is pinned to it."""
        self.notes: list[str] = []

    # ------------------------------------------------------------------ start and stop

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.stack.start()
        ensure_buckets(s3_client(self.stack.config), SOURCE_BUCKET, OUTPUT_BUCKET)
        self.proxy = FaultProxy(self.stack.config.s3_port, max_log=2_000).start()
        bindir = server_bindir()
        if bindir is None:
            self.notes.append("no PostgreSQL server binaries (initdb, pg_ctl): the PostgreSQL jobs are left out")
        else:
            self.pg = PostgresServer(bindir)
            self.pg.start()
            for table, columns in TABLES.items():
                self.pg.execute(f"CREATE TABLE public.{table} ({columns})")
        for slot in self.slots:
            self.spawn(slot)
        for slot in self.slots:
            assert slot.proc is not None
            slot.proc.ready_timeout = 90
            slot.proc.wait_ready()

    def stop(self) -> None:
        for slot in [*self.slots, *self.retiring]:
            if slot.proc is not None:
                slot.proc.stop(15)
        if self.proxy is not None:
            self.proxy.stop()
        self.stack.stop()
        if self.pg is not None:
            self.pg.remove()

    def env(self) -> dict[str, str]:
        """The environment of the soak's own clients (direct to S3, never through the proxy)."""
        return self.stack.config.env()

    def worker_env(self, slot: Slot) -> dict[str, str]:
        assert self.proxy is not None
        env = {
            **self.env(),
            "S3BATCH_HANDLER_MODULES": "scripts.soak.handlers",
            "S3BATCH_SOAK_COUNT_FILE": str(self.count_file),
            "S3BATCH_MAX_CONCURRENT_FILES": "6",
            "S3BATCH_GRACEFUL_SHUTDOWN_SECONDS": "10",
            "S3BATCH_DEPLOYMENT_NAME": DEPLOYMENT,
            "S3BATCH_BUILD_ID": slot.build,
            "S3BATCH_LOG_LEVEL": "INFO",
        }
        if slot.via_proxy:
            env["AWS_ENDPOINT_URL_S3"] = self.proxy.url
        if self.pg is not None:
            env[f"S3BATCH_POSTGRES_{CONNECTION.upper()}_DSN"] = self.pg.dsn
            env[f"S3BATCH_POSTGRES_{CONNECTION.upper()}_LOCK_TIMEOUT_SECONDS"] = "5"
            env[f"S3BATCH_POSTGRES_{CONNECTION.upper()}_STATEMENT_TIMEOUT_SECONDS"] = "8"
        if self.break_mode:
            env["S3BATCH_SOAK_BREAK"] = self.break_mode
        return env

    def spawn(self, slot: Slot) -> None:
        """Start the slot's worker (its log: ``workers/worker-<slot>-<generation>.log``), without waiting."""
        slot.generation += 1
        logs = self.root / "workers"
        logs.mkdir(exist_ok=True)
        slot.proc = WorkerProcess(
            "soak", logs, f"{slot.name}-{slot.generation}-{slot.build}", cwd=ROOT, env=self.worker_env(slot),
            processes=slot.processes,
        )
        slot.stopped = False

    # ------------------------------------------------------------------ faults (each run in a thread)

    def signal_worker(self, slot: Slot, sig: int, child: int | None = None) -> int | None:
        """Send ``sig`` to the slot's worker (or to its supervisor's child number ``child``); the pid signalled."""
        pids = slot.pids()
        if not pids:
            return None
        pid = pids[child % len(pids)] if child is not None and slot.processes > 1 else slot.proc.proc.pid  # type: ignore[union-attr]
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        return pid

    def restart_worker(self, slot: Slot, *, kill: bool) -> None:
        """SIGKILL (``kill``) or SIGTERM the slot's worker, wait for it to exit, start it again."""
        if slot.proc is not None and slot.proc.proc.poll() is None:
            if kill:
                slot.proc.kill()
            else:
                slot.proc.proc.send_signal(signal.SIGCONT)
                try:
                    slot.proc.terminate(30)
                except Exception:  # noqa: BLE001 - it overstayed its drain: killed
                    slot.proc.kill()
        self.spawn(slot)

    def ensure_running(self, slot: Slot) -> None:
        """Start the slot again if its worker has exited (a supervisor's children restart by themselves)."""
        if slot.proc is None or slot.proc.proc.poll() is not None:
            self.spawn(slot)
        elif slot.stopped:
            slot.proc.unpause()
            slot.stopped = False

    def restart_temporal(self, down: float, sig: int) -> None:
        self.stack.stop_one("temporal", sig)
        time.sleep(down)
        self.stack.start_temporal()

    def restart_s3(self, down: float, sig: int) -> None:
        self.stack.stop_one("s3", sig)
        time.sleep(down)
        self.stack.start_s3()

    def restart_pg(self, down: float) -> None:
        assert self.pg is not None
        self.pg.stop("immediate")
        time.sleep(down)
        self.pg.start()

    def terminate_backends(self) -> int:
        """``pg_terminate_backend`` of every other session of the database: the workers' connections."""
        assert self.pg is not None
        rows = self.pg.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE pid <> pg_backend_pid() AND datname = current_database() AND backend_type = 'client backend'"
        )
        return int(rows[0][0]) if rows else 0  # type: ignore[call-overload]

    def heal_servers(self) -> None:
        """Start again any server a fault left down (a start that failed mid-fault)."""
        for name, start in (("s3", self.stack.start_s3), ("temporal", self.stack.start_temporal)):
            proc = self.stack.procs.get(name)
            if proc is None or proc.poll() is not None:
                self.stack.procs.pop(name, None)
                start()
        if self.pg is not None:
            try:
                self.pg.execute("SELECT 1")
            except Exception:  # noqa: BLE001 - down: started again
                self.pg.start()

    # ------------------------------------------------------------------ upgrades (Worker Versioning)

    async def upgrade(self, client: Client, stop: asyncio.Event) -> str:
        """The next build started beside the current one (slot 0's worker starts on it; its old process stays),
        made current; once no run is pinned to the old build any more (or the soak ends: then its runs still
        have their workers), the other slots move to it and the old process of slot 0 drains and exits."""
        from s3batch.client.deployments import promote, running_runs

        first = self.slots[0]
        old = first.build
        self.build_number += 1
        new = f"b{self.build_number}"
        async with first.lock:
            retired = Slot(f"{first.name}-{old}", first.processes, first.via_proxy, old, first.proc, first.generation)
            self.retiring.append(retired)
            first.build = new
            self.spawn(first)
        from scripts.soak.driver import retry

        await retry(lambda: promote(client, DEPLOYMENT, new, wait=120))
        while not stop.is_set():
            with contextlib.suppress(Exception):  # the server may be down a while: ask again
                if await running_runs(client, DEPLOYMENT, old) == 0:
                    break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 2)
        else:
            return f"{old} -> {new} (the soak ended before {old} drained: its workers stay)"
        for slot in self.slots[1:]:
            async with slot.lock:
                slot.build = new
                await asyncio.to_thread(self.restart_worker, slot, kill=False)
        if retired.proc is not None:
            await asyncio.to_thread(retired.proc.stop, 30)
        self.retiring.remove(retired)
        return f"{old} -> {new}"

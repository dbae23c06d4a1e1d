"""The nemesis: faults at random times, all drawn from the seed before the soak begins (:func:`schedule`), so a
seed replays its schedule; injected by :class:`Nemesis`, several at once (one at a time per target: a worker
slot, the Temporal server, the S3 server, the PostgreSQL server), each recorded in the timeline and healed
after its own duration.

Kinds (weights in :data:`FAULTS`):

- ``worker-kill``: SIGKILL of a worker process (of a single-process slot, a supervisor's child, which the
  supervisor starts again, or the supervisor itself, whose children die with it), started again 0-5 s later;
- ``worker-term``: SIGTERM of a worker (it drains: files hand over at their next chunk boundary), started again
  at once on the same code, as a deploy of the current code does;
- ``worker-zombie``: SIGSTOP of a worker past its jobs' heartbeat timeout, then SIGCONT: its attempts were given
  to others while it was alive;
- ``worker-upgrade``: the next build of the Worker Deployment started beside the current one and made current,
  with jobs running; the other slots move to it once the old build has no pinned run;
- ``temporal-restart``: the dev server stopped (SIGTERM or SIGKILL), 1-8 s down, started on its database;
- ``s3-restart``: SeaweedFS stopped (SIGTERM, or SIGKILL), 1-15 s down, started on its data;
- ``pg-restart``: PostgreSQL stopped (immediate), 0.5-5 s down; ``pg-terminate``: every worker session ended
  (``pg_terminate_backend``);
- ``proxy-latency``, ``proxy-drop``, ``proxy-5xx``, ``proxy-slow``: for 5-30 s the S3 proxy in front of the
  proxied workers holds responses, resets connections (mid-body for GETs, after the request reached S3
  otherwise), answers 500/503, or sends bodies slowly, on one request in k.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
from dataclasses import dataclass, field
from typing import Any

from temporalio.client import Client

from s3batch.dev.faultproxy import Rule
from scripts.soak.cluster import Cluster, Slot
from scripts.soak.timeline import Timeline

FAULTS: dict[str, float] = {
    "worker-kill": 3.0,
    "worker-term": 1.5,
    "worker-zombie": 1.5,
    "worker-upgrade": 0.5,
    "temporal-restart": 1.0,
    "s3-restart": 1.0,
    "pg-restart": 1.0,
    "pg-terminate": 1.0,
    "proxy-latency": 1.0,
    "proxy-drop": 1.0,
    "proxy-5xx": 1.0,
    "proxy-slow": 0.7,
}
HEARTBEAT_TIMEOUT = 15
"""The longest heartbeat timeout of the soak's jobs: a zombie is frozen longer than this."""


@dataclass
class Fault:
    at: float
    kind: str
    params: dict[str, Any] = field(default_factory=dict)


def _params(rng: random.Random, kind: str, slots: int) -> dict[str, Any]:
    if kind.startswith("worker"):
        return {"slot": rng.randrange(slots), "child": rng.randrange(4), "whole": rng.random() < 0.3,
                "down": rng.uniform(0, 5), "frozen": HEARTBEAT_TIMEOUT + rng.uniform(2, 15)}
    if kind == "temporal-restart":
        return {"down": rng.uniform(1, 8), "sig": rng.choice(["SIGTERM", "SIGKILL"])}
    if kind == "s3-restart":
        return {"down": rng.uniform(1, 15), "sig": rng.choice(["SIGTERM", "SIGTERM", "SIGKILL"])}
    if kind == "pg-restart":
        return {"down": rng.uniform(0.5, 5)}
    if kind.startswith("proxy"):
        return {"for": rng.uniform(5, 30), "every": rng.choice([1, 2, 3, 5, 10]), "delay": rng.uniform(0.2, 2.5),
                "status": rng.choice(["500", "503"]), "after": rng.choice([0, 100, 4_096, 70_000]),
                "method": rng.choice([None, "GET", "PUT", "HEAD"])}
    return {}


def schedule(seed: int, seconds: float, per_minute: float, slots: int, pg: bool) -> list[Fault]:
    """The faults of a soak of ``seconds``: exponential gaps of mean ``60 / per_minute`` s, kinds by weight."""
    rng = random.Random(f"nemesis-{seed}")
    kinds = [k for k in FAULTS if pg or not k.startswith("pg-")]
    weights = [FAULTS[k] for k in kinds]
    faults, t = [], rng.uniform(5, 15)
    while per_minute > 0 and t < seconds:
        kind = rng.choices(kinds, weights)[0]
        faults.append(Fault(round(t, 1), kind, _params(rng, kind, slots)))
        t += rng.expovariate(per_minute / 60)
    return faults


class Nemesis:
    def __init__(self, cluster: Cluster, client: Client, timeline: Timeline) -> None:
        self.cluster = cluster
        self.client = client
        self.timeline = timeline
        self.locks = {name: asyncio.Lock() for name in ("temporal", "s3", "pg", "upgrade")}
        self.tasks: set[asyncio.Task[None]] = set()
        self.ending = asyncio.Event()

    async def run(self, faults: list[Fault]) -> None:
        """Inject ``faults`` at their times (from the timeline's start) until the list or the soak ends."""
        for fault in faults:
            delay = fault.at - self.timeline.now()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.ending.wait(), delay)
            if self.ending.is_set():
                return
            task = asyncio.create_task(self._inject(fault))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def keep(self) -> None:
        """As a process manager would: start again, every 2 s, a worker slot whose process exited with no fault on
        it (one that started while the Temporal server was away exits: it cannot connect)."""
        while not self.ending.is_set():
            for slot in self.cluster.slots:
                proc = slot.proc
                if not slot.lock.locked() and proc is not None and proc.proc.poll() is not None:
                    async with slot.lock:
                        code = proc.proc.returncode
                        await asyncio.to_thread(self.cluster.ensure_running, slot)
                        self.timeline.add("soak", f"{slot.name} had exited ({code}) with no fault on it: started again")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.ending.wait(), 2)

    async def heal(self) -> None:
        """Stop injecting, wait for the faults in progress to heal, and make sure everything runs."""
        self.ending.set()
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)
        assert self.cluster.proxy is not None
        self.cluster.proxy.clear()
        for slot in self.cluster.slots:
            await asyncio.to_thread(self.cluster.ensure_running, slot)

    async def _inject(self, fault: Fault) -> None:
        try:
            await self._dispatch(fault)
        except Exception as err:  # noqa: BLE001 - a fault that could not be injected is noted, never fatal
            self.timeline.add("nemesis-error", f"{fault.kind}: {type(err).__name__}: {err}"[:300])

    async def _dispatch(self, fault: Fault) -> None:
        kind, p = fault.kind, fault.params
        if kind.startswith("proxy"):
            await self._proxy(kind, p)
        elif kind == "worker-upgrade":
            await self._exclusive("upgrade", kind, "next build, made current", self._upgrade)
        elif kind.startswith("worker"):
            await self._worker(kind, self.cluster.slots[p["slot"] % len(self.cluster.slots)], p)
        elif kind == "temporal-restart":
            sig = getattr(signal, p["sig"])
            await self._exclusive("temporal", kind, f"{p['sig']}, down {p['down']:.1f}s",
                                  lambda: asyncio.to_thread(self.cluster.restart_temporal, p["down"], sig))
        elif kind == "s3-restart":
            sig = getattr(signal, p["sig"])
            await self._exclusive("s3", kind, f"{p['sig']}, down {p['down']:.1f}s",
                                  lambda: asyncio.to_thread(self.cluster.restart_s3, p["down"], sig))
        elif kind == "pg-restart":
            await self._exclusive("pg", kind, f"immediate stop, down {p['down']:.1f}s",
                                  lambda: asyncio.to_thread(self.cluster.restart_pg, p["down"]))
        elif kind == "pg-terminate":
            await self._exclusive("pg", kind, "pg_terminate_backend of the workers' sessions", self._terminate)

    async def _exclusive(self, lock: str, kind: str, what: str, act: Any) -> None:
        if self.locks[lock].locked():
            self.timeline.add(kind, what, skipped=True)
            return
        async with self.locks[lock]:
            event = self.timeline.add(kind, what)
            try:
                result = await act()
                if isinstance(result, str):
                    event.what += f": {result}"
            finally:
                self.timeline.close(event)

    async def _terminate(self) -> str:
        return f"{await asyncio.to_thread(self.cluster.terminate_backends)} sessions ended"

    async def _upgrade(self) -> str:
        return await self.cluster.upgrade(self.client, self.ending)

    async def _worker(self, kind: str, slot: Slot, p: dict[str, Any]) -> None:
        if slot.lock.locked():
            self.timeline.add(kind, slot.name, skipped=True)
            return
        async with slot.lock:
            c = self.cluster
            if kind == "worker-kill":
                whole = p["whole"] or slot.processes == 1
                pid = c.signal_worker(slot, signal.SIGKILL, None if whole else p["child"])
                if pid is None:
                    self.timeline.add(kind, f"{slot.name}: not running", skipped=True)
                    return
                event = self.timeline.add(kind, f"{slot.name} pid {pid}" + ("" if whole else " (a supervisor's child)"))
                if whole:
                    await asyncio.sleep(p["down"])
                    await asyncio.to_thread(c.ensure_running, slot)
            elif kind == "worker-term":
                event = self.timeline.add(kind, f"{slot.name}: SIGTERM, started again on the current code")
                await asyncio.to_thread(c.restart_worker, slot, kill=False)
            else:
                pid = c.signal_worker(slot, signal.SIGSTOP, p["child"])
                if pid is None:
                    self.timeline.add(kind, f"{slot.name}: not running", skipped=True)
                    return
                slot.stopped = True
                event = self.timeline.add(kind, f"{slot.name} pid {pid} frozen {p['frozen']:.0f}s")
                try:
                    await asyncio.sleep(p["frozen"])
                finally:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGCONT)
                    slot.stopped = False
            self.timeline.close(event)

    async def _proxy(self, kind: str, p: dict[str, Any]) -> None:
        proxy = self.cluster.proxy
        assert proxy is not None
        method = p["method"]
        if kind == "proxy-latency":
            rule = Rule("delay", method=method, every=p["every"], delay=p["delay"])
            what = f"+{p['delay']:.1f}s"
        elif kind == "proxy-drop":
            rule = Rule("reset", method=method, every=max(p["every"], 2), after_bytes=p["after"])
            what = f"reset after {p['after']} body bytes"
        elif kind == "proxy-5xx":
            rule = Rule(p["status"], method=method, every=max(p["every"], 2))  # type: ignore[arg-type]
            what = p["status"]
        else:
            rule = Rule("slow", method="GET", every=p["every"], delay=0.05, chunk_bytes=8_192)
            what = "bodies at 8 KiB / 50 ms"
        event = self.timeline.add(kind, f"{what} on 1 {method or 'request'} in {rule.every} for {p['for']:.0f}s")
        proxy.add(rule)
        try:
            await asyncio.sleep(p["for"])
        finally:
            proxy.remove(rule)
            event.what += f" ({rule.fired} fired)"
            self.timeline.close(event)

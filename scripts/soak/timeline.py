"""The soak's timeline: every fault injected and every control applied, with its time since the soak began,
kept in memory and appended to ``timeline.jsonl`` as it happens (a killed soak leaves it behind)."""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

NOT_FAULTS = ("job", "control", "soak", "nemesis-error")
"""Events of the timeline that are no fault: the generator's, the soak's own steps, a fault that failed."""


@dataclass
class Event:
    t: float
    """Seconds since the soak began."""
    kind: str
    """A fault kind (``worker-kill``, ``temporal-restart``...), or ``job``/``control`` for the generator."""
    what: str
    end: float | None = None
    """When the fault was healed (None: an instant)."""
    skipped: bool = False
    """Not injected: its target was busy with another fault."""


class Timeline:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.began = time.monotonic()
        self.events: list[Event] = []

    def now(self) -> float:
        return round(time.monotonic() - self.began, 1)

    def add(self, kind: str, what: str, *, end: float | None = None, skipped: bool = False, at: float | None = None
            ) -> Event:
        event = Event(self.now() if at is None else at, kind, what, end, skipped)
        self.events.append(event)
        with self.path.open("a") as f:
            f.write(json.dumps(asdict(event)) + "\n")
        return event

    def close(self, event: Event) -> None:
        """The fault ``event`` is healed now."""
        event.end = self.now()
        with self.path.open("a") as f:
            f.write(json.dumps({"healed": event.t, "kind": event.kind, "end": event.end}) + "\n")

    def faults(self) -> Counter[str]:
        """Faults injected, by kind."""
        return Counter(e.kind for e in self.events if e.kind not in NOT_FAULTS and not e.skipped)

    def lines(self, kinds: tuple[str, ...] | None = None) -> list[str]:
        out = []
        for e in self.events:
            if kinds is not None and e.kind not in kinds:
                continue
            span = f"{e.t:7.1f}s" + (f"-{e.end:.1f}s" if e.end is not None else "")
            out.append(f"  {span:>17}  {e.kind:<18} {'(skipped) ' if e.skipped else ''}{e.what}")
        return out

    def dump(self) -> list[dict[str, Any]]:
        return [asdict(e) for e in self.events]

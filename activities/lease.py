"""An attempt's hold on its files, as far as the attempt itself can tell: it holds them while it heartbeats.

The server times an activity out when it has received no heartbeat for the heartbeat timeout, gives its files
to another attempt, or ends its job (a cancel). An attempt whose process was frozen (SIGSTOP, a paused VM) or
starved past that timeout learns it only from its next heartbeat's answer, and meanwhile could commit a chunk
after the fact: a zombie's part landing after its cancelled job's report had counted the file's output (found
by the soak). So each attempt keeps a :class:`Lease`: every heartbeat call notes the silence since the one
before, and once a silence has passed the timeout the attempt commits nothing more (:meth:`Lease.check`,
before each commit: ``SilentAttempt``, retryable). The server's clock starts at the heartbeat it received
last, never later than the last call, so past the timeout since that call the server has timed it out. A
freeze inside a commit's own request cannot be caught from the client; such a write gives the same bytes to
the same keys as the attempt that replaced it (deterministic output).

The files of a group share one lease, as they share the group activity's heartbeat (and its pace). A lease starts
when the server started the attempt (:meth:`Lease.of`), not when the worker got to it: an attempt frozen before its
first line ran (the soak's seed 60512: frozen 18 s at its start, it woke after the server had given its files to the
next attempt and its job had ended, and wrote a rejects file past the report) is as silent as one frozen later. That
reads the worker's clock against the server's start time: they must agree within the heartbeat timeout (as Temporal's
timers assume); a worker clock ahead by more stops every attempt with ``SilentAttempt``, saying so.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from s3batch.errors import SilentAttempt

if TYPE_CHECKING:
    from temporalio.activity import Info


class Lease:
    """When the attempt last heartbeated (or started), and the first silence past ``timeout`` (None: no
    heartbeat timeout, nothing to lose)."""

    def __init__(self, timeout: timedelta | None, started: datetime | None = None) -> None:
        self.timeout = None if timeout is None else timeout.total_seconds()
        # Silent since the server started the attempt (``started``), when that was earlier (the SDK's test
        # environment leaves it at the epoch: unknown).
        late = 0.0
        if started is not None and started.timestamp() > 0:
            late = max(0.0, time.time() - started.timestamp())
        self.last = time.monotonic() - late
        self.sent = -float("inf")  # the first heartbeat goes at once
        self.silent: float | None = None
        self._lock = threading.Lock()

    @classmethod
    def of(cls, info: Info) -> Lease:
        """The lease of the attempt ``info`` describes, from its start on the server."""
        return cls(info.heartbeat_timeout, info.started_time)

    def due(self, force: bool, interval: float) -> bool:
        """Whether to heartbeat now (then counted as done): when ``force`` d, else at most every ``interval``
        seconds. The silence before it is noted (once past the timeout, for good: another attempt may hold the
        files by then, whatever later heartbeats say)."""
        with self._lock:
            now = time.monotonic()
            if not force and now - self.sent < interval:
                return False
            self._note(now)
            self.last = self.sent = now
            return True

    def check(self, where: str) -> None:
        """Before a commit.

        Raises:
            SilentAttempt: The attempt was silent past its heartbeat timeout.
        """
        with self._lock:
            self._note(time.monotonic())
            silent = self.silent
        if silent is not None:
            raise SilentAttempt(
                f"{where}: this attempt was silent for {silent:.1f} s, past its heartbeat timeout ({self.timeout:g} "
                "s): the server may have given the file to another attempt or ended its job, so it stops before "
                "committing its next chunk; a retry resumes from the last committed one (silent since its start: "
                "this worker's clock must agree with the Temporal server's within the heartbeat timeout)"
            )

    def _note(self, now: float) -> None:
        if self.silent is None and self.timeout is not None and now - self.last > self.timeout:
            self.silent = now - self.last

"""Chunk commits one write behind the chunk loop: the next chunk is read and handled while the last
one's part (or, for a table, its transaction) is being written.

A chunk's new checkpoint is heartbeated, and becomes the file's committed checkpoint, only once its
write has finished (``WriteBehind.settle``): the heartbeat never names a part that may not exist, nor
a transaction that may not have committed. At most one write is in flight, so memory holds at most two
chunks, a crash loses at most the two chunks not yet committed (found again from the last committed
part, or the database's checkpoint), and the chunks are committed in order.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from s3batch.checkpoint import Checkpoint
from s3batch.formats.readahead import uninterrupted


class WriteBehind:
    """At most one sink write in flight for one file (``enabled`` False: every write is done at once)."""

    def __init__(self, enabled: bool) -> None:
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="s3batch-commit") if enabled else None
        self._inflight: tuple[Future[Checkpoint], Callable[[Checkpoint], None]] | None = None

    def write(self, commit: Callable[[], Checkpoint], then: Callable[[Checkpoint], None]) -> None:
        """Run ``commit`` (the sink's write of a chunk), after the write in flight has settled; ``then``
        gets the committed checkpoint, on the calling thread, once the write is done."""
        self.settle()
        if self._pool is None:
            then(commit())
        else:
            with uninterrupted():  # submit() may start the pool's thread
                self._inflight = (self._pool.submit(commit), then)

    def settle(self) -> None:
        """Wait for the write in flight (its error is raised here) and hand its checkpoint to ``then``."""
        if self._inflight is not None:
            future, then = self._inflight
            with uninterrupted():
                done = future.result()
            self._inflight = None  # only now: a cancellation raised before leaves it to close()
            then(done)

    def close(self, error: BaseException | None) -> Checkpoint | None:
        """Wait for the write in flight. When the chunk loop is already raising ``error`` (a cancellation,
        a failure), a failed write is not raised over it, and a finished one is returned (committed: the
        file's result counts it) without its heartbeat or checks; a cancellation raised meanwhile is
        dropped too (the loop is stopping anyway)."""
        try:
            if error is None:
                self.settle()
                return None
            if self._inflight is None:
                return None
            future, _ = self._inflight
            self._inflight = None
            with contextlib.suppress(BaseException), uninterrupted():
                future.result()
            return _committed(future)
        finally:
            if self._pool is not None:
                quiet = contextlib.suppress(BaseException) if error is not None else contextlib.nullcontext()
                with quiet, uninterrupted():
                    self._pool.shutdown(wait=True)


def _committed(future: Future[Checkpoint]) -> Checkpoint | None:
    """The checkpoint a finished write committed (None: not finished, or failed)."""
    if not future.done() or future.cancelled() or future.exception() is not None:
        return None
    return future.result()

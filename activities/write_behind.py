"""Chunk commits behind the chunk loop: the next chunk is read and handled while the last one's part (or,
for a table, its transaction) is being written.

A chunk's new checkpoint is heartbeated, and becomes the file's committed checkpoint, only once its
write has finished (``WriteBehind.settle``): the heartbeat never names a part that may not exist, nor
a transaction that may not have committed. Writes run one after the other on one thread, in order
(more than one thread: below); a write that fails stops the ones queued after it. At most ``depth``
writes are in flight (S3 parts: one; a table: ``s3batch.sinks.postgres.WRITES_IN_FLIGHT``), so memory
holds at most ``depth`` + 1 chunks, and a crash loses at most those chunks, not yet committed (found
again from the last committed part, or the database's checkpoint).

With ``threads`` > 1 (a table in insert mode) a write may start while the one before it is still running,
on another thread: it is given ``after``, which waits for that write and tells whether it committed, and
orders itself (the table's transactions commit in order: ``PostgresOutput.commit``). A write whose
predecessor has finished is given None.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from s3batch.checkpoint import Checkpoint
from s3batch.formats.readahead import uninterrupted
from s3batch.sinks import After

Commit = Callable[[After | None], Checkpoint]
"""A sink's write of a chunk: given ``after`` while the write before it may still run, else None."""


class WriteBehind:
    """Sink writes of one file behind the chunk loop, at most ``depth`` in flight, started in order and done
    one after the other on one thread, or ordered by ``after`` on ``threads`` (``enabled`` False: every write
    is done at once).

    Args:
        enabled: Whether writes run behind the chunk loop at all.
        depth: Writes in flight at most (1: the next chunk is read while one is written; 2: the writer goes
            from one chunk's write straight on to the next, while the loop reads a third).
        threads: Writes that may run at once (at most ``depth``); above 1 each orders itself by ``after``.
    """

    def __init__(self, enabled: bool, depth: int = 1, threads: int = 1) -> None:
        self._depth = max(1, depth)
        self._threads = max(1, min(threads, self._depth))
        self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="s3batch-commit") if enabled else None
        self._inflight: deque[tuple[Future[Checkpoint], Callable[[Checkpoint], None]]] = deque()
        self._failed = False
        """Set on the writer's thread when a write failed: the writes queued after it do not run."""

    @property
    def threads(self) -> int:
        """Writes that may run at once (1: one after the other; also when every write is done at once)."""
        return self._threads if self._pool is not None else 1

    def write(self, commit: Commit, then: Callable[[Checkpoint], None]) -> None:
        """Run ``commit`` (the sink's write of a chunk), once fewer than ``depth`` writes are in flight (the
        oldest settled first); ``then`` gets the committed checkpoint, on the calling thread, in order, once
        the write is done."""
        self._settle_to(self._depth - 1)
        if self._pool is None:
            then(commit(None))
        else:
            before = self._inflight[-1][0] if self._threads > 1 and self._inflight else None
            with uninterrupted():  # submit() may start the pool's thread
                self._inflight.append((self._pool.submit(self._guarded, commit, before), then))

    def _guarded(self, commit: Commit, before: Future[Checkpoint] | None) -> Checkpoint:
        if self._failed:
            raise RuntimeError("not written: an earlier chunk's write failed")
        try:
            if before is not None and not before.done():
                return commit(lambda: _committed(before, wait=True) is not None)
            if self._failed:  # the write before failed meanwhile
                raise RuntimeError("not written: an earlier chunk's write failed")
            return commit(None)
        except BaseException:
            self._failed = True
            raise

    def settle(self) -> None:
        """Wait for the writes in flight (the first error is raised here) and hand their checkpoints to ``then``."""
        self._settle_to(0)

    def _settle_to(self, left: int) -> None:
        while len(self._inflight) > left:
            future, then = self._inflight[0]
            with uninterrupted():
                done = future.result()
            self._inflight.popleft()  # only now: a cancellation raised before leaves it to close()
            then(done)

    def close(self, error: BaseException | None) -> Checkpoint | None:
        """Wait for the writes in flight. When the chunk loop is already raising ``error`` (a cancellation,
        a failure), a failed write is not raised over it, and the last of those that finished in order is
        returned (committed: the file's result counts it) without its heartbeat or checks; a cancellation
        raised meanwhile is dropped too (the loop is stopping anyway)."""
        try:
            if error is None:
                self.settle()
                return None
            last = None
            while self._inflight:
                future, _ = self._inflight.popleft()
                with contextlib.suppress(BaseException), uninterrupted():
                    future.result()
                done = _committed(future)
                if done is None:
                    break
                last = done
            self._inflight.clear()
            return last
        finally:
            if self._pool is not None:
                quiet = contextlib.suppress(BaseException) if error is not None else contextlib.nullcontext()
                with quiet, uninterrupted():
                    self._pool.shutdown(wait=True)


def _committed(future: Future[Checkpoint], *, wait: bool = False) -> Checkpoint | None:
    """The checkpoint a finished write committed (None: not finished, or failed); with ``wait``, once it
    finished."""
    if wait:
        concurrent.futures.wait([future])
    if not future.done() or future.cancelled() or future.exception() is not None:
        return None
    return future.result()

"""``WriteBehind`` with more than one write in flight (a table's transactions): writes run in order on one
thread, each checkpoint is handed on only once its write is done, a failed write stops the ones queued
after it, and a stopping loop gets the last checkpoint committed in order."""

from __future__ import annotations

import threading

import pytest
from s3batch.activities.write_behind import WriteBehind

from s3batch.checkpoint import Checkpoint


def _cp(chunk: int) -> Checkpoint:
    return Checkpoint(etag="e", fingerprint="f", chunk=chunk, next_record=10 * chunk)


def test_writes_run_in_order_and_checkpoints_are_handed_on_only_once_written() -> None:
    behind = WriteBehind(True, depth=2)
    gate = threading.Event()
    written: list[int] = []
    handed: list[int] = []

    def commit(chunk: int) -> Checkpoint:
        gate.wait(10)
        written.append(chunk)
        return _cp(chunk)

    def then(cp: Checkpoint) -> None:
        assert cp.chunk in written  # never a checkpoint whose write has not finished
        handed.append(cp.chunk)

    behind.write(lambda: commit(1), then)
    behind.write(lambda: commit(2), then)  # two in flight: the loop does not wait
    assert handed == [] and written == []
    gate.set()
    behind.write(lambda: commit(3), then)  # a third waits for the oldest
    assert handed[:1] == [1]
    behind.settle()
    assert written == [1, 2, 3] and handed == [1, 2, 3]
    assert behind.close(None) is None


def test_a_failed_write_stops_the_writes_queued_after_it() -> None:
    behind = WriteBehind(True, depth=2)
    gate = threading.Event()
    written: list[int] = []

    def commit(chunk: int) -> Checkpoint:
        gate.wait(10)
        if chunk == 1:
            raise RuntimeError("the database refused the transaction")
        written.append(chunk)
        return _cp(chunk)

    handed: list[int] = []
    behind.write(lambda: commit(1), lambda cp: handed.append(cp.chunk))
    behind.write(lambda: commit(2), lambda cp: handed.append(cp.chunk))
    gate.set()
    with pytest.raises(RuntimeError, match="refused"):
        behind.settle()
    error = RuntimeError("stopping")
    assert behind.close(error) is None  # chunk 2 never ran: nothing after the failed one is committed
    assert written == [] and handed == []


def test_a_stopping_loop_gets_the_last_checkpoint_committed_in_order() -> None:
    behind = WriteBehind(True, depth=2)
    behind.write(lambda: _cp(1), lambda cp: None)
    behind.write(lambda: _cp(2), lambda cp: None)
    done = behind.close(KeyboardInterrupt())  # e.g. a cancellation raised in the loop
    assert done == _cp(2)


def test_disabled_writes_at_once() -> None:
    behind = WriteBehind(False, depth=2)
    handed: list[int] = []
    behind.write(lambda: _cp(1), lambda cp: handed.append(cp.chunk))
    assert handed == [1]
    assert behind.close(None) is None

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

    behind.write(lambda _: commit(1), then)
    behind.write(lambda _: commit(2), then)  # two in flight: the loop does not wait
    assert handed == [] and written == []
    gate.set()
    behind.write(lambda _: commit(3), then)  # a third waits for the oldest
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
    behind.write(lambda _: commit(1), lambda cp: handed.append(cp.chunk))
    behind.write(lambda _: commit(2), lambda cp: handed.append(cp.chunk))
    gate.set()
    with pytest.raises(RuntimeError, match="refused"):
        behind.settle()
    error = RuntimeError("stopping")
    assert behind.close(error) is None  # chunk 2 never ran: nothing after the failed one is committed
    assert written == [] and handed == []


def test_a_stopping_loop_gets_the_last_checkpoint_committed_in_order() -> None:
    behind = WriteBehind(True, depth=2)
    behind.write(lambda _: _cp(1), lambda cp: None)
    behind.write(lambda _: _cp(2), lambda cp: None)
    done = behind.close(KeyboardInterrupt())  # e.g. a cancellation raised in the loop
    assert done == _cp(2)


def test_disabled_writes_at_once() -> None:
    behind = WriteBehind(False, depth=2)
    handed: list[int] = []
    behind.write(lambda _: _cp(1), lambda cp: handed.append(cp.chunk))
    assert handed == [1]
    assert behind.close(None) is None


def test_on_two_threads_a_write_runs_beside_the_one_before_and_after_waits_for_it() -> None:
    """With ``threads=2`` the second write starts while the first still runs (the first waits here until the
    second has started: on one thread this would never happen), and is given ``after``, which returns only
    once the first is done and tells whether it committed; checkpoints are still handed on in order."""
    behind = WriteBehind(True, depth=2, threads=2)
    assert behind.threads == 2
    second_started = threading.Event()
    seen: list[object] = []

    def first(after: object) -> Checkpoint:
        seen.append(after)
        assert second_started.wait(10), "the second write did not start beside the first"
        return _cp(1)

    def second(after: object) -> Checkpoint:
        second_started.set()
        assert callable(after)
        seen.append(after())
        return _cp(2)

    handed: list[int] = []
    behind.write(first, lambda cp: handed.append(cp.chunk))
    behind.write(second, lambda cp: handed.append(cp.chunk))
    behind.settle()
    assert seen == [None, True] and handed == [1, 2]
    behind.write(lambda after: seen.append(after) or _cp(3), lambda cp: handed.append(cp.chunk))
    behind.settle()
    assert seen[-1] is None and handed == [1, 2, 3]  # nothing in flight before it: no ``after``
    assert behind.close(None) is None


def test_on_two_threads_after_tells_a_write_that_the_one_before_failed() -> None:
    behind = WriteBehind(True, depth=2, threads=2)
    gate, started = threading.Event(), threading.Event()
    told: list[bool] = []

    def first(after: object) -> Checkpoint:
        gate.wait(10)
        raise RuntimeError("the database refused the transaction")

    def second(after: object) -> Checkpoint:
        started.set()
        assert callable(after)
        told.append(after())
        raise RuntimeError("not written: the chunk before was not committed")

    behind.write(first, lambda cp: None)
    behind.write(second, lambda cp: None)
    assert started.wait(10)
    gate.set()
    with pytest.raises(RuntimeError, match="refused"):  # the first error, in order
        behind.settle()
    assert behind.close(RuntimeError("stopping")) is None
    assert told == [False]

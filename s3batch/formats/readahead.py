"""Reading a source stream ahead, in a thread of its own, while the records of the last blocks are parsed.

The fast CSV path (:mod:`s3batch.formats.fastcsv`) parses a block at a time in native code; while it
does, the next blocks' bytes arrive from S3 (and are decompressed, for a compressed file) beside it,
instead of after it. At most ``depth`` blocks are held ahead. An error of the stream (an S3 error,
a corrupt compressed stream) is raised by the read that reaches it, as the stream itself would have.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Iterator
from typing import IO

from temporalio import activity

_WAIT = 0.2
"""Seconds between two looks at whether to stop, while waiting (so a stop never hangs)."""


@contextlib.contextmanager
def uninterrupted() -> Iterator[None]:
    """In a (threaded) activity, hold a cancellation back while threads are started, waited for or
    stopped: the SDK delivers it as an exception raised at any bytecode of the activity's thread, and
    one landing inside ``Thread.start`` or a ``Condition.wait`` can leave it waiting for ever. It is
    raised at the end of the block instead."""
    if activity.in_activity():
        with activity.shield_thread_cancel_exception():
            yield
    else:
        yield


class ReadAhead:
    """``stream``, read ``block`` bytes at a time by a background thread, ``depth`` blocks ahead.

    Only :meth:`read` is offered (what the parsers use). Call :meth:`close` when done.
    """

    def __init__(self, stream: IO[bytes], block: int = 1 << 20, depth: int = 2) -> None:
        self._stream = stream
        self._block = block
        self._queue: queue.Queue[bytes | BaseException] = queue.Queue(depth)
        self._stop = threading.Event()
        self._buf = b""
        self._eof = False
        self._thread = threading.Thread(target=self._run, name="s3batch-read-ahead", daemon=True)
        with uninterrupted():
            self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                data = self._stream.read(self._block)
                self._put(data)
                if not data:
                    return
        except BaseException as err:  # noqa: BLE001 - handed to the reader, which raises it
            self._put(err)

    def _put(self, item: bytes | BaseException) -> None:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=_WAIT)
                return
            except queue.Full:
                continue

    def read(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes (all that is left for ``n < 0``); fewer only at the end of the stream."""
        with uninterrupted():
            return self._read(n)

    def _read(self, n: int) -> bytes:
        pieces = [self._buf]
        held = len(self._buf)
        while (n < 0 or held < n) and not self._eof:
            try:
                item = self._queue.get(timeout=_WAIT)
            except queue.Empty:
                continue
            if isinstance(item, BaseException):
                self._eof = True
                raise item
            if not item:
                self._eof = True
                break
            pieces.append(item)
            held += len(item)
        data = b"".join(pieces)
        if n < 0 or len(data) <= n:
            self._buf = b""
            return data
        self._buf = data[n:]
        return data[:n]

    def close(self) -> None:
        """Stop reading ahead (waits for a read in progress, a few ms from S3)."""
        self._stop.set()
        with uninterrupted():
            self._thread.join(timeout=30)

"""UTF-16 read as UTF-8, knowing the source byte position of every line end.

The CSV parser splits lines on bytes, which works for every encoding that writes line ends as the
ASCII bytes; UTF-16 does not (``\\n`` is ``0a 00``). :class:`Utf16AsUtf8` decodes UTF-16 as it is
read and hands out UTF-8, recording for each line end (CR or LF) the pair (UTF-8 position after it,
source position after it). A record always ends after a line end (or at the end of the file), so
:meth:`Utf16AsUtf8.source_offset` turns the parser's offsets into exact source offsets: a
checkpoint resumes with a ranged GET at the first byte of the next record.

Undecodable input is never replaced silently: an unpaired surrogate is passed through (it becomes
bytes that are not UTF-8, so the parser makes its record a reject), and an odd last byte becomes
one byte that is not UTF-8 either.
"""

from __future__ import annotations

import codecs
import io
import re
from collections import deque
from typing import IO, Any

_READ = 64 * 1024
_LINE_END = re.compile(r"[\r\n]")
_BOMS = {b"\xff\xfe": "utf-16-le", b"\xfe\xff": "utf-16-be"}


def utf16_byte_order(first: bytes, encoding: str) -> tuple[str, int]:
    """``(codec with its byte order, BOM length)`` for a file that starts with ``first`` (2+ bytes).

    ``utf-16`` takes its byte order from the BOM (little-endian without one); ``utf-16-le`` and
    ``-be`` skip a BOM of their own byte order.
    """
    bom = _BOMS.get(first[:2])
    if encoding == "utf-16":
        return (bom, 2) if bom else ("utf-16-le", 0)
    return encoding, 2 if bom == encoding else 0


class Utf16AsUtf8(io.RawIOBase):
    """UTF-8 of a UTF-16 stream read from source position ``start`` (a character boundary).

    Args:
        raw: The source stream, positioned at ``start`` (or ``len(prefix)`` bytes after it).
        codec: ``utf-16-le`` or ``utf-16-be``.
        start: Its position in the object.
        origin: The UTF-8 position of ``start``: 0 at the start of the object (after its BOM), else
            ``start`` itself.
        prefix: Bytes from ``start`` already read from ``raw`` (to find a BOM).
    """

    def __init__(self, raw: IO[bytes], codec: str, start: int, origin: int, prefix: bytes = b"") -> None:
        super().__init__()
        self._raw = raw
        self._codec = codec
        self._decoder = codecs.getincrementaldecoder(codec)("surrogatepass")
        self._utf8 = origin
        """UTF-8 position of what was produced so far."""
        self._src = start
        """Source bytes of the characters produced so far."""
        self._ends: deque[tuple[int, int]] = deque([(origin, start)])
        """(UTF-8 position, source position) after each line end not yet passed, and at the start."""
        self._out = b""
        self._at = 0
        self._eof = False
        self._prefix = prefix

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while self._at == len(self._out):
            if self._eof:
                return 0
            self._out, self._at = self._more(), 0
        n = min(len(buffer), len(self._out) - self._at)
        buffer[:n] = memoryview(self._out)[self._at : self._at + n]
        self._at += n
        return n

    def _more(self) -> bytes:
        data = self._raw.read(_READ)
        if self._prefix:
            data, self._prefix = self._prefix + data, b""
        if data:
            text = self._decoder.decode(data)
            tail = b""
        else:
            self._eof = True
            try:
                text = self._decoder.decode(b"", final=True)
                tail = b""
            except UnicodeDecodeError:  # an odd last byte (a truncated code unit)
                text, tail = "", b"\xff"
        out = self._account(text)
        if tail:
            out += tail
            self._utf8 += 1
            self._src += 1
        if self._eof:
            self._ends.append((self._utf8, self._src))
        return out

    def _account(self, text: str) -> bytes:
        """UTF-8 of ``text``, recording the positions after each of its line ends."""
        out = text.encode("utf-8", "surrogatepass")
        ends = self._ends
        codec = self._codec
        previous = 0
        for match in _LINE_END.finditer(text):
            end = match.end()
            piece = text[previous:end]
            self._utf8 += len(piece.encode("utf-8", "surrogatepass"))
            self._src += len(piece.encode(codec, "surrogatepass"))
            ends.append((self._utf8, self._src))
            previous = end
        if previous < len(text):
            rest = text[previous:]
            self._utf8 += len(rest.encode("utf-8", "surrogatepass"))
            self._src += len(rest.encode(codec, "surrogatepass"))
        return out

    def source_offset(self, utf8: int) -> int:
        """The source position of UTF-8 position ``utf8``, which must be after a line end (or the
        start, or the end); positions asked for never go back."""
        ends = self._ends
        while len(ends) > 1 and ends[1][0] <= utf8:
            ends.popleft()
        at, src = ends[0]
        if at != utf8:
            raise AssertionError(f"UTF-8 position {utf8} is not at a line end (last line end at {at})")
        return src

"""Compressed source files: gzip (``.gz``), zstandard (``.zst``) and bzip2 (``.bz2``).

A compressed stream cannot be entered mid-way, so a compressed file is always decompressed from its
first byte and the records already committed are skipped (see :mod:`s3batch.formats.source`).
Every reader here hands out bounded reads (a small input that expands enormously never becomes one
huge buffer), reads concatenated streams (``cat a.gz b.gz``, several zstd frames, several bzip2
streams) as one, and turns a corrupt or truncated stream into :class:`CorruptCompressed`, which
the caller reports as a non-retryable ``BadFile`` naming the file (never quoting its bytes).
"""

from __future__ import annotations

import bz2
import gzip
import io
import zlib
from typing import IO, Any

import zstandard

from s3batch.formats.keys import SUFFIXES, Compression

MAX_RATIO: dict[Compression, int] = {"gzip": 1032, "zstd": 32_768, "bzip2": 50_000_000}
"""At most how many times larger the decompressed bytes are (deflate ~1,032; zstd: a 4-byte block
stands for 128 KiB; bzip2's run-length stages make long runs almost free)."""

_SIGNATURES: dict[Compression, str] = {"gzip": "1f 8b", "zstd": "28 b5 2f fd", "bzip2": "42 5a 68 ('BZh')"}
_SUFFIX_OF: dict[Compression, str] = {v: k for k, v in SUFFIXES.items()}

# Compressed bytes given to zstd at once: zstd's decompressobj has no output bound, and a block of
# four bytes can stand for 128 KiB, so 256 bytes of input expand to at most 8 MiB.
_ZSTD_INPUT = 256
_READ = 64 * 1024


class CorruptCompressed(Exception):
    """A compressed stream that cannot be read to its end: ``what`` says why (no file data quoted)."""

    def __init__(self, compression: Compression, what: str) -> None:
        super().__init__(what)
        self.compression = compression
        self.what = what


def open_decompressed(raw: IO[bytes], compression: Compression) -> IO[bytes]:
    """A binary stream of the decompressed bytes of ``raw``; its reads raise :class:`CorruptCompressed`."""
    if compression == "gzip":
        return io.BufferedReader(_Gzip(raw), _READ)
    if compression == "zstd":
        return io.BufferedReader(_Zstd(raw), _READ)
    return io.BufferedReader(_Bzip2(raw), _READ)


def advice(compression: Compression) -> str:
    """What to do about a corrupt file of that compression."""
    return (
        f"Upload it again, or give it a name without {_SUFFIX_OF[compression]!r} if it is not compressed; "
        "retrying cannot fix it."
    )


class _Decompressing(io.RawIOBase):
    """A readable raw stream of decompressed bytes (``readinto`` fills at most the buffer given)."""

    compression: Compression

    def __init__(self, raw: IO[bytes]) -> None:
        super().__init__()
        self._raw = raw
        self._out = b""
        self._at = 0
        """Bytes of ``_out`` handed out."""
        self._started = False
        """Some compressed input was read (an empty object is an empty file)."""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        out, at = self._out, self._at
        while at == len(out):
            more = self._more()
            if more is None:
                return 0
            out, at = more, 0
        n = min(len(buffer), len(out) - at)
        buffer[:n] = memoryview(out)[at : at + n]
        self._out, self._at = out, at + n
        return n

    def _more(self) -> bytes | None:
        """The next decompressed bytes (maybe empty), None at the end."""
        raise NotImplementedError

    def _corrupt(self, what: str) -> CorruptCompressed:
        return CorruptCompressed(self.compression, what)

    def _not_this(self) -> CorruptCompressed:
        name = self.compression
        return self._corrupt(
            f"is not {name} data (it does not start with the {name} signature {_SIGNATURES[self.compression]})"
        )

    def _truncated(self) -> CorruptCompressed:
        return self._corrupt(f"is truncated: its {self.compression} stream ends before the end-of-stream marker")


class _Gzip(_Decompressing):
    compression: Compression = "gzip"

    def __init__(self, raw: IO[bytes]) -> None:
        super().__init__(raw)
        self._file = gzip.GzipFile(fileobj=raw, mode="rb")

    def _more(self) -> bytes | None:
        try:
            data = self._file.read(_READ)
        except EOFError:
            raise self._truncated() from None
        except zlib.error as err:
            raise self._corrupt(f"holds corrupt compressed data ({str(err).split(':')[-1].strip()})") from None
        except gzip.BadGzipFile as err:
            if str(err).startswith("Not a gzipped file"):
                raise self._not_this() from None
            raise self._corrupt(f"is corrupt gzip ({str(err).split('(')[0].strip()})") from None
        return data or None


class _Bzip2(_Decompressing):
    compression: Compression = "bzip2"

    def __init__(self, raw: IO[bytes]) -> None:
        super().__init__(raw)
        self._dec = bz2.BZ2Decompressor()

    def _more(self) -> bytes | None:
        dec = self._dec
        if dec.eof:  # a stream ended: another may follow (pbzip2, cat a.bz2 b.bz2)
            data = dec.unused_data or self._raw.read(_READ)
            if not data:
                return None
            self._dec = dec = bz2.BZ2Decompressor()
        elif dec.needs_input:
            data = self._raw.read(_READ)
            if not data:
                if not self._started:
                    return None  # an empty object
                raise self._truncated()
        else:
            data = b""  # output of the input given before is still due
        first = not self._started
        self._started = True
        try:
            return dec.decompress(data, _READ)
        except OSError:
            if first and not data.startswith(b"BZh"):
                raise self._not_this() from None
            raise self._corrupt("holds corrupt compressed data (an invalid bzip2 block)") from None


class _Zstd(_Decompressing):
    compression: Compression = "zstd"

    def __init__(self, raw: IO[bytes]) -> None:
        super().__init__(raw)
        self._dec = zstandard.ZstdDecompressor().decompressobj()
        self._pending = b""
        self._in_frame = False
        """Input of the current frame was given and its end not reached yet."""

    def _more(self) -> bytes | None:
        if not self._pending:
            self._pending = self._raw.read(_READ)
            if not self._pending:
                if self._in_frame:
                    raise self._truncated()
                return None
        data, self._pending = self._pending[:_ZSTD_INPUT], self._pending[_ZSTD_INPUT:]
        first = not self._started
        self._started = True
        self._in_frame = True
        try:
            out = self._dec.decompress(data)
        except zstandard.ZstdError as err:
            # A frame starts with its magic number (skippable frames with 50-5f 2a 4d 18).
            if first and not (data.startswith(b"\x28\xb5\x2f\xfd") or data[1:4] == b"\x2a\x4d\x18"):
                raise self._not_this() from None
            raise self._corrupt(f"holds corrupt compressed data ({str(err).split(':')[-1].strip()})") from None
        if self._dec.eof:  # the frame ended: what follows is the next frame
            self._pending = self._dec.unused_data + self._pending
            self._dec = zstandard.ZstdDecompressor().decompressobj()
            self._in_frame = False
        return out

"""Byte-range splits of one big file: where a split's records begin and end, and the line they begin on.

A file larger than the job's ``split_bytes`` is processed by several activities at once, each given a
nominal byte range ``[start, end)`` (:class:`~s3batch.messages.SplitRange`, cut by the workflow from the
listed size alone). Each split moves its two ends to record boundaries by the same rule, from the file's
bytes alone (so the two splits sharing a boundary find the same one, with no word between them):

    the boundary of a nominal offset ``p > 0`` is just after the first line feed at or after ``p - 1``
    that ends a line holding something besides white space (the end of the object if there is none).

A split takes the records that start before its end boundary: its parser stops as soon as its offset
reaches it, which for JSON Lines is exactly there (every record ends with its line), and for CSV too unless a
quoted field holds the line break there. Then the record read last ends past the boundary, where the next
split started reading mid-record: the split fails (:class:`SplitBoundary`, not retried) rather than let
two splits read that record two ways, and the workflow processes the file whole instead. Blank lines are
never a boundary's last line, so a split never skips blank lines into its neighbour's first record.

A split after the first starts its line count where it begins: it counts the line breaks before its start
(one streamed read of the file up to there, no parsing), so its rejects and records carry the file's own line
numbers, the same as when the file is read whole.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

from s3batch.errors import SPLIT_BOUNDARY, BadFile
from s3batch.file_output import FileOutput
from s3batch.s3io import open_object

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from s3batch.activities.file_job import FileJob

    from s3batch.messages import ObjectRef, SplitRange

_BLOCK = 256 * 1024
_COUNT_BLOCK = 8 * 1024 * 1024
_BLANK = b" \t\r\n\f\v"


class SplitBoundary(BadFile):
    """A record crosses the boundary of two splits of a file (a quoted CSV field holding a line break
    there): the file cannot be split at that point. Its details say so (``SPLIT_BOUNDARY``): the workflow
    then processes the file whole."""

    def file_counts(self) -> dict[str, Any]:
        return {SPLIT_BOUNDARY: True}


class SplitSource:
    """The bytes of one version of a file, for finding split boundaries and counting lines.

    Args:
        s3: The S3 client.
        bucket: The source bucket.
        obj: The listed object (its ETag pins every read).
        version_id: The version pinned by an earlier read, if any.
        where: ``s3://bucket/key``, for messages.
    """

    def __init__(self, s3: S3Client, bucket: str, obj: ObjectRef, version_id: str | None, where: str) -> None:
        self.s3 = s3
        self.bucket = bucket
        self.obj = obj
        self.version_id = version_id
        self.where = where

    def _open(self, start: int, window: int) -> io.BufferedReader:
        return open_object(
            self.s3,
            self.bucket,
            self.obj.key,
            etag=self.obj.etag,
            size=self.obj.size,
            version_id=self.version_id,
            start=start,
            window=window,
        )

    def boundary(self, nominal: int) -> int:
        """The record boundary of the nominal offset ``nominal`` (see the module docstring)."""
        size = self.obj.size
        if nominal <= 0:
            return 0
        if nominal >= size:
            return size
        pos = nominal - 1  # the byte before the nominal offset may be the line feed itself
        line_start = None  # where the line holding `pos` starts, once known (not needed before the first LF)
        content = False  # the current line holds something besides white space (from `pos` on, at first)
        with self._open(pos, _BLOCK) as stream:
            while True:
                block = stream.read(_BLOCK)
                if not block:
                    return size
                i = 0
                while True:
                    lf = block.find(b"\n", i)
                    piece = block[i:] if lf < 0 else block[i:lf]
                    content = content or bool(piece.strip(_BLANK))
                    if lf < 0:
                        break
                    if content or (line_start is None and self._before_has_content(pos)):
                        return pos + lf + 1
                    line_start, content, i = pos + lf + 1, False, lf + 1
                pos += len(block)

    def _before_has_content(self, pos: int) -> bool:
        """Whether the line holding byte ``pos`` has something besides white space before ``pos``."""
        start = max(0, pos - _BLOCK)
        while True:
            with self._open(start, _BLOCK) as stream:
                before = stream.read(pos - start)
            lf = before.rfind(b"\n")
            tail = before[lf + 1 :]
            if tail.strip(_BLANK):
                return True
            if lf >= 0 or start == 0:
                return False
            pos, start = start, max(0, start - _BLOCK)

    def line_at(self, offset: int, fmt: str) -> int:
        """The physical line number (1-based) of the line starting at ``offset``, as the file's parser counts
        lines: line feeds for JSON Lines; CRs, LFs and CRLFs for CSV (``s3batch.formats.common.line_breaks``)."""
        if offset <= 0:
            return 1
        lines = 1
        pos = 0
        ended_cr = False
        with self._open(0, 64 * 1024 * 1024) as stream:
            while pos < offset:
                block = stream.read(min(_COUNT_BLOCK, offset - pos))
                if not block:
                    raise BadFile(f"{self.where} is shorter ({pos} bytes) than listed; list it again")
                pos += len(block)
                lines += block.count(b"\n")
                if fmt == "csv":
                    lines += block.count(b"\r") - block.count(b"\r\n")
                    if ended_cr and block.startswith(b"\n"):
                        lines -= 1  # a CRLF across two blocks: one break, counted for both
                    ended_cr = block.endswith(b"\r")
        return lines


def split_boundary_error(where: str, index: int, count: int, boundary: int, offset: int) -> SplitBoundary:
    """The failure of split ``index`` whose last record ends at ``offset``, past its end boundary ``boundary``."""
    return SplitBoundary(
        f"{where}: split {index + 1} of {count} ends at byte {boundary}, but its last record ends at byte "
        f"{offset}: a record crosses the boundary (a quoted CSV field holds a line break there), so the file "
        "cannot be split there; the file is processed whole instead (a job sets \"split_bytes\": null to "
        "never split)."
    )


class SplitRun:
    """One attempt at one split (``FileJob`` holds it): where it starts and where its records end.

    Args:
        source: The file's bytes.
        split: The nominal range.
        fmt: ``csv`` or ``jsonl`` (how lines are counted).
    """

    def __init__(self, source: SplitSource, split: SplitRange, fmt: str) -> None:
        self.source = source
        self.split = split
        self.fmt = fmt
        self.end: int | None = None
        """Where the split's records end (its end's record boundary), once found (:meth:`find_end`)."""

    @property
    def index(self) -> int:
        return self.split.index

    def start(self) -> tuple[int, int]:
        """The offset of the split's first record and the line it is on (for its first attempt's checkpoint)."""
        offset = self.source.boundary(self.split.start)
        return offset, self.source.line_at(offset, self.fmt)

    def find_end(self, version_id: str | None) -> int:
        """Find where the split's records end (one ranged read or a few, pinned to ``version_id``)."""
        self.source.version_id = version_id
        self.end = self.source.boundary(self.split.end)
        return self.end

    def check_end(self, offset: int) -> None:
        """The split's last record must end at its end boundary: else one crosses into the next split."""
        assert self.end is not None
        if offset != self.end:
            raise split_boundary_error(self.source.where, self.split.index, self.split.count, self.end, offset)


def open_split(job: FileJob) -> SplitRun:
    """The split of ``job``'s file its input names, with its output made that split's (``FileOutput.for_split``)."""
    split = job.req.split
    assert split is not None
    if job.gz or job.fmt not in ("csv", "jsonl") or not isinstance(job.output, FileOutput):
        raise BadFile(
            f"{job.where}: only an uncompressed CSV or JSON Lines file written to S3 parts can be split "
            '(this is a bug in s3batch\'s workflow: report it); process it with "split_bytes": null'
        )
    job.output.for_split(split.index, split.count, split.start, split.end)
    job.log_extra["split"] = split.index
    return SplitRun(SplitSource(job.s3, job.req.bucket, job.obj, job.obj.version_id, job.where), split, job.fmt)

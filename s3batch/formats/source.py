"""Opening one source file on S3 at a checkpoint, as a stream of records.

A plain file is read from the checkpoint's byte offset with ranged GETs pinned to the listed version
(a CSV's header row is read first from byte 0); a ``.gz`` file is decompressed from its start and the
records already committed are skipped (a gzip stream cannot be entered mid-way).
"""

from __future__ import annotations

import contextlib
import gzip
import io
import zlib
from collections.abc import Iterator
from itertools import islice
from typing import TYPE_CHECKING, Any, cast

from s3batch.errors import BadFile
from s3batch.formats import Parser, make_parser
from s3batch.formats.common import ParsedFormat, Record
from s3batch.formats.csv import read_csv_header
from s3batch.formats.parquet import ParquetParser, PinnedFile
from s3batch.s3io import RangedReader, open_object

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

GZIP_ERRORS = (gzip.BadGzipFile, EOFError, zlib.error)
"""What reading a corrupt or truncated ``.gz`` raises."""


class SourceFile:
    """One version of one source object, read as records of ``fmt``.

    Args:
        s3: The S3 client.
        bucket: The source bucket.
        key: The source key.
        etag: The listed version's ETag (every read is pinned to it).
        size: The object's size.
        fmt: Its format.
        gz: Whether it is gzip-compressed.
        max_record_bytes: The job's limit on one record.
    """

    def __init__(
        self,
        s3: S3Client,
        *,
        bucket: str,
        key: str,
        etag: str,
        size: int,
        fmt: ParsedFormat,
        gz: bool,
        max_record_bytes: int,
    ) -> None:
        self.s3 = s3
        self.bucket = bucket
        self.key = key
        self.etag = etag
        self.size = size
        self.fmt = fmt
        self.gz = gz
        self.max_record_bytes = max_record_bytes
        self.where = f"s3://{bucket}/{key}"
        self.version_id: str | None = None
        """The version to read (None: the current one, pinned by the first read)."""
        self.raw: RangedReader | None = None
        """The stream being read (its position, the version it pinned, whether a pinned read succeeded)."""

    def _open(self, start: int, window: int = 16 * 1024 * 1024) -> io.BufferedReader:
        return open_object(
            self.s3,
            self.bucket,
            self.key,
            etag=self.etag,
            size=self.size,
            version_id=self.version_id,
            start=start,
            window=window,
        )

    def records(
        self, next_record: int, byte_offset: int | None, line: int, stack: contextlib.ExitStack
    ) -> tuple[Iterator[Record], Parser]:
        """An iterator of the records from a checkpoint on, and the parser (for offsets and lines).

        Args:
            next_record: Records already committed (skipped in a ``.gz`` file).
            byte_offset: Where the next record starts (plain files).
            line: The line where it starts.
            stack: Closes the streams opened.

        Raises:
            BadFile: The CSV header row cannot be used, or a ``.gz`` holds fewer records than committed.
        """
        max_bytes = self.max_record_bytes
        if self.fmt == "parquet":
            return self.parquet_rows(next_record, stack)
        try:
            if self.gz:
                raw = stack.enter_context(self._open(0))
                self.raw = cast(RangedReader, raw.raw)
                stream: Any = stack.enter_context(gzip.GzipFile(fileobj=raw, mode="rb"))
                parser = make_parser(self.fmt, stream, max_line_bytes=max_bytes)
                records = iter(parser)
                skipped = sum(1 for _ in islice(records, next_record))
                if skipped != next_record:
                    raise BadFile(f"{self.where} has fewer records ({skipped}) than its checkpoint ({next_record})")
                return records, parser
            offset = byte_offset or 0
            header = None
            if self.fmt == "csv" and offset > 0:
                with self._open(0, window=64 * 1024) as head_stream:
                    header = read_csv_header(head_stream, max_bytes)
            stream = stack.enter_context(self._open(offset))
            self.raw = cast(RangedReader, stream.raw)
            parser = make_parser(self.fmt, stream, offset=offset, line=line, header=header, max_line_bytes=max_bytes)
            return iter(parser), parser
        except ValueError as err:  # an unreadable CSV header
            if isinstance(err, BadFile):
                raise
            raise BadFile(f"{self.where}: {err}") from None

    def parquet_rows(self, next_record: int, stack: contextlib.ExitStack) -> tuple[Iterator[Record], Parser]:
        """The rows of a Parquet file from row ``next_record`` on (earlier row groups are not read)."""
        file = stack.enter_context(
            PinnedFile(self.s3, self.bucket, self.key, etag=self.etag, size=self.size, version_id=self.version_id)
        )
        self.raw = file
        parser = ParquetParser(file, self.where, next_record)
        return iter(parser), parser

    def bad_gzip(self, err: Exception, committed: int) -> BadFile:
        """A corrupt or truncated ``.gz`` (``err``, one of :data:`GZIP_ERRORS`): a bad file, not worth
        retrying. Never quotes its bytes.

        Args:
            committed: Records committed before.
        """
        at = self.raw.position if self.raw is not None else 0
        if isinstance(err, EOFError):
            what = "is truncated: its gzip stream ends before the end-of-stream marker"
        elif isinstance(err, zlib.error):
            what = f"holds corrupt compressed data ({str(err).split(':')[-1].strip()})"
        elif str(err).startswith("Not a gzipped file"):
            what = "is not gzip data (it does not start with the gzip signature 1f 8b)"
        else:
            what = f"is corrupt gzip ({str(err).split('(')[0].strip()})"
        return BadFile(
            f"{self.where} {what}, near compressed byte {at} ({committed} records committed before). "
            "Upload it again, or give it a name without '.gz' if it is not compressed; retrying cannot fix it."
        )

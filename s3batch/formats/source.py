"""Opening one source file on S3 at a checkpoint, as a stream of records.

A plain file is read from the checkpoint's byte offset with ranged GETs pinned to the listed version
(a CSV's header row is read first from byte 0); a compressed file (``.gz``, ``.zst``, ``.bz2``: see
:mod:`s3batch.formats.compression`) is decompressed from its start and the records already committed
are skipped (a compressed stream cannot be entered mid-way).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
from collections.abc import Iterator
from itertools import islice
from typing import TYPE_CHECKING, Any, cast

from s3batch.errors import BadFile, InvalidInput
from s3batch.formats.common import ParsedFormat, Record
from s3batch.formats.compression import CorruptCompressed, advice, open_decompressed
from s3batch.formats.csv import DEFAULT_READING, read_csv_header
from s3batch.formats.fastcsv import fast_reading
from s3batch.formats.json import SNIFF, BadDocument
from s3batch.formats.keys import Compression
from s3batch.formats.parquet import ParquetParser, PinnedFile
from s3batch.formats.parsers import Parser, make_parser
from s3batch.formats.readahead import ReadAhead
from s3batch.formats.transcode import utf16_byte_order
from s3batch.reading import READ_OPTIONS, Reading
from s3batch.s3io import RangedReader, open_object
from s3batch.sinks.spec import PostgresSink

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

    from s3batch.messages import ProcessFileInput

AHEAD_MIN_BYTES = 2 * 1024 * 1024
"""Smaller files are not read ahead: their first read holds most of them."""


def reading_of(req: ProcessFileInput, fmt: ParsedFormat, where: str) -> Reading:
    """How the file of ``req`` is read (the job's reading options, and the sink's ``empty_as``; defaults but for
    CSV).

    Raises:
        InvalidInput: An option is invalid (an input that did not go through ``S3BatchInput``).
    """
    if fmt != "csv":
        return DEFAULT_READING
    try:
        reading = Reading.of(req.obj.key, req.model_dump(include=set(READ_OPTIONS)))
    except ValueError as err:
        raise InvalidInput(f"cannot read {where}: {err}") from None
    if isinstance(req.sink, PostgresSink) and req.sink.empty_null:  # COPY's convention (the S3 sinks: '')
        reading = dataclasses.replace(reading, empty_null=True)
    return reading


class SourceFile:
    """One version of one source object, read as records of ``fmt``.

    Args:
        s3: The S3 client.
        bucket: The source bucket.
        key: The source key.
        etag: The listed version's ETag (every read is pinned to it).
        size: The object's size.
        fmt: Its format.
        compression: How it is compressed (None: not).
        max_record_bytes: The job's limit on one record.
        reading: How a CSV is read (dialect, header, encoding).
        fast: Read a CSV with the fast path where it can be (:mod:`s3batch.formats.fastcsv`).
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
        compression: Compression | None,
        max_record_bytes: int,
        reading: Reading = DEFAULT_READING,
        fast: bool = False,
    ) -> None:
        self.s3 = s3
        self.fast = fast
        self.bucket = bucket
        self.key = key
        self.etag = etag
        self.size = size
        self.fmt = fmt
        self.compression = compression
        self.max_record_bytes = max_record_bytes
        self.reading = reading
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
            next_record: Records already committed (skipped in a compressed file).
            byte_offset: Where the next record starts (plain files).
            line: The line where it starts.
            stack: Closes the streams opened.

        Raises:
            BadFile: The CSV header row cannot be used, or a compressed file holds fewer records than committed.
        """
        max_bytes = self.max_record_bytes
        if self.fmt == "parquet":
            return self.parquet_rows(next_record, stack)
        try:
            if self.compression is not None:
                raw = stack.enter_context(self._open(0))
                self.raw = cast(RangedReader, raw.raw)
                stream: Any = stack.enter_context(open_decompressed(raw, self.compression))
                stream = self._ahead(stream, self.reading, stack)
                parser = make_parser(self.fmt, stream, max_line_bytes=max_bytes, reading=self.reading, fast=self.fast)
                records = iter(parser)
                skipped = sum(1 for _ in islice(records, next_record))
                if skipped != next_record:
                    raise BadFile(f"{self.where} has fewer records ({skipped}) than its checkpoint ({next_record})")
                return records, parser
            offset = byte_offset or 0
            header = None
            head = None
            reading = self.reading
            if self.fmt == "json" and offset > 0:  # JSON Lines or a document: told by the first bytes
                with self._open(0, window=SNIFF) as first:
                    head = first.read(SNIFF)
            if self.fmt == "csv" and offset > 0:
                reading, header = self._csv_head()
            stream = stack.enter_context(self._open(offset))
            self.raw = cast(RangedReader, stream.raw)
            stream = self._ahead(stream, reading, stack)
            parser = make_parser(
                self.fmt,
                stream,
                offset=offset,
                line=line,
                header=header,
                max_line_bytes=max_bytes,
                reading=reading,
                head=head,
                fast=self.fast,
            )
            return iter(parser), parser
        except ValueError as err:  # an unreadable CSV header
            if isinstance(err, BadFile):
                raise
            raise BadFile(f"{self.where}: {err}") from None

    def _ahead(self, stream: Any, reading: Reading, stack: contextlib.ExitStack) -> Any:
        """The stream read ahead in a thread of its own where the fast CSV path parses it (its native
        parsing and the next blocks' transfer, or decompression, then overlap)."""
        if self.fmt != "csv" or not self.fast or not fast_reading(reading) or self.size < AHEAD_MIN_BYTES:
            return stream
        ahead = ReadAhead(stream)
        stack.callback(ahead.close)
        return ahead

    def _csv_head(self) -> tuple[Reading, list[str] | None]:
        """Resuming a CSV: what its first bytes say, its column names (from the header row, or the
        number of fields of its first row with ``header: none``; None when given in the job) and, for
        ``utf-16``, its byte order (from its BOM)."""
        reading = self.reading
        if reading.names is not None and reading.encoding != "utf-16":
            return reading, None
        with self._open(0, window=64 * 1024) as head:
            if reading.encoding == "utf-16":
                codec, _ = utf16_byte_order(head.peek(2)[:2], reading.encoding)
                resumed = dataclasses.replace(reading, encoding=codec)
            else:
                resumed = reading
            header = None if reading.names is not None else read_csv_header(head, self.max_record_bytes, reading)
        return resumed, header

    def parquet_rows(self, next_record: int, stack: contextlib.ExitStack) -> tuple[Iterator[Record], Parser]:
        """The rows of a Parquet file from row ``next_record`` on (earlier row groups are not read)."""
        file = stack.enter_context(
            PinnedFile(self.s3, self.bucket, self.key, etag=self.etag, size=self.size, version_id=self.version_id)
        )
        self.raw = file
        parser = ParquetParser(file, self.where, next_record)
        return iter(parser), parser

    def bad_document(self, err: BadDocument, committed: int) -> BadFile:
        """A JSON document whose structure is broken: a bad file, not worth retrying."""
        return BadFile(
            f"{self.where}: {err} ({committed} records committed before). Fix the file and upload it again "
            "(or set format to 'jsonl' if it is JSON Lines); retrying cannot fix it."
        )

    def bad_compressed(self, err: CorruptCompressed, committed: int) -> BadFile:
        """A corrupt or truncated compressed file: a bad file, not worth retrying. Never quotes its bytes.

        Args:
            committed: Records committed before.
        """
        at = self.raw.position if self.raw is not None else 0
        return BadFile(
            f"{self.where} {err.what}, near compressed byte {at} ({committed} records committed before). "
            + advice(err.compression)
        )

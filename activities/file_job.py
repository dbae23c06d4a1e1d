"""One attempt at one file: the chunk loop, its heartbeats, and stopping on a worker shutdown.

Write-then-checkpoint: a chunk's part (data + checkpoint metadata) is written in one PUT, and only
then heartbeated. Where to resume and how a part is committed: :mod:`s3batch.file_output`; reading
the records: :mod:`s3batch.formats.source`; the handler and the chunk's books: ``handling``.
"""

from __future__ import annotations

import contextlib
import time
from itertools import islice
from typing import TYPE_CHECKING, Any

from s3batch.activities.file_setup import FileMetrics, check_key_length, chunk_paths, open_file_sink, read_as_begun
from s3batch.activities.handling import HandlerRun
from s3batch.activities.lease import Lease
from s3batch.activities.rejected import RejectedLines, records_from
from s3batch.activities.splits import open_split
from s3batch.activities.taking import Chunk, take, take_packed
from s3batch.activities.verify import verify_output
from temporalio import activity

from s3batch.checkpoint import Checkpoint, HeartbeatDetails
from s3batch.config import Settings
from s3batch.errors import TooManyRejects, WorkerShutdown
from s3batch.formats.common import Record
from s3batch.formats.compression import CorruptCompressed
from s3batch.formats.fastcsv import FastCsvParser
from s3batch.formats.json import BadDocument
from s3batch.formats.keys import resolve_format
from s3batch.formats.source import SourceFile, reading_of
from s3batch.handlers import ChunkContext, get_handler
from s3batch.limits import check_allowed, check_ceilings
from s3batch.messages import FileResult, ProcessFileInput
from s3batch.rejects import DelimiterProbe, FileLimits, crossed, file_counts, merge, too_many, warnings_of
from s3batch.s3io import head_pinned
from s3batch.sinks.earlier import written_before
from s3batch.sinks.rows import CsvRows

if TYPE_CHECKING:
    from collections.abc import Iterator

    from mypy_boto3_s3 import S3Client

    from s3batch.formats.parsers import Parser
    from s3batch.sinks.postgres_pools import PostgresPools

FAST_MIN_BYTES = 64 * 1024
"""Smaller files are read by the exact parser alone: the fast path's set-up (pyarrow's reader, a block's
kernels) costs more than it saves on a few hundred rows."""

BEAT_INTERVAL = 1.0
"""Seconds between two heartbeat calls of one file (see ``FileJob._beat``)."""

_NO_END = 1 << 62  # the end offset of a file that is not split (past any object)

# Records handed to the handler at once. Between two of these the activity heartbeats (liveness)
# and checks for cancellation, so a big chunk is never mistaken for a dead worker.
_SUB_BATCH = 1_000


class FileJob:
    """One attempt at one file.

    Args:
        s3: The S3 client.
        settings: The worker's settings (allow-lists, ceilings, output encryption, checkpoint secret).
        req: The file and the job options.
        heartbeat: The checkpoint found in the last heartbeat details for this file, if any.
        index: Position of the file in its group; sent along with each heartbeat.
        fresh: Known to have no output yet (its group's output prefix is empty).
        pools: The worker's PostgreSQL pools (for a job whose ``sink`` is a table).
        lease: The attempt's :class:`~s3batch.activities.lease.Lease` (a group's files share one).
    """

    def __init__(
        self,
        s3: S3Client,
        settings: Settings,
        req: ProcessFileInput,
        heartbeat: Any = None,
        index: int | None = None,
        *,
        fresh: bool = False,
        pools: PostgresPools | None = None,
        lease: Lease | None = None,
    ) -> None:
        self.s3 = s3
        self.settings = settings
        self.req = req
        # A workflow input reaches this activity even when check_job was skipped: check again.
        check_allowed(settings, "sources", req.bucket, req.obj.key)
        check_allowed(settings, "outputs", req.output_bucket, req.output_prefix)
        check_ceilings(settings, req.chunk_records, req.max_record_bytes, f"s3://{req.bucket}/{req.obj.key}")
        self._heartbeat_hint = heartbeat
        self._fresh = fresh
        self._index = index
        self._last_commit = time.monotonic()
        self.obj = req.obj
        self.where = f"s3://{req.bucket}/{req.obj.key}"
        self.log_extra: dict[str, Any] = {"s3_key": req.obj.key}
        self.info = activity.info()
        self.lease = lease or Lease.of(self.info)
        self.books = HandlerRun(get_handler(req.handler), req.handler, self.where)
        # Only a registered handler's name becomes a metrics label.
        self.metrics = FileMetrics(req.handler)
        self.fmt, self.compression = resolve_format(req.obj.key, req.format)
        self.gz = self.compression is not None
        """Compressed (gzip, zstd or bzip2): read from the start, no byte offsets."""
        self.limits = FileLimits(**req.model_dump(include={"max_rejected_records", "max_rejected_ratio"}))
        self.reading = reading_of(req, self.fmt, self.where)
        # Its hint says the file was read as ','-separated: only then can it be right.
        self.probe = DelimiterProbe(self.fmt == "csv" and self.reading.delimiter == ",")
        self.redrive = RejectedLines.of(s3, req, self.where, settings)  # only these records (a redrive of rejects)
        self.source = SourceFile(
            s3,
            bucket=req.bucket,
            key=req.obj.key,
            etag=req.obj.etag,
            size=req.obj.size,
            fmt=self.fmt,
            compression=self.compression,
            max_record_bytes=req.max_record_bytes,
            reading=self.reading,
            fast=settings.csv_fast_path and req.obj.size >= FAST_MIN_BYTES and self.redrive is None,
        )
        self.output = open_file_sink(
            s3, settings, req, self.fmt, self.compression, self.reading, self.where, self.log_extra, pools, self.redrive
        )
        self._packed, self._as_csv, self.behind = chunk_paths(self.books.handler, self.output, req.obj.size)
        self.dir = self.output.dir
        self.split = open_split(self) if req.split is not None else None  # a byte range of the file, or None
        check_key_length(req, self.compression, self.where)
        self.checkpoint: Checkpoint | None = None
        """The last checkpoint this attempt committed or found committed."""
        self._source_checked = False
        self.resumed_from = 0
        """``next_record`` this attempt started from."""
        self.fast_records = 0
        """Records this attempt read by the fast CSV path (``s3batch.formats.fastcsv``)."""

    # ---------------------------------------------------------------- resume and result

    def _heartbeat_checkpoint(self) -> Checkpoint | None:
        if self._heartbeat_hint is None:
            return None
        cp = HeartbeatDetails(self._heartbeat_hint).read()
        if cp is None:
            activity.logger.warning("ignoring unreadable heartbeat details of %s", self.where, extra=self.log_extra)
            return None
        return cp if self.output.is_ours(cp) else None

    def _resume_point(self) -> Checkpoint:
        hint = self._heartbeat_checkpoint()
        offset: int | None = None if self.gz or self.fmt == "parquet" else 0
        line = 1
        if self.split is not None and hint is None:
            offset, line = self.split.start()
        obj, fp = self.obj, self.output.fingerprint
        start = Checkpoint(etag=obj.etag, version_id=obj.version_id, fingerprint=fp, byte_offset=offset, line=line)
        return read_as_begun(self, self.output.resume_point(hint, start, fresh=self._fresh))

    def run(self) -> FileResult:
        cp = self._resume_point()
        self.checkpoint = cp
        self.resumed_from = resumed_from = cp.next_record
        if resumed_from:
            self.metrics.resumes.add(1)
            activity.logger.info(
                "resuming %s at record %d (chunk %d)", self.where, cp.next_record, cp.chunk, extra=self.log_extra
            )
        if cp.done:
            self.confirm_source()  # found complete: still one request pinned to the listed version
            self._check_rejects(cp)  # e.g. a redrive with the same limits
        else:
            cp = self._process_from(cp)
        self.books.check_records(cp)
        activity.logger.info(
            "finished %s: %d records written, %d rejected, %d dropped, %d chunks (%d records read by the fast path)",
            self.where, cp.records_written, cp.rejected, cp.dropped, cp.chunk, self.fast_records, extra=self.log_extra,
        )  # fmt: skip
        return self.result(cp)

    def result(self, cp: Checkpoint) -> FileResult:
        """The result of the file, complete at ``cp`` (found so at the start: maybe written by an earlier job)."""
        warnings = warnings_of(cp.rejected, cp.next_record, cp.reject_reasons, cp.delimiter_hint)
        earlier = self.resumed_from == cp.next_record and written_before(self.output, cp, self.req.job_id)
        return FileResult(
            key=self.obj.key,
            etag=self.obj.etag,
            status="succeeded",
            bytes_read=self.obj.size if self.req.split is None else self.req.split.end - self.req.split.start,
            attempts=self.info.attempt,
            resumed_from_record=self.resumed_from,
            warnings=warnings or None,
            version_id=cp.version_id or self.obj.version_id,
            **file_counts(cp, earlier=earlier),
        )

    def _check_rejects(self, cp: Checkpoint) -> None:
        """At a chunk boundary: fail the file (``TooManyRejects``) once over a limit (a split's: see ``merged``)."""
        limit = crossed(self.limits, cp.rejected, cp.next_record, done=cp.done, whole_file=self.req.split is None)
        if limit is not None:
            activity.logger.warning("%s: too many rejects (%s)", self.where, limit, extra=self.log_extra)
            output = f"s3://{self.req.output_bucket}/{self.dir}"
            raise too_many(self.where, limit, file_counts(cp), cp.reject_reasons, output, self.req.job_id)

    def confirm_source(self) -> None:
        """Make sure the source still is the listed version (one pinned HEAD, unless a pinned read
        already succeeded). Raises ``NotFound`` / ``SourceChanged``."""
        raw = self.source.raw
        if self._source_checked or (raw is not None and raw.checked):
            return
        version = self.checkpoint.version_id if self.checkpoint else self.obj.version_id
        head_pinned(self.s3, self.req.bucket, self.obj.key, etag=self.obj.etag, version_id=version)
        self._source_checked = True

    def verify(self, result: FileResult, listed: dict[str, str] | None = None) -> FileResult:
        """Check the file's output folder once it is done (:func:`~s3batch.activities.verify.verify_output`)."""
        return verify_output(self, result, listed)

    # ---------------------------------------------------------------- the chunk loop

    def _process_from(self, cp: Checkpoint) -> Checkpoint:
        try:
            return self._chunks_from(cp)
        except CorruptCompressed as err:
            committed = self.checkpoint.next_record if self.checkpoint else 0
            raise self.source.bad_compressed(err, committed) from None
        except BadDocument as err:  # found while reading a JSON document, after its first records
            committed = self.checkpoint.next_record if self.checkpoint else 0
            raise self.source.bad_document(err, committed) from None

    def _chunks_from(self, cp: Checkpoint) -> Checkpoint:
        self.source.version_id = cp.version_id
        req = self.req
        self.probe.active = self.probe.active and cp.chunk == 0  # a resumed file's hint is in its checkpoint
        end = self.split.find_end(cp.version_id) if self.split is not None else _NO_END
        self._beat()
        with contextlib.ExitStack() as stack:
            stack.push(self._close_behind)
            records, parser = records_from(self.source, cp, stack, self.redrive)
            lookahead: list[Record] = []
            chunk_start = parser.offset  # bytes of the (decompressed) source read before this chunk
            packed = parser if (self._packed or self._as_csv) and isinstance(parser, FastCsvParser) else None
            stack.callback(self._count_fast, parser)
            while True:
                self._stop_if_asked()
                # Cancellation is delivered at the end of this block, never while a chunk is half built;
                # its part's write (one chunk behind, WriteBehind) is waited for before the file stops.
                with activity.shield_thread_cancel_exception():
                    self.books.context = ChunkContext(
                        req.job_id,
                        req.bucket,
                        self.obj.key,
                        self.obj.etag,
                        cp.chunk,
                        self.info.attempt,
                        None if self.split is None else self.split.index,
                    )
                    chunk: Chunk = ([], [], [])  # outputs, rejects, the source line of each output
                    csv_rows = self._csv_rows(packed)
                    taken, joined = self._fill(chunk, (records, parser, packed), lookahead, chunk_start, csv_rows)
                    end_offset = None if self.gz or self.fmt == "parquet" else parser.offset
                    end_line = parser.line
                    chunk_start = parser.offset
                    if parser.offset >= end and self.split is not None:
                        self.split.check_end(parser.offset)
                        lookahead, done = [], True
                    else:
                        lookahead = list(islice(records, 1))
                        done = not lookahead
                    written = len(chunk[0]) + joined
                    cp = self._commit(cp, taken, chunk, written, end_offset, end_line, done, csv_rows)
                if done:
                    self.behind.settle()
                    assert self.checkpoint is not None
                    return self.checkpoint

    def _fill(
        self,
        chunk: Chunk,
        source: tuple[Iterator[Record], Parser, FastCsvParser | None],
        lookahead: list[Record],
        chunk_start: int,
        csv_rows: CsvRows | None,
    ) -> tuple[int, int]:
        """Read and handle one chunk's records into ``chunk`` (after ``lookahead``, the record read past
        the last chunk); returns the records taken and the outputs kept beyond one per ``chunk[0]`` element.

        A chunk ends after chunk_records records, or once its source bytes or its buffered output reach
        the worker's byte budget (S3BATCH_MAX_CHUNK_BYTES): its checkpoint is exact either way, and
        memory stays about the budget."""
        records, parser, packed = source
        req, budget = self.req, self.settings.max_chunk_bytes
        sub_batch = min(req.chunk_records, _SUB_BATCH)
        taken = buffered = joined = 0
        end = _NO_END if self.split is None or self.split.end is None else self.split.end  # a split ends there
        while taken < req.chunk_records and buffered < budget and parser.offset - chunk_start < budget:
            # Past a split's end, only the record read ahead (it began before the end) is left to take.
            want = min(sub_batch, req.chunk_records - taken) - len(lookahead) if parser.offset < end else 0
            # A sub-batch reads at most 1/16 of the budget, so the output check between two of them
            # bounds what a handler's outputs can add.
            until = min(chunk_start + budget, parser.offset + max(budget // 16, 1), end)
            if packed is not None:  # taken as below, so the chunk ends where the exact path ends it
                got, size, more = take_packed(
                    self.books, self.probe, (records, packed), lookahead, chunk, want, until, csv_rows
                )
                joined += more
            else:
                batch = lookahead + (take(records, parser, want, until) if want > 0 else [])
                got = len(batch)
                if got:
                    self.probe.see(getattr(parser, "header", None), (r.value for r in batch))
                    size = self.books.handle(batch, *chunk)
            lookahead = []
            if not got:
                break
            taken += got
            buffered += size
            self._beat()  # liveness; the SDK throttles what reaches the server
        return taken, joined

    def _csv_rows(self, parser: FastCsvParser | None) -> CsvRows | None:
        if not self._as_csv or parser is None or parser.header is None:
            return None
        return CsvRows(parser.header, self.reading.delimiter, self.reading.quotechar, self.reading.empty_null)

    def _count_fast(self, parser: object) -> None:
        self.fast_records = getattr(parser, "fast_records", 0)

    def _commit(
        self,
        cp: Checkpoint,
        taken: int,
        chunk: tuple[list[bytes], list[tuple[int, bytes]], list[int]],
        written: int,
        end_offset: int | None,
        end_line: int,
        done: bool,
        csv_rows: CsvRows | None = None,
    ) -> Checkpoint:
        """Commit the chunk (``chunk``: its outputs, rejects and the source line of each output; ``csv_rows``:
        more outputs, as CSV for a table) with the new checkpoint through the sink: for S3 parts, the
        rejects, then the part carrying the checkpoint."""
        output, rejects, lines = chunk
        raw = self.source.raw
        reasons = self.books.take_reasons()
        new = cp.model_copy(
            update={
                "next_record": cp.next_record + taken,
                "byte_offset": end_offset,
                "line": end_line,
                "chunk": cp.chunk + 1,
                # Pinned by the first read on a versioned bucket; later attempts read that version.
                "version_id": cp.version_id or (raw.version_id if raw is not None else None),
                "records_written": cp.records_written + written,
                "rejected": cp.rejected + len(rejects),
                "dropped": cp.dropped + self.books.dropped,
                "done": done,
                "reject_reasons": merge(cp.reject_reasons, reasons) if reasons else cp.reject_reasons,
                # Found in the first chunk only: the same for every attempt (parts are deterministic).
                "delimiter_hint": cp.delimiter_hint or self.probe.hint,
            }
        )
        self.probe.active = False
        self.books.check_chunk(cp, taken, written, len(rejects))
        # The sink may count refused rows as rejects (a table: written at once, so the next chunk counts on
        # them). Packed outputs are whole lines joined: only the JSONL parts, which join the same way, get them.
        committed: list[Checkpoint] = []

        def then(done_cp: Checkpoint) -> None:
            self.checkpoint = done_cp
            self._last_commit = self.metrics.chunk_committed(cp, done_cp, taken, self._last_commit)
            self._beat(force=True)  # every committed checkpoint
            committed.append(done_cp)
            self._check_rejects(done_cp)

        sink: Any = self.output
        at_once = csv_rows is not None or self.behind.threads > 1  # a PostgresOutput (takes_csv, writes_at_once)

        def commit(after: Any) -> Checkpoint:
            self.lease.check(self.where)  # silent past its heartbeat timeout: it commits nothing more
            return sink.commit(cp, new, output, rejects, lines, *((csv_rows, after) if at_once else ()))

        self.behind.write(commit, then)
        return committed[0] if committed else new

    def _close_behind(self, kind: object, error: BaseException | None, tb: object) -> None:
        committed = self.behind.close(error)
        if committed is not None:
            self.checkpoint = committed  # e.g. a cancelled file reports the chunk written while cancelling
            if isinstance(error, TooManyRejects) and committed.chunk > error.counts.get("chunks", committed.chunk):
                self._check_rejects(committed)  # over the limit again, with the counts of what is committed

    def _beat(self, *, force: bool = False) -> None:
        """Heartbeat the last committed checkpoint: always when forced (a chunk just committed), else at most every
        ``BEAT_INTERVAL`` seconds (liveness within a chunk, the start of a file). Each call costs about 0.2 ms (a
        hand-over to the event loop); the SDK sends at most one per 0.8 x heartbeat timeout anyway."""
        if self.lease.due(force, BEAT_INTERVAL):
            assert self.checkpoint is not None
            activity.heartbeat(*self._details().args())

    def _details(self) -> HeartbeatDetails:
        """What :meth:`_beat` sends: the last committed checkpoint (and the file's place in its group)."""
        return HeartbeatDetails(self.checkpoint, self._index)

    def _stop_if_asked(self) -> None:
        """At a chunk boundary: hand the file over when the worker is shutting down (its last chunk's
        write done and heartbeated first)."""
        if activity.is_worker_shutdown():
            self.behind.settle()
            cp = self.checkpoint
            assert cp is not None
            self._beat(force=True)
            activity.logger.info(
                "worker shutting down: %s stops at record %d", self.where, cp.next_record, extra=self.log_extra
            )
            raise WorkerShutdown(f"worker shutting down; {self.where} continues elsewhere from record {cp.next_record}")

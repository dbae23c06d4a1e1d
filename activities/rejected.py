"""A redrive of rejected records (the job option ``rejected_of``, ``s3batch redrive --rejected JOB``): which records
of a file an earlier job rejected, and only those of the file's records.

**The lines** come from that job's rejects files in the file's output folder (``{its output_prefix}{key}/
rejects-*.jsonl``, a ``{"line", "reason", "record"}`` document a line), read here, by the file activity: never
through workflow history, which stays small and holds no record data. Only rejects files written for the version
of the file being read count (the ETag of the checkpoint each carries; with a checkpoint secret, only those whose
HMAC verifies): a file whose rejects are all of another version changed since it was rejected, and is refused
(``SourceChanged``), as the records it rejected are not in it any more.

**The records.** The file is read as any import reads it (from its start, or from the checkpoint of an attempt
that resumes), and only the records that start on one of those lines go to the handler (:meth:`RejectedLines.only`):
the chunk loop counts only them (``next_record``, ``records`` in the report: the records redriven, not the file's).
A record is known by its line: two records starting on one line the rejects name (a JSON document with several
records on a line) cannot be told apart, and fail the file (``BadFile``) before either is written. A record is
redriven whole: a handler that writes several outputs for one record writes all of them again.

**The identity** of the redrive (:attr:`RejectedLines.identity`: the report redriven, the source version and the
lines) enters the fingerprint of its output (``s3batch.fingerprints``): its checkpoints are not the earlier
import's (a table keeps the redrive's in a checkpoint row of its own, ``s3batch.sinks.postgres_checkpoint``), the
same redrive run again finds them (done: nothing written twice), and a redrive of the redrive (other lines, another
report) is another one.
"""

from __future__ import annotations

import contextlib
import hashlib
import sys
import time
from array import array
from bisect import bisect_left
from collections.abc import Iterator
from typing import TYPE_CHECKING

import orjson
from botocore.exceptions import BotoCoreError, ClientError
from pydantic import ValidationError
from temporalio import activity

from s3batch import layout
from s3batch.checkpoint import CHECKPOINT_MAC_METADATA, CHECKPOINT_METADATA, Checkpoint, checkpoint_mac_ok
from s3batch.errors import BadFile, InvalidInput, NotFound, SourceChanged
from s3batch.limits import check_allowed
from s3batch.s3io import raise_s3_error

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

    from s3batch.config import Settings
    from s3batch.formats.common import Record
    from s3batch.formats.parsers import Parser
    from s3batch.formats.source import SourceFile
    from s3batch.messages import ProcessFileInput


def rejected_folder(rejected_of: str, key: str) -> tuple[str, str]:
    """Bucket and output folder of source ``key`` in the job whose report is ``rejected_of``
    (``s3://bucket/{output_prefix}_report.json``)."""
    bucket, _, report_key = rejected_of.removeprefix("s3://").partition("/")
    return bucket, layout.file_dir(report_key.removesuffix(layout.report_key("")), key)


class RejectedLines:
    """The lines of one file's records an earlier job rejected (sorted, once each), and the redrive's identity."""

    def __init__(self, lines: array[int], identity: str, where: str) -> None:
        self.lines = lines
        self.identity = identity
        """A digest of the report redriven, the source version and the lines (enters the output's fingerprint)."""
        self.where = where

    @classmethod
    def of(cls, s3: S3Client, req: ProcessFileInput, where: str, settings: Settings) -> RejectedLines | None:
        """The rejected lines of the file of ``req`` when its job redrives rejected records, else None.

        Raises:
            SourceChanged: The file's rejects are all of another version of it.
            NotFound: The job redriven left no rejects files of the file.
            InvalidInput: The file is a byte-range split (a redrive of rejected records processes files whole), or
                the worker may not read that job's output (``S3BATCH_ALLOWED_OUTPUTS``).
        """
        if req.rejected_of is None:
            return None
        if req.split is not None:
            raise InvalidInput(f"{where}: a redrive of rejected records processes a file whole, never in splits")
        bucket, folder = rejected_folder(req.rejected_of, req.obj.key)
        check_allowed(settings, "outputs", bucket, folder, also="sources")  # the rejects of a job's output
        secret = settings.checkpoint_secret.get_secret_value().encode() or None
        found: list[int] = []
        others: set[str] = set()
        beat = time.monotonic()
        for key in _rejects_keys(s3, bucket, folder):
            if time.monotonic() - beat >= 1.0:  # many rejects files: alive, the details as they were (a hint)
                activity.heartbeat(*activity.info().heartbeat_details)
                beat = time.monotonic()
            try:
                got = s3.get_object(Bucket=bucket, Key=key)
                metadata = got.get("Metadata", {})
                cp = _checkpoint(metadata, secret, bucket, key)
                if cp is None:
                    continue
                if cp.etag != req.obj.etag:
                    others.add(cp.etag)
                    continue
                found += (int(orjson.loads(line)["line"]) for line in got["Body"].iter_lines() if line.strip())
            except (ClientError, BotoCoreError) as err:
                raise_s3_error(err, "reading the rejects of", bucket, key)
        uri = f"s3://{bucket}/{folder}"
        if not found and others:
            raise SourceChanged(
                f"{where} changed since its records were rejected: the rejects files under {uri} are of its version "
                f"ETag {', '.join(sorted(others))}, and it is ETag {req.obj.etag} now. A redrive of rejected records "
                "reads them again from the version that rejected them; nothing was written for this file. Import the "
                "new version with a new job instead."
            )
        if not found:
            raise NotFound(
                f"no rejects files of {where} (version ETag {req.obj.etag}) under {uri}, though the job redriven "
                "reported rejected records of it: they were removed (or written without the workers' checkpoint "
                "secret). Nothing was written for this file."
            )
        lines = array("q", sorted(set(found)))
        return cls(lines, _identity(req.rejected_of, req.obj.etag, lines), where)

    def only(self, records: Iterator[Record], start_line: int) -> Iterator[Record]:
        """The records of ``records`` that start on one of the lines, from ``start_line`` on (an attempt resumed
        there, or a compressed file read again from its start); ends after the last line, without reading on.

        Raises:
            BadFile: Two records start on one of the lines.
        """
        lines, n = self.lines, len(self.lines)
        i = bisect_left(lines, start_line)
        taken = 0
        for record in records:
            line = record.line
            while i < n and lines[i] < line:
                i += 1
            if i == n:
                return
            if lines[i] != line:
                continue
            if taken == line:
                raise BadFile(
                    f"{self.where}: two records start on line {line}, whose rejected record a redrive of rejected "
                    "records must read again; it knows a record by its line, so it cannot tell them apart (a JSON "
                    "document with several records on one line). Neither was written: process the file with a new "
                    "job instead."
                )
            taken = line
            yield record


def records_from(
    source: SourceFile, cp: Checkpoint, stack: contextlib.ExitStack, redrive: RejectedLines | None
) -> tuple[Iterator[Record], Parser]:
    """The file's records from checkpoint ``cp`` on (``SourceFile.records``); in a redrive of rejected records, only
    those on its lines, from ``cp``'s line on (a compressed or Parquet file is read again from its start: ``cp``
    counts the records redriven, not the file's)."""
    if redrive is None:
        return source.records(cp.next_record, cp.byte_offset, cp.line, stack)
    whole = source.compression is not None or source.fmt == "parquet"
    records, parser = source.records(0 if whole else cp.next_record, cp.byte_offset, cp.line, stack)
    return redrive.only(records, cp.line), parser


def _rejects_keys(s3: S3Client, bucket: str, folder: str) -> list[str]:
    """The keys of the rejects files directly in ``folder`` (of the whole file, or of its splits)."""
    keys: list[str] = []
    try:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=folder):
            for item in page.get("Contents", []):
                found = layout.output_of(item["Key"][len(folder) :])
                if found is not None and found[0] == "rejects":
                    keys.append(item["Key"])
    except (ClientError, BotoCoreError) as err:
        raise_s3_error(err, "listing the rejects under", bucket, folder)
    return sorted(keys)


def _checkpoint(metadata: dict[str, str], secret: bytes | None, bucket: str, key: str) -> Checkpoint | None:
    """The checkpoint a rejects file carries, or None (none, unreadable, or its HMAC does not verify)."""
    raw = metadata.get(CHECKPOINT_METADATA)
    if not raw:
        return None
    if secret is not None and not checkpoint_mac_ok(secret, bucket, key, raw, metadata.get(CHECKPOINT_MAC_METADATA)):
        activity.logger.warning("s3://%s/%s carries no valid HMAC (S3BATCH_CHECKPOINT_SECRET): not read", bucket, key)
        return None
    try:
        return Checkpoint.model_validate_json(raw)
    except ValidationError:
        return None


def _identity(rejected_of: str, etag: str, lines: array[int]) -> str:
    digest = hashlib.sha256(f"{rejected_of}\0{etag}\0".encode())
    if sys.byteorder == "big":  # the same digest on any worker
        lines = array("q", lines)
        lines.byteswap()
    digest.update(lines.tobytes())
    return digest.hexdigest()[:16]

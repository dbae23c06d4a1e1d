"""A file's output folder on S3: committing each chunk's part with its checkpoint, and finding where to resume.

A chunk's part carries the checkpoint after the chunk in its user metadata (see :mod:`s3batch.checkpoint`); a
later attempt resumes from the furthest of its heartbeat checkpoint and the last contiguous committed part
(:meth:`FileOutput.resume_point`); a part is reused only when its checkpoint was written for the same source
version and the same options.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from botocore.exceptions import BotoCoreError, ClientError
from pydantic import ValidationError
from temporalio import activity

from s3batch import layout
from s3batch.checkpoint import (
    CHECKPOINT_MAC_METADATA,
    CHECKPOINT_METADATA,
    Checkpoint,
    checkpoint_mac,
    checkpoint_mac_ok,
)
from s3batch.errors import AccountingError
from s3batch.objects import data_stores
from s3batch.s3io import any_object, is_missing_object, raise_s3_error, strip_etag

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

OutputKind = Literal["part", "rejects"]


class FileOutput:
    """The output folder of one source file (one version, one set of options) and what is committed there.

    Args:
        s3: The S3 client.
        bucket: The output bucket.
        output_prefix: The job's output prefix.
        key: The source key.
        etag: The source version's ETag: checkpoints written for another are not this file's.
        fingerprint: The options' :func:`~s3batch.fingerprints.fingerprint`.
        secret: The workers' checkpoint secret (``S3BATCH_CHECKPOINT_SECRET``), or None.
        put_params: Further ``put_object`` arguments (server-side encryption).
        log_extra: ``extra`` of the log lines about this file.
        rows_fingerprint: For a table (PostgreSQL sink): the fingerprint without ``chunk_records``; a checkpoint
            carrying the same is this file's too (None: only the same ``fingerprint`` is).
    """

    def __init__(
        self,
        s3: S3Client,
        *,
        bucket: str,
        output_prefix: str,
        key: str,
        etag: str,
        fingerprint: str,
        secret: bytes | None,
        put_params: dict[str, Any],
        log_extra: dict[str, Any],
        rows_fingerprint: str | None = None,
    ) -> None:
        self.s3 = s3
        self.bucket = bucket
        self.output_prefix = output_prefix
        self.key = key
        self.etag = etag
        self.fingerprint = fingerprint
        self.rows_fingerprint = rows_fingerprint
        self._secret = secret
        self._put_params = put_params
        self._log_extra = log_extra
        self.dir = layout.file_dir(output_prefix, key)
        """The folder (ends with ``/``)."""
        self.known: dict[str, tuple[str, Checkpoint]] = {}
        """Output objects known to be ours: name -> (ETag, the checkpoint stored on it)."""
        self.marks: dict[str, str] = {}  # more user metadata of the objects it writes (``s3batch.sinks.earlier``)
        self.split: int | None = None  # the byte-range split of the file this output is for (None: all of it)
        self.splits = 1

    def for_split(self, index: int, count: int, start: int, end: int) -> None:
        """Make this the output of split ``index`` of ``count`` (nominal bytes ``start``-``end``): names
        (``layout.part_name``) and a fingerprint of its own (another way of splitting the file is not this)."""
        self.split, self.splits = index, count
        shape = json.dumps({"of": self.fingerprint, "split": [index, count, start, end]}, sort_keys=True)
        self.fingerprint = hashlib.sha256(shape.encode()).hexdigest()[:16]
        self.rows_fingerprint = None

    part_suffix = layout.JSONL
    """Suffix of the part objects (``part-00000.jsonl``)."""
    part_content_type = "application/x-ndjson"

    def _key(self, chunk: int, kind: OutputKind) -> str:
        return self.dir + self._name(chunk, kind)

    def _name(self, chunk: int, kind: OutputKind) -> str:
        if kind == "part":
            return layout.part_name(chunk, self.part_suffix, self.split)
        return layout.rejects_name(chunk, self.split)

    def is_ours(self, cp: Checkpoint) -> bool:
        """Whether ``cp`` was written for this source version and these options (for a table: options that
        write the same rows, ``rows_fingerprint``)."""
        if cp.etag != self.etag:
            return False
        rows = self.rows_fingerprint
        return cp.fingerprint == self.fingerprint or (rows is not None and cp.rows_fingerprint == rows)

    def committed(self, chunk: int, kind: OutputKind = "part") -> Checkpoint | bool | None:
        """The checkpoint stored on output ``chunk`` (its part, or its rejects): a Checkpoint, None
        if absent, False if it was written for another source version or other options, or, with a
        checkpoint secret, when its HMAC is missing or wrong."""
        key = self._key(chunk, kind)
        try:
            head = self.s3.head_object(Bucket=self.bucket, Key=key)
        except (ClientError, BotoCoreError) as err:
            if isinstance(err, ClientError) and is_missing_object(err):
                return None
            raise_s3_error(err, "reading", self.bucket, key)
        metadata = head.get("Metadata", {})
        raw = metadata.get(CHECKPOINT_METADATA)
        if (
            raw
            and self._secret is not None
            and not checkpoint_mac_ok(self._secret, self.bucket, key, raw, metadata.get(CHECKPOINT_MAC_METADATA))
        ):
            # Written without the workers' secret (an older release, a worker without it, whoever else can
            # write the output prefix): never trusted, the chunk is processed again and the object replaced.
            activity.logger.warning(
                "%s carries a checkpoint without a valid HMAC (S3BATCH_CHECKPOINT_SECRET): not reused",
                f"s3://{self.bucket}/{key}",
                extra=self._log_extra,
            )
            return False
        try:
            cp = Checkpoint.model_validate_json(raw) if raw else None
        except ValidationError:
            cp = None
        if cp is None or not self.is_ours(cp) or cp.chunk != chunk + 1:
            return False
        self.known[key[len(self.dir) :]] = (strip_etag(head.get("ETag", "")), cp)
        return cp

    def resume_point(self, heartbeat: Checkpoint | None, start: Checkpoint, *, fresh: bool) -> Checkpoint:
        """The furthest of the heartbeat checkpoint (or ``start`` without one) and the last
        contiguous committed part.

        The heartbeat is throttled: the parts written since the last one that reached the server are
        found by probing (:meth:`_last_committed`). Nothing is deleted here: output not of this version
        is replaced, or removed once the file is done, so a changed source never costs committed output.

        Args:
            heartbeat: This file's checkpoint from the last heartbeat details, if it is ours.
            start: The checkpoint of a file not started yet.
            fresh: Known to have no output yet (its group's output prefix is empty).
        """
        cp = heartbeat
        if cp is None:
            cp = start
            if fresh or not any_object(self.s3, self.bucket, self.dir):
                return cp  # a fresh file: nothing to probe (the common case, one request)
        return self._last_committed(cp)

    def _last_committed(self, cp: Checkpoint) -> Checkpoint:
        """The checkpoint of the last committed part from ``cp`` on (``cp`` itself when part ``cp.chunk``
        is not committed), found with a HEAD of part ``n + 1``, ``n + 2``, ``n + 4``... then a binary
        search between the last found and the first missing: about 2 log2(n) requests for n parts (a
        file handed over after 2,000 parts, with no heartbeat, costs about 22, not 2,000).

        Parts are committed in order, one write in flight at a time, so this version's parts are always
        a prefix: a part missing, or another version's, ends it. (A part removed by hand in the middle
        is found by the check of the whole folder once the file is done: ``stale``.)"""

        def at(chunk: int) -> Checkpoint | None:
            found = self.committed(chunk)
            if not isinstance(found, Checkpoint):
                return None
            return found.model_copy(update={"version_id": cp.version_id or found.version_id})

        good, best = cp.chunk - 1, cp  # part `good` is committed (or, at -1 / the heartbeat's, known)
        step, missing = 1, None
        while not best.done and missing is None:
            found = at(good + step)
            if found is None:
                missing = good + step
            else:
                good, best = good + step, found
                step *= 2
        while missing is not None and missing - good > 1 and not best.done:
            mid = (good + missing) // 2
            found = at(mid)
            if found is None:
                missing = mid
            else:
                good, best = mid, found
        return best

    def commit(
        self,
        cp: Checkpoint,
        new: Checkpoint,
        output: list[bytes],
        rejects: list[tuple[int, bytes]],
        lines: Sequence[int] = (),
    ) -> Checkpoint:
        """Write chunk ``cp.chunk``: its rejects (``(line, JSON line)``, put in file order), then its
        part carrying the new checkpoint ``new`` (the commit point). Returns ``new``, as committed
        (the :class:`~s3batch.sinks.Sink` interface; ``lines``, the source line of each output, is
        not needed here)."""
        self.write_rejects(cp.chunk, new, rejects)
        self._put(self._key(cp.chunk, "part"), self.part_body(output), new, self.part_content_type)
        return new

    def part_body(self, output: list[bytes]) -> bytes:
        """The bytes of a part holding ``output`` (JSON documents): one a line."""
        return b"\n".join(output) + b"\n" if output else b""

    def write_rejects(self, chunk: int, new: Checkpoint, rejects: list[tuple[int, bytes]]) -> None:
        """Write the rejects file of ``chunk`` (none without rejects), carrying the checkpoint ``new``."""
        if rejects:
            rejects.sort(key=lambda r: r[0])  # parser and handler rejects, in file order
            self._put(self._key(chunk, "rejects"), b"".join(line + b"\n" for _, line in rejects), new)

    def _put(self, key: str, body: bytes, cp: Checkpoint, content_type: str = "application/x-ndjson") -> None:
        raw = cp.model_dump_json()
        metadata = {CHECKPOINT_METADATA: raw, **self.marks}
        if self._secret is not None:
            metadata[CHECKPOINT_MAC_METADATA] = checkpoint_mac(self._secret, self.bucket, key, raw)
        stores = None if self._put_params or not raw.isascii() else data_stores(self.s3, key)
        if stores is not None:  # the same request, through obstore
            etag = stores.put(self.bucket, key, body, content_type, metadata)
        else:
            try:
                response = self.s3.put_object(
                    Bucket=self.bucket,
                    Key=key,
                    Body=body,
                    ContentType=content_type,
                    **self._put_params,
                    Metadata=metadata,
                )
            except (ClientError, BotoCoreError) as err:
                raise_s3_error(err, "writing", self.bucket, key)
            etag = response.get("ETag", "")
        self.known[key[len(self.dir) :]] = (strip_etag(etag), cp)

    def ours(self, name: str, chunk: int, kind: OutputKind, etag: str | None) -> Checkpoint | None:
        """The checkpoint of output ``name`` (listed with ``etag``) when it is this version's, else None.

        It is when its ETag is the one this attempt wrote or read it with, else when the checkpoint
        stored on it says so (one HEAD: parts written by an earlier attempt).
        """
        if etag is None:
            return None
        known = self.known.get(name)
        if known is not None and known[0] == etag:
            return known[1]
        found = self.committed(chunk, kind)
        return found if isinstance(found, Checkpoint) else None

    def stale(self, cp: Checkpoint, listed: dict[str, str], where: str) -> list[str]:
        """Check that the folder (``listed``: name -> ETag) holds the parts ``0..n-1`` of the final
        checkpoint ``cp`` and the rejects of the chunks that had rejects, all this version's; return
        the names of the other output objects in it (left by another version or options, or by an
        interrupted cleanup), to remove.

        Raises:
            AccountingError: A part or rejects object is missing or not this version's.
        """
        n = cp.chunk
        expected: set[str] = set()
        previous_rejected = 0
        problems: list[str] = []
        for chunk in range(n):
            name = self._name(chunk, "part")
            expected.add(name)
            part_cp = self.ours(name, chunk, "part", listed.get(name))
            if part_cp is None:
                problems.append(f"{name} is {'missing' if name not in listed else 'not of this version'}")
                continue
            if part_cp.rejected > previous_rejected:
                rejects = self._name(chunk, "rejects")
                expected.add(rejects)
                if self.ours(rejects, chunk, "rejects", listed.get(rejects)) is None:
                    problems.append(f"{rejects} is {'missing' if rejects not in listed else 'not of this version'}")
            previous_rejected = part_cp.rejected
        if problems:
            raise AccountingError(
                f"accounting error in the output of {where} under s3://{self.bucket}/{self.dir}: {'; '.join(problems)} "
                f"(expected parts 0-{n - 1} of this version{layout.split_words(self.split)}). The output was changed "
                "while the file was processed, or this is a bug in s3batch; process the file again (a redrive) and "
                "report it if it repeats."
            )
        removable = [name for name in listed if layout.removable(name, self.split, self.splits)]
        return sorted(name for name in removable if name not in expected)

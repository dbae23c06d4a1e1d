"""The checkpoint of a file: what it holds, and how it travels (heartbeat details, part metadata and its HMAC).

A file is processed chunk by chunk. Each chunk's output is one part object (``layout.part_key``),
written in one PUT that carries the checkpoint after the chunk in its user metadata
(:data:`CHECKPOINT_METADATA`, with its HMAC in :data:`CHECKPOINT_MAC_METADATA` when the workers have
a checkpoint secret); the chunk's rejects, if any, are written just before it, with the same
checkpoint. Only then is the checkpoint heartbeated (:class:`HeartbeatDetails`). A later attempt
resumes from the furthest of its heartbeat checkpoint and the last contiguous committed part; a part
is reused only when its checkpoint was written for the same source version and the same options
(:func:`fingerprint`). Committing and finding where to resume, on S3: :mod:`s3batch.file_output`.

The data types only, with no S3 client: the client reads checkpoints from heartbeat details
(``s3batch status``) and imports this module alone.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, ValidationError, model_serializer

from s3batch.fingerprints import fingerprint as fingerprint  # re-exported: where it was before

CHECKPOINT_METADATA = "s3batch-checkpoint"
"""User-metadata entry of every part object: the checkpoint committed with the part's data."""

CHECKPOINT_MAC_METADATA = "s3batch-checkpoint-mac"
"""User-metadata entry next to the checkpoint when the workers have a checkpoint secret: its HMAC."""

class Checkpoint(BaseModel):
    """Progress of one file: sent as heartbeat details and stored on every committed part.

    Positions and counters only, never record contents. Unknown fields are kept (``extra="allow"``):
    during a rolling upgrade workers of two versions read each other's checkpoints.
    """

    model_config = ConfigDict(extra="allow", frozen=False)

    next_record: int = 0
    """Records of this file fully processed and written."""
    byte_offset: int | None = 0
    """Where the next record starts in the raw object; None for compressed objects."""
    line: int = 1
    """Physical line number where the next record starts (for reject messages)."""
    chunk: int = 0
    """Index of the next chunk to write."""
    etag: str
    version_id: str | None = None
    fingerprint: str
    """Hash of the options that shape the output; parts written under other options are not reused."""
    records_written: int = 0
    rejected: int = 0
    dropped: int = 0
    """Records the handler dropped (a record handler returning None): neither written nor rejected."""
    done: bool = False
    """True on the checkpoint of the final part: the whole file is written."""
    reject_reasons: list[tuple[str, int]] = Field(default_factory=list)
    """The file's most common reject reasons so far, ``[reason, count]``, most common first (bounded:
    see ``s3batch.rejects``; never record contents)."""
    delimiter_hint: str | None = None
    """The delimiter a CSV file seems to use instead of ``,``, found in its first chunk (see
    ``s3batch.rejects.DelimiterProbe``)."""
    rows_fingerprint: str | None = None
    """A table's checkpoint (PostgreSQL sink): hash of the options that shape the rows, without ``chunk_records``
    (a table's checkpoint is a record and byte position, valid for any chunk size; see :class:`FileOutput`)."""
    source_column: str | None = None
    """A table's checkpoint: the column its rows carry their file's identity in (``on_reimport: replace``)."""
    empty_null: bool | None = None
    """A table's checkpoint: its file's unquoted empty CSV fields are written NULL (``empty_as``). None: not (or by
    a release before the option, which wrote them ''): a file resumed from such a checkpoint goes on writing ''."""

    @model_serializer(mode="wrap")
    def _omit_unused(self, handler: SerializerFunctionWrapHandler) -> Any:
        # A file without rejects or hint has the checkpoint of before they existed, byte for byte
        # (workers of two releases write the same part metadata during a rolling upgrade).
        data = handler(self)
        if isinstance(data, dict):
            for name in ("reject_reasons", "delimiter_hint", "rows_fingerprint", "source_column", "empty_null"):
                if not data.get(name, True):
                    del data[name]
        return data


class HeartbeatDetails(NamedTuple):
    """What a file activity heartbeats: its last checkpoint, and in a group the file's position.

    On the wire (``activity.heartbeat(*details)``): ``[checkpoint]`` for a file, ``[checkpoint, group_index,
    group_done]`` for the ``group_index``-th file of a group. The SDK hands the checkpoint back as a plain dict.
    """

    checkpoint: Any
    """The checkpoint as sent, or as handed back (a dict: see :meth:`read`); None: none yet."""
    group_index: int | None = None
    """Position of the file in its group (None: a single file)."""
    group_done: int | None = None
    """Bytes of the group's files finished, in any order (None: a single file, or an earlier version's)."""

    @classmethod
    def of(cls, details: Sequence[Any]) -> HeartbeatDetails:
        """The details of ``activity.info().heartbeat_details`` (empty on a first attempt)."""
        index = details[1] if len(details) >= 2 and isinstance(details[1], int) else None
        done = details[2] if len(details) >= 3 and isinstance(details[2], int) else None
        return cls(details[0] if details else None, index, done)

    def args(self) -> tuple[Any, ...]:
        """The arguments of ``activity.heartbeat``."""
        return self[: 1 if self.group_index is None else 2 if self.group_done is None else 3]

    def read(self) -> Checkpoint | None:
        """The checkpoint, validated; None when there is none or it is unreadable."""
        if self.checkpoint is None:
            return None
        try:
            return Checkpoint.model_validate(self.checkpoint)
        except ValidationError:
            return None


def checkpoint_mac(secret: bytes, bucket: str, key: str, checkpoint: str) -> str:
    """HMAC-SHA256 (hex) of the checkpoint metadata ``checkpoint`` stored on ``bucket/key``.

    The object's bucket and key are part of what is authenticated, so a valid checkpoint copied onto
    another file's part, another chunk or a rejects object does not verify there.
    """
    message = b"\0".join((b"s3batch checkpoint v1", bucket.encode(), key.encode(), checkpoint.encode()))
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def checkpoint_mac_ok(secret: bytes, bucket: str, key: str, checkpoint: str, mac: str | None) -> bool:
    """Whether ``mac`` is the HMAC of ``checkpoint`` on ``bucket/key`` (compared in constant time)."""
    return mac is not None and hmac.compare_digest(checkpoint_mac(secret, bucket, key, checkpoint), mac)

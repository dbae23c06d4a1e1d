"""The job option ``after_success``: what becomes of a source file once it has been processed, and what
the report says became of it. Pure (no I/O): the models and the workflow sandbox import it; the S3 side is
:mod:`s3batch.activities.after_success`, the workflow's step :mod:`s3batch.workflows.after_success`.

- ``{"action": "archive", "bucket": "archive", "prefix": "done/"}``: copy the file to
  ``{prefix}{its key relative to the job's prefix}`` (in ``bucket``; default: the source's), then delete it;
- ``{"action": "delete"}``: delete it;
- ``{"action": "tag", "tags": {"s3batch": "done"}}``: add these tags to it (its other tags are kept).

Applied per file, only to a file that succeeded, once its output is committed, and only to the version
that was processed (its listed ETag, and the version its first read pinned on a versioned bucket): a file
overwritten or deleted meanwhile is left as it is, and its report entry says why.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    StringConstraints,
    field_validator,
    model_serializer,
)
from pydantic_core import PydanticCustomError

from s3batch.fielddocs import Documented
from s3batch.validation import INPUT_ERROR

ArchiveBucket = Annotated[
    str, StringConstraints(min_length=3, max_length=63, pattern=r"^[a-z0-9][a-z0-9.\-]*[a-z0-9]$")
]


class Archive(Documented, BaseModel):
    """Copy the processed version under ``prefix`` (keeping the key's path below the job's prefix), then
    delete it from the source."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    action: Literal["archive"]
    bucket: ArchiveBucket | None = None
    """Where the copies go (None: the source's own bucket)."""
    prefix: str = Field(min_length=1)
    """Prefix of the copies: ``done/`` turns ``{job prefix}2026/a.csv`` into ``done/2026/a.csv``."""

    @field_validator("prefix")
    @classmethod
    def _plain_prefix(cls, value: str) -> str:
        segments = value.split("/")
        if any(seg in (".", "..") for seg in segments) or "//" in value or value.startswith("/"):
            raise PydanticCustomError(
                INPUT_ERROR,
                "must be a plain key prefix such as 'archive/': no '.' or '..' segments, no '//', no leading '/'",
            )
        return value


class Delete(Documented, BaseModel):
    """Delete the processed version (on a versioned bucket: that version, permanently; a newer one stays)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    action: Literal["delete"]


TagKey = Annotated[str, StringConstraints(min_length=1, max_length=128)]
TagValue = Annotated[str, StringConstraints(max_length=256)]


class Tag(Documented, BaseModel):
    """Add ``tags`` to the processed version (tags it already has under other keys are kept)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    action: Literal["tag"]
    tags: dict[TagKey, TagValue] = Field(min_length=1, max_length=10)
    """At most 10 (S3's limit per object, counting the tags it already has)."""


AfterSuccess = Annotated[Archive | Delete | Tag, Field(discriminator="action")]
"""The ``after_success`` option of a job."""

Done = Literal["archived", "deleted", "tagged", "skipped"]


class Outcome(Documented, BaseModel):
    """What ``after_success`` did to one file (its report entry's ``after_success``)."""

    model_config = ConfigDict(extra="allow")

    done: Done
    """``archived``, ``deleted``, ``tagged``, or ``skipped`` (left as it is: see ``reason``)."""
    reason: str | None = None
    """Why it was skipped (the source changed or was deleted meanwhile, S3 refused the action...)."""
    to: str | None = None
    """``s3://bucket/key`` of the archived copy."""

    @model_serializer(mode="wrap")
    def _omit_none(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        return {k: v for k, v in data.items() if v is not None} if isinstance(data, dict) else data


DONE: dict[str, Done] = {"archive": "archived", "delete": "deleted", "tag": "tagged"}
"""What each action reports once done."""

COPY_OF_METADATA = "s3batch-archived-from"
"""User metadata of an archived copy: ``{etag}`` or ``{etag} {version_id}`` of the version it copies (how a
retry knows the copy is done, whatever the copy's own ETag)."""


def relative_key(job_prefix: str, key: str) -> str:
    """``key`` below the job's prefix (the whole key when it does not start with it)."""
    return key[len(job_prefix) :] if key.startswith(job_prefix) else key


def archive_location(option: Archive, source_bucket: str, job_prefix: str, key: str) -> tuple[str, str]:
    """Bucket and key of the archived copy of ``key``."""
    return option.bucket or source_bucket, option.prefix + relative_key(job_prefix, key)


def archive_clash(option: Archive, bucket: str, prefix: str, output_bucket: str, output_prefix: str) -> str | None:
    """Why archiving into ``option`` would go wrong for a job listing ``bucket``/``prefix`` and writing under
    ``output_bucket``/``output_prefix`` (None: it would not). ``bucket`` "" (a manifest's objects): unknown."""
    target = option.bucket or bucket
    if target and target == bucket and option.prefix.startswith(prefix):
        return (
            f"after_success.prefix {option.prefix!r} lies under the source prefix {prefix!r} of bucket {bucket!r}: "
            "the archived files would be listed (and processed) again; choose a prefix outside it (e.g. 'archive/' "
            "beside 'incoming/') or another bucket"
        )
    if target == output_bucket and (option.prefix.startswith(output_prefix) or output_prefix.startswith(option.prefix)):
        return (
            f"after_success.prefix {option.prefix!r} overlaps the output prefix {output_prefix!r} of bucket "
            f"{output_bucket!r}: the copies would mix with the job's output; choose a prefix of its own"
        )
    return None


def count(totals: dict[str, int] | None, outcome: Outcome | None) -> dict[str, int] | None:
    """``totals`` (per ``done``) with ``outcome`` added (None: no outcome yet, and none to add)."""
    if outcome is None:
        return totals
    found = dict(totals or {})
    found[outcome.done] = found.get(outcome.done, 0) + 1
    return found

"""The worker's limits on what a job may make it do (docs/explanation/security.md): the buckets and prefixes it may read
and write (``S3BATCH_ALLOWED_SOURCES`` / ``S3BATCH_ALLOWED_OUTPUTS``), its ceilings on a job's chunk and
record sizes, and the server-side encryption it asks for on what it writes."""

from __future__ import annotations

import fnmatch
import functools
import re
from collections.abc import Callable
from typing import Any, Literal

from s3batch.config import Settings
from s3batch.errors import InvalidInput

_ALLOW_VARIABLES = {"sources": "S3BATCH_ALLOWED_SOURCES", "outputs": "S3BATCH_ALLOWED_OUTPUTS"}


def allowed(settings: Settings, kind: Literal["sources", "outputs"], bucket: str, prefix: str) -> bool:
    """Whether ``bucket/prefix`` matches one of the worker's globs for ``kind`` (any, without globs).

    A glob is matched against ``bucket/prefix`` as a whole (``fnmatch``, case-sensitive, ``*`` also
    matching ``/``). A glob ending with ``*`` that matches a prefix matches every key under it too,
    so a job's prefix is checked once; each file is checked again on its own key.
    """
    return allows(settings, kind)(bucket, prefix)


def allows(settings: Settings, kind: Literal["sources", "outputs"]) -> Callable[[str, str], bool]:
    """:func:`allowed` for many objects (a manifest's rows): the globs compiled once."""
    pattern = _globs(tuple(settings.allowed(kind)))
    if pattern is None:
        return lambda bucket, key: True
    return lambda bucket, key: pattern.match(f"{bucket}/{key}") is not None


@functools.lru_cache(maxsize=16)
def _globs(globs: tuple[str, ...]) -> re.Pattern[str] | None:
    # fnmatch.translate anchors each glob at the end (\Z), and match() anchors it at the start.
    return re.compile("|".join(f"(?:{fnmatch.translate(g)})" for g in globs)) if globs else None


def check_allowed(
    settings: Settings,
    kind: Literal["sources", "outputs"],
    bucket: str,
    prefix: str,
    *,
    also: Literal["sources", "outputs"] | None = None,
) -> None:
    """Raise a non-retryable ``InvalidInput`` unless ``bucket/prefix`` is allowed for ``kind`` (or ``also``)."""
    if allowed(settings, kind, bucket, prefix) or (also is not None and allowed(settings, also, bucket, prefix)):
        return
    raise not_allowed(settings, kind, f"s3://{bucket}/{prefix}", also=also)


def not_allowed(
    settings: Settings,
    kind: Literal["sources", "outputs"],
    where: str,
    *,
    also: Literal["sources", "outputs"] | None = None,
) -> InvalidInput:
    """The ``InvalidInput`` of :func:`check_allowed` for ``where``, which the worker may not use for ``kind``.

    ``where`` is the object's ``s3://`` name, or what names it where that name is no part of what the job
    was given (an object a manifest names: the refused bucket and key are not repeated into workflow
    history, errors or the report)."""
    variables = " or ".join(_ALLOW_VARIABLES[k] for k in (kind, also) if k)
    globs = ", ".join(settings.allowed(kind) + (settings.allowed(also) if also else []))
    what = "read from" if kind == "sources" else "write to"
    return InvalidInput(
        f"this worker may not {what} {where}: it is not matched by {variables} ({globs}). "
        "Use a bucket and prefix the worker allows, or ask its operator to add them."
    )


def check_ceilings(settings: Settings, chunk_records: int, max_record_bytes: int, what: str) -> None:
    """Raise a non-retryable ``InvalidInput`` when a job asks for more than the worker's ceilings."""
    for field, value, ceiling, variable in (
        ("chunk_records", chunk_records, settings.max_chunk_records, "S3BATCH_MAX_CHUNK_RECORDS"),
        ("max_record_bytes", max_record_bytes, settings.max_record_bytes, "S3BATCH_MAX_RECORD_BYTES"),
    ):
        if value > ceiling:
            raise InvalidInput(
                f"{what} asks for {field}={value}, over this worker's ceiling of {ceiling} ({variable}); "
                f"lower {field} in the job input to at most {ceiling}."
            )


def sse_params(settings: Settings) -> dict[str, Any]:
    """``put_object`` arguments asking for the worker's server-side encryption of outputs (or none)."""
    if not settings.output_sse:
        return {}
    params: dict[str, Any] = {"ServerSideEncryption": settings.output_sse}
    if settings.output_kms_key_id:
        params["SSEKMSKeyId"] = settings.output_kms_key_id
    return params

"""A job's plan, without starting it (``s3batch start --dry-run``): the files it would list, and what its
``after_success`` would do to each one that succeeds (see :mod:`s3batch.after_success`)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from s3batch.after_success import Archive, Tag, archive_location
from s3batch.config import Settings
from s3batch.messages import ListObjectsInput
from s3batch.models import S3BatchInput
from s3batch.s3io import make_client

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

PAGE = 1_000


@dataclass
class PlannedFile:
    """One file the job would process."""

    bucket: str
    key: str
    size: int
    then: str
    """What ``after_success`` would do to it once it succeeded (``""``: nothing, it stays)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def then(job: S3BatchInput, bucket: str, key: str) -> str:
    """What the job's ``after_success`` would do to ``bucket/key`` once it succeeded, in words."""
    option = job.after_success
    if isinstance(option, Archive):
        to_bucket, to_key = archive_location(option, bucket, job.prefix, key)
        return f"archive to s3://{to_bucket}/{to_key}"
    if isinstance(option, Tag):
        return "tag " + ", ".join(f"{k}={v}" for k, v in option.tags.items())
    return "" if option is None else "delete"


def caveat(job: S3BatchInput) -> str | None:
    """Why the job may process fewer files than its plan lists (None: it lists exactly these)."""
    if job.incremental is not None:
        return "an incremental job takes only the files its ledger does not know in their current version"
    if job.only_failed_of or job.rejected_of:
        return "a redrive takes only the files of the report it redrives"
    return None


def planned_files(job: S3BatchInput, s3: S3Client | None = None) -> Iterator[PlannedFile]:
    """The files ``job`` would list (its prefix and filters, or its manifest), page by page, as its workers list
    them."""
    from s3batch.activities.listing import list_page
    from s3batch.activities.manifest_rows import ManifestPositions
    from s3batch.activities.manifests import list_manifest_page

    s3 = s3 or make_client()
    selection = job.selection() if job.selection().active else None
    req = ListObjectsInput(
        bucket=job.bucket, prefix=job.prefix, page_size=PAGE, manifest=job.manifest, selection=selection
    )
    positions = ManifestPositions()
    # S3BATCH_ALLOWED_SOURCES, when set here as on the workers: a manifest naming what they may not read is
    # refused by the plan as by the job.
    settings = Settings()
    while True:
        if job.manifest:
            page = list_manifest_page(s3, req, positions, settings)
        else:
            page = list_page(s3, job.bucket, job.prefix, PAGE, req.continuation_token, selection)
        for obj in page.objects:
            bucket = obj.bucket or job.bucket
            yield PlannedFile(bucket, obj.key, obj.size, then(job, bucket, obj.key))
        if page.next_token is None:
            return
        req.continuation_token = page.next_token


async def plan(job: S3BatchInput) -> list[PlannedFile]:
    """:func:`planned_files`, all of them (read off the event loop)."""
    return await asyncio.to_thread(lambda: list(planned_files(job)))

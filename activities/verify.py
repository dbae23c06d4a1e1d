"""The check of a file's output once it is done: exactly its parts and rejects, all of this version."""

from __future__ import annotations

from typing import TYPE_CHECKING

from temporalio import activity

from s3batch import layout
from s3batch.s3io import delete_keys, list_folder

if TYPE_CHECKING:
    from s3batch.activities.file_job import FileJob

    from s3batch.messages import FileResult


def verify_output(job: FileJob, result: FileResult, listed: dict[str, str] | None = None) -> FileResult:
    """Check that the file's output folder holds exactly its parts ``0..n-1`` and the rejects of
    the chunks that had rejects, all of this source version and these options; remove anything
    else (left by another version or options, or by an interrupted cleanup).

    ``listed`` is the folder's listing (name -> ETag) from the group's LIST; without it, or when
    something seems missing from it, the folder is listed on its own. A missing or foreign part
    or rejects object is an ``AccountingError`` (see ``FileOutput.stale``).
    """
    cp = job.checkpoint
    if result.status != "succeeded" or cp is None:
        return result
    split = None if job.split is None else job.split.index
    if listed is not None and not all(layout.part_name(c, split=split) in listed for c in range(cp.chunk)):
        listed = None  # the group's LIST did not cover this folder (another key order)
    if listed is None:
        listed = list_folder(job.s3, job.req.output_bucket, job.dir)
    stale = job.output.stale(cp, listed, job.where)
    if stale:
        job.confirm_source()
        delete_keys(job.s3, job.req.output_bucket, [job.dir + name for name in stale])
        activity.logger.info(
            "removed %d output objects of %s that were not of this version (e.g. %s)",
            len(stale),
            job.where,
            stale[0],
            extra=job.log_extra,
        )
    return result

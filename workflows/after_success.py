"""The workflow's side of ``after_success`` (see :mod:`s3batch.after_success`): once a file activity (one file,
a group of small files, or a big file's splits) has ended and its results say which files succeeded, one
activity archives, deletes or tags those files, and each result gets what became of its file. Used by the
workflow's control flow (:mod:`~s3batch.workflows.batch`) before it records the results, so a file is in
flight until its action is done and the report says what was done.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from s3batch.activities.s3_activities import S3Activities
    from s3batch.workflows.patches import AFTER_SUCCESS
    from s3batch.workflows.schedule import SHORT_RETRY

    from s3batch.after_success import Outcome
    from s3batch.errors import describe_failure
    from s3batch.messages import AfterSuccessInput, FileResult, ObjectRef
    from s3batch.models import S3BatchInput

TIMEOUT = timedelta(hours=1)
"""Start-to-close timeout of one ``after_success`` activity (archiving big files copies them on the S3 server)."""


async def after_success(spec: S3BatchInput, group: list[ObjectRef], results: list[FileResult]) -> list[FileResult]:
    """``results`` (of the files of ``group``), each succeeded one with what the job's ``after_success`` did to
    its file. No command for a job without the option, or when no file succeeded."""
    option = spec.after_success
    succeeded = [r for r in results if r.status == "succeeded"]
    if option is None or not succeeded or not workflow.patched(AFTER_SUCCESS):
        return results
    listed = {obj.key: obj for obj in group}
    pinned = [(listed[r.key], r.version_id) for r in succeeded if r.key in listed]
    files = [obj.model_copy(update={"version_id": version or obj.version_id}) for obj, version in pinned]
    if not files:
        return results  # a result for a file not in the group: the books say so
    summary = f"{option.action} {files[0].key}" + (f" and {len(files) - 1} more" if len(files) > 1 else "")
    handle = workflow.start_activity_method(
        S3Activities.after_success,
        AfterSuccessInput(bucket=spec.bucket, prefix=spec.prefix, action=option, files=files),
        start_to_close_timeout=TIMEOUT,
        heartbeat_timeout=timedelta(seconds=spec.heartbeat_timeout_seconds),
        retry_policy=SHORT_RETRY,
        summary=summary,
    )
    try:
        outcomes: list[Any] = await _to_its_end(handle)
    except ActivityError as err:
        # What its attempts did before they failed for good is not known file by file: each file says so.
        reason = f"{option.action} did not complete: {describe_failure(err)}"
        outcomes = [Outcome(done="skipped", reason=reason)] * len(files)
    found = {obj.key: Outcome.model_validate(o) for obj, o in zip(files, outcomes, strict=True)}
    return [r.model_copy(update={"after_success": found[r.key]}) if r.key in found else r for r in results]


async def _to_its_end(handle: workflow.ActivityHandle[Any]) -> Any:
    """The activity's result, never cancelling it: a cancel of the job (or a hand-over) arriving meanwhile
    waits for the action to end, so the report says what it did."""
    while True:
        try:
            return await asyncio.shield(handle)
        except asyncio.CancelledError:
            if handle.done():
                return handle.result()

"""Processing files: one file, or a group of small files a few at once, and what each returns when
the job is cancelled meanwhile."""

from __future__ import annotations

import asyncio
import contextvars
import os
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError
from s3batch.activities.boundary import unexpected
from s3batch.activities.file_job import FileJob
from s3batch.activities.lease import Lease
from temporalio import activity
from temporalio.exceptions import CancelledError

from s3batch import layout
from s3batch.checkpoint import Checkpoint, HeartbeatDetails
from s3batch.config import Settings
from s3batch.errors import S3BatchError
from s3batch.limits import check_allowed
from s3batch.messages import FileResult, ProcessFileInput, ProcessGroupInput
from s3batch.s3io import any_object, raise_s3_error, strip_etag

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

    from s3batch.sinks.postgres_pools import PostgresPools


def process_file(
    s3: S3Client, settings: Settings, req: ProcessFileInput, pools: PostgresPools | None = None
) -> FileResult:
    """Process one object chunk by chunk, resuming from the furthest committed checkpoint (the
    ``s3batch.process_file`` activity)."""
    info = activity.info()
    job: FileJob | None = None
    try:
        job = FileJob(s3, settings, req, HeartbeatDetails.of(info.heartbeat_details).checkpoint, pools=pools)
        return job.verify(job.run())
    except (CancelledError, asyncio.CancelledError):
        if not _job_cancelled():
            raise  # worker shutdown, heartbeat timeout, activity paused or reset: Temporal retries
        # The job was cancelled: the file's result says how far it got (the workflow records it).
        cp = job.checkpoint if job is not None else None
        if job is not None and cp is not None and cp.done:
            return job.verify(job.result(cp))
        return _cancelled(req, cp, info.attempt)
    except S3BatchError:
        raise
    except Exception as err:  # noqa: BLE001 - its text may quote record contents
        raise unexpected(err, f"s3://{req.bucket}/{req.obj.key}") from None


def process_group(
    s3: S3Client, settings: Settings, req: ProcessGroupInput, pools: PostgresPools | None = None
) -> list[FileResult]:
    """Process small objects, up to ``GROUP_THREADS`` at once (the ``s3batch.process_group`` activity).

    A file that fails for good (changed, missing, bad format) is reported failed without failing the
    group; a transient error stops the group's other files at their next chunk boundary and fails the
    attempt, and the retry skips the files already done (their final parts are committed). The group's
    output is checked with one LIST at the end (see ``FileJob.verify``). When the job is cancelled
    meanwhile, every file in flight stops at its next chunk boundary and the group returns instead of
    raising: the files it finished as ``succeeded``, the others as ``cancelled`` (with their
    checkpoint's counts, where they have one).
    """
    info = activity.info()
    details = info.heartbeat_details
    beat = HeartbeatDetails.of(details)
    items = req.items()
    run = _GroupRun(s3, settings, items, beat, pools)
    try:
        # One LIST for the whole group: on a first run nothing exists under the files' common
        # output prefix, and no file needs to look for committed parts of its own.
        check_allowed(settings, "outputs", req.file.output_bucket, req.file.output_prefix)
        common = os.path.commonprefix([layout.file_dir(i.output_prefix, i.obj.key) for i in items])  # noqa: RUF071 - S3 prefixes are strings
        run.fresh = not details and not any_object(s3, req.file.output_bucket, common)
        run.run_all()
        return _verify_group(s3, items, run.jobs, run.results, info.attempt)
    except (CancelledError, asyncio.CancelledError):
        if not _job_cancelled():
            raise  # worker shutdown, heartbeat timeout, activity paused or reset: Temporal retries
        return _cancelled_group(s3, items, run.jobs, run.results, info.attempt, beat)
    except S3BatchError:
        raise
    except Exception as err:  # noqa: BLE001 - its text may quote record contents
        where = f"a group of {len(items)} files from s3://{req.file.bucket}/{req.file.obj.key}"
        raise unexpected(err, where) from None


GROUP_THREADS = 4
"""Files of one group processed at once, each on a thread of its own. A small file's time is mostly
S3 latency (a GET and a PUT, the GIL released meanwhile), so a group of 100 files ends in about a
quarter of the time it took one after the other. Bounded for the whole process by the S3 client's
connection pool (``_connections``)."""


class _Stopped(Exception):
    """Raised in a file of a group at a chunk boundary once the group stops (cancelled, or another
    file's transient error)."""


def _stopping(stop: threading.Event) -> bool:
    """The group is stopping: another file's error, or the activity is cancelled (seen by every file at
    its next chunk boundary: the SDK raises its cancellation into the activity's own thread only)."""
    return stop.is_set() or activity.is_cancelled()


class _GroupFile(FileJob):
    """A file of a group, run on one of the group's threads: besides a worker shutdown, it stops at
    its next chunk boundary (after its last checkpoint) once its group is stopping."""

    def __init__(
        self, *args: Any, stop: threading.Event, done: Callable[[], int], **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self._group_stop = stop
        self._group_done = done

    def _stop_if_asked(self) -> None:
        super()._stop_if_asked()
        if _stopping(self._group_stop):
            self.behind.settle()  # the last chunk's part, if written behind, is committed first
            raise _Stopped

    def _details(self) -> HeartbeatDetails:
        return HeartbeatDetails(self.checkpoint, self._index, self._group_done())

    def _beat(self, *, force: bool = False) -> None:
        """The group's files share one heartbeat pace (their lease: when any of them last beat), and a file's
        final checkpoint is not forced out: a retry finds a finished file by its committed parts, not by the
        heartbeat (which names one file of the group). A small file then costs no heartbeat of its own; the
        group's progress still reaches the server at least every ``BEAT_INTERVAL``, and a checkpoint within a
        file at each of its chunks."""
        super()._beat(force=force and self.checkpoint is not None and not self.checkpoint.done)


class _GroupRun:
    """The files of one group attempt, run on up to ``GROUP_THREADS`` threads; ``results[i]`` and
    ``jobs[i]`` are file ``i``'s (None where it did not finish, or did not start)."""

    def __init__(
        self,
        s3: S3Client,
        settings: Settings,
        items: list[ProcessFileInput],
        beat: HeartbeatDetails,
        pools: PostgresPools | None,
    ) -> None:
        self.s3, self.settings, self.items, self.beat, self.pools = s3, settings, items, beat, pools
        self.fresh = False
        self.attempt = activity.info().attempt
        self.results: list[FileResult | None] = [None] * len(items)
        self.jobs: list[FileJob | None] = [None] * len(items)
        self.stop = threading.Event()
        self.error: BaseException | None = None
        """The first transient or unexpected error of a file: raised once every file has stopped."""
        self._left = len(items)
        self.done_bytes = 0
        """Source bytes of the files finished (``HeartbeatDetails.group_done``: ``s3batch watch``'s progress)."""
        self._lock = threading.Lock()
        self._all_done = threading.Event()
        self.lease = Lease.of(activity.info())
        """The group's lease: its files heartbeat for the one activity (:mod:`~s3batch.activities.lease`)."""

    def run_all(self) -> None:
        """Run every file; returns once each has finished or stopped. The SDK's cancellation is held
        back meanwhile (it is raised into this thread only, and must not land in a thread pool's
        start or wait): a cancel is seen here, stops the files at their next chunk boundary, and is
        raised when this returns."""
        if not self.items:
            return
        with activity.shield_thread_cancel_exception():
            threads = min(GROUP_THREADS, len(self.items))
            with ThreadPoolExecutor(threads, thread_name_prefix="s3batch-group") as pool:
                for index in range(len(self.items)):
                    # Each file gets its own copy of the activity's context (info, heartbeat, logger).
                    pool.submit(contextvars.copy_context().run, self._one, index)
                while not self._all_done.wait(_CANCEL_POLL):
                    if activity.is_cancelled():
                        self.stop.set()
        # The SDK's cancellation, held back, was raised as the shield ended.
        if self.error is not None:
            raise self.error
        if self.stop.is_set():  # cancelled, and the SDK raised nothing (it raises only into a sync activity)
            raise CancelledError("activity cancelled")

    def _one(self, index: int) -> None:
        connections = _connections(self.s3)
        try:
            while not _stopping(self.stop):
                if connections.acquire(timeout=_CANCEL_POLL):
                    try:
                        self._file(index)
                    finally:
                        connections.release()
                    break
        finally:
            with self._lock:
                self._left -= 1
                if not self._left:
                    self._all_done.set()

    def _file(self, index: int) -> None:
        item = self.items[index]
        hint = self.beat.checkpoint if index == self.beat.group_index else None
        try:
            self.jobs[index] = job = _GroupFile(
                self.s3, self.settings, item, hint, index, fresh=self.fresh, pools=self.pools, stop=self.stop,
                done=lambda: self.done_bytes, lease=self.lease,
            )
            self.results[index] = job.run()
            with self._lock:
                self.done_bytes += item.obj.size
        except _Stopped:
            pass
        except S3BatchError as err:
            if err.retryable:
                self._fail(err)
            else:
                self.results[index] = _failed(item, err, self.attempt)
        except BaseException as err:  # noqa: BLE001 - raised by run_all, in the activity's thread
            self._fail(err)

    def _fail(self, err: BaseException) -> None:
        with self._lock:
            if self.error is None:
                self.error = err
        self.stop.set()


_CANCEL_POLL = 0.05
"""Seconds between two looks at the activity's cancellation while a group's files run."""

_POOLS: weakref.WeakKeyDictionary[Any, threading.BoundedSemaphore] = weakref.WeakKeyDictionary()
_POOLS_LOCK = threading.Lock()


def _connections(s3: S3Client) -> threading.BoundedSemaphore:
    """The files of every group of this process that may run at once on ``s3``: one per connection of its
    pool, so that concurrent groups never open connections the pool would drop."""
    with _POOLS_LOCK:
        found = _POOLS.get(s3)
        if found is None:
            size = getattr(s3.meta.config, "max_pool_connections", None) or 10
            found = _POOLS[s3] = threading.BoundedSemaphore(size)
        return found


def _verify_group(
    s3: S3Client,
    items: list[ProcessFileInput],
    jobs: list[FileJob | None],
    results: list[FileResult | None],
    attempt: int,
) -> list[FileResult]:
    """Check the output of the group's succeeded files with one LIST (see ``FileJob.verify``)."""
    done = [job.dir for job, r in zip(jobs, results, strict=True) if job and r and r.status == "succeeded"]
    listings = _list_group_outputs(s3, items[0].output_bucket, done)
    final: list[FileResult] = []
    for index, result in enumerate(results):
        assert result is not None
        job = jobs[index]
        if job is not None:
            try:
                result = job.verify(result, listings.get(job.dir))
            except S3BatchError as err:
                if err.retryable:
                    raise
                result = _failed(items[index], err, attempt)
        final.append(result)
    return final


def _cancelled_group(
    s3: S3Client,
    items: list[ProcessFileInput],
    jobs: list[FileJob | None],
    results: list[FileResult | None],
    attempt: int,
    beat: HeartbeatDetails,
) -> list[FileResult]:
    """The group's results when the job is cancelled: the files it finished (checked like any
    group), and the others ``cancelled`` with the counts of their last checkpoint."""
    for index, item in enumerate(items):
        if results[index] is not None:
            continue
        job = jobs[index]
        cp = job.checkpoint if job is not None else None
        if cp is None and index == beat.group_index:
            cp = beat.read()
        if job is not None and cp is not None and cp.done:
            # The cancellation arrived just after the file's final part was committed.
            results[index] = job.result(cp)
        else:
            results[index] = _cancelled(item, cp, attempt)
    activity.logger.info(
        "job cancelled: group of %d files stops (%d finished)",
        len(items),
        sum(1 for r in results if r is not None and r.status != "cancelled"),
    )
    # The cancellation has been delivered; nothing more is raised into this thread.
    return _verify_group(s3, items, jobs, results, attempt)


def _list_group_outputs(s3: S3Client, bucket: str, folders: list[str]) -> dict[str, dict[str, str]]:
    """The objects directly in each of ``folders`` (the output folders of a group's files), as
    ``{folder: {name: etag}}``, with one paginated LIST over the key range they span.

    The range starts after the first folder and ends after the last one in S3's key order (UTF-8
    bytes, which is Python's ``str`` order). A server that lists in another order (SeaweedFS lists
    by path segment) may leave folders out; ``FileJob.verify`` lists such a folder again on its own
    before it reports anything missing.
    """
    found: dict[str, dict[str, str]] = {f: {} for f in folders}
    if not folders:
        return found
    low, high = min(folders), max(folders)
    outer = min((f for f in folders if high.startswith(f)), key=len)  # the folders enclosing the last
    common = os.path.commonprefix(folders)  # noqa: RUF071 - S3 prefixes are strings
    kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": common}
    if low != common:
        kwargs["StartAfter"] = low  # a folder is not an object: its keys all sort after it
    try:
        for page in s3.get_paginator("list_objects_v2").paginate(**kwargs):
            for item in page.get("Contents", []):
                key = item["Key"]
                if key > high and not key.startswith(outer):
                    return found  # past the last folder
                slash = key.rfind("/") + 1
                names = found.get(key[:slash])
                if names is not None:
                    names[key[slash:]] = strip_etag(item["ETag"])
    except (ClientError, BotoCoreError) as err:
        raise_s3_error(err, "listing output under", bucket, common)
    return found


def _job_cancelled() -> bool:
    """The activity is being cancelled because the job was (not a worker shutdown, a timeout, ...)."""
    details = activity.cancellation_details()
    if details is None:
        return False
    other = details.worker_shutdown or details.timed_out or details.paused or details.reset or details.not_found
    return details.cancel_requested and not other


def _failed(item: ProcessFileInput, err: S3BatchError, attempt: int) -> FileResult:
    return FileResult(
        key=item.obj.key,
        etag=item.obj.etag,
        status="failed",
        attempts=attempt,
        error=f"{err.type}: {err.message}",
        **err.file_counts(),
    )


def _cancelled(item: ProcessFileInput, cp: Checkpoint | None, attempt: int) -> FileResult:
    """A file of a cancelled group that had not finished, with the counts of its last checkpoint."""
    cp = cp if cp is not None and cp.etag == item.obj.etag else None
    return FileResult(
        key=item.obj.key,
        etag=item.obj.etag,
        status="cancelled",
        records=cp.next_record if cp else 0,
        records_written=cp.records_written if cp else 0,
        rejected=cp.rejected if cp else 0,
        dropped=cp.dropped if cp else 0,
        chunks=cp.chunk if cp else 0,
        attempts=attempt,
        error="job cancelled: stopped at a chunk boundary after its last checkpoint",
    )

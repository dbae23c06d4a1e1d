"""Listing the files of a job: a page of a prefix, or a page of the files a redrive takes from a report."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from s3batch.limits import allows, not_allowed
from s3batch.messages import ListObjectsInput, ListObjectsResult, ObjectRef
from s3batch.report import redrive_plan
from s3batch.report_store import fetch_report
from s3batch.s3io import is_missing_object, raise_s3_error, strip_etag
from s3batch.selection import KeyFilter

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

    from s3batch.config import Settings


def list_page(
    s3: S3Client,
    bucket: str,
    prefix: str,
    page_size: int,
    continuation_token: str | None,
    selection: KeyFilter | None = None,
) -> ListObjectsResult:
    """One page of ListObjectsV2 under ``prefix``. Folder markers (``key/`` of size 0) are skipped, and
    so are the objects the job's filters leave out (``selection``; a page may then be empty)."""
    kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix, "MaxKeys": page_size}
    if continuation_token:
        kwargs["ContinuationToken"] = continuation_token
    try:
        response = s3.list_objects_v2(**kwargs)
    except (ClientError, BotoCoreError) as err:
        raise_s3_error(err, "listing", bucket, prefix or None)
    objects = [
        ObjectRef(key=item["Key"], etag=strip_etag(item["ETag"]), size=item["Size"])
        for item in response.get("Contents", [])
        if not (item["Key"].endswith("/") and item["Size"] == 0)
        and (selection is None or selection.takes(item["Key"], item.get("LastModified")))
    ]
    token = response.get("NextContinuationToken") if response.get("IsTruncated") else None
    return ListObjectsResult(objects=objects, next_token=token)


RedrivePlan = tuple[list[str], str | None]
"""The keys a redrive processes again and where the rest of its report's listing starts (``redrive_plan``)."""


class RedrivePlans:
    """The redrive plans of the reports a worker lists from, kept by report version (ETag).

    A redrive lists its files a page at a time from one report; each page reading and parsing the
    whole report made a redrive quadratic (a million-file report is about 190 MB and seconds of
    parsing, for each of its pages). The report is read once per worker process and version: a page
    costs one HEAD of the report, to see it is still the version the plan was made from.
    """

    def __init__(self, keep: int = 4) -> None:
        self._plans: OrderedDict[tuple[str, str, str, str, bool], RedrivePlan] = OrderedDict()
        self._keep = keep
        self._lock = threading.Lock()  # activities run in a thread pool

    def plan(self, s3: S3Client, bucket: str, key: str, prefix: str, *, rejected: bool = False) -> RedrivePlan:
        """The plan of the report at ``s3://bucket/key`` for a job listing ``prefix`` (``rejected``: its files with
        rejected records, for a redrive of them)."""
        action = "reading the job report to redrive"
        try:
            etag = s3.head_object(Bucket=bucket, Key=key)["ETag"]
        except (ClientError, BotoCoreError) as err:
            raise_s3_error(err, action, bucket, key)
        with self._lock:
            found = self._plans.get((bucket, key, etag, prefix, rejected))
            if found is not None:
                self._plans.move_to_end((bucket, key, etag, prefix, rejected))
                return found
        report, etag = fetch_report(s3, bucket, key, action=action)
        plan = redrive_plan(report, prefix, rejected=rejected)
        with self._lock:
            self._plans[(bucket, key, etag, prefix, rejected)] = plan
            while len(self._plans) > self._keep:
                self._plans.popitem(last=False)
        return plan


def list_redrive_page(s3: S3Client, req: ListObjectsInput, plan: RedrivePlan, settings: Settings) -> ListObjectsResult:
    """A page of the files to redrive from an earlier job's report, pinned to their current version:
    those that failed, were cancelled or never started, then, when that job was cancelled before
    its listing ended, the rest of its listing (from where it stopped); of a redrive of rejected records,
    its files with rejects (a file changed since is refused by its activity, which reads the rejects).

    Continuation tokens: ``"<n>"`` is the n-th file of the report to redrive, ``"s3:<token>"`` a
    position in the rest of the listing (``"s3:"`` its start).

    Each key the report names is checked against the worker's allowed sources (``settings``) before it is
    looked up: the report lies in an output, which others may be able to write.
    """
    keys, rest = plan
    token = req.continuation_token or "0"
    if token.startswith("s3:"):
        page = list_page(s3, req.bucket, req.prefix, req.page_size, token[3:] or None, req.selection)
        return page.model_copy(update={"next_token": None if page.next_token is None else f"s3:{page.next_token}"})
    start = int(token)
    objects = []
    allowed = allows(settings, "sources")
    for key in keys[start : start + req.page_size]:
        if not allowed(req.bucket, key):
            raise not_allowed(settings, "sources", f"s3://{req.bucket}/{key}")
        try:
            head = s3.head_object(Bucket=req.bucket, Key=key)
            objects.append(ObjectRef(key=key, etag=strip_etag(head["ETag"]), size=head["ContentLength"]))
        except ClientError as err:
            if not is_missing_object(err):
                raise_s3_error(err, "reading", req.bucket, key)
            # Gone since: the file activity reports it as NotFound, like any deleted source.
            objects.append(ObjectRef(key=key, etag="deleted", size=0))
    end = start + req.page_size
    if end < len(keys):
        next_token: str | None = str(end)
    else:
        next_token = None if rest is None else f"s3:{rest}"
    return ListObjectsResult(objects=objects, next_token=next_token)

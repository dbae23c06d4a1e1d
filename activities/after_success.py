"""The S3 side of ``after_success`` (see :mod:`s3batch.after_success`): archive, delete or tag each file that
succeeded, exactly the version that was processed, and say what became of it.

Each file is first looked at (one HEAD of its current version): the action goes ahead only when that is the
version processed (its listed ETag, and the VersionId its reads were pinned to on a versioned bucket); a file
overwritten or deleted since is left as it is and reported ``skipped`` with the reason. Every write is then
conditional on that version too:

- archive: ``CopyObject`` of that version (``CopySource`` with its VersionId, ``CopySourceIfMatch`` its ETag),
  the copy marked with the version it copies (user metadata :data:`~s3batch.after_success.COPY_OF_METADATA`),
  then ``DeleteObject`` of that version (versioned: its VersionId; else ``IfMatch`` its ETag, where the
  store honours it);
- delete: ``DeleteObject`` as above;
- tag: ``GetObjectTagging`` and ``PutObjectTagging`` of that version (its other tags kept); on an unversioned
  bucket S3 has no conditional tagging: the version is looked at again after the tags were set.

Idempotent: a retry (a worker killed between the copy and the delete) finds the copy by its marker, never
copies twice, and deletes; an attempt after the first that finds the processed version gone and its copy in
place reports it archived (deleted: gone), as the earlier attempt left it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from botocore.exceptions import BotoCoreError, ClientError
from temporalio import activity

from s3batch.after_success import COPY_OF_METADATA, Archive, Delete, Outcome, archive_location
from s3batch.config import Settings
from s3batch.errors import S3BatchError
from s3batch.limits import check_allowed, sse_params
from s3batch.messages import AfterSuccessInput, ObjectRef
from s3batch.s3io import error_code, raise_s3_error, strip_etag

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import CopySourceTypeDef

COPY_OBJECT_LIMIT = 5 * 1024**3
"""The largest object one ``CopyObject`` copies (S3's limit); bigger ones are copied in parts."""

_KEPT_HEADERS = ("CacheControl", "ContentDisposition", "ContentEncoding", "ContentLanguage", "ContentType", "Expires")
"""What an archived copy keeps of its source besides its user metadata (the copy replaces the metadata, to
add its marker)."""

_MISSING = {"NoSuchKey", "NoSuchVersion", "404", "NotFound"}
_CHANGED = {"PreconditionFailed", "412"}
MAX_TAGS = 10
"""S3's limit of tags on one object."""


def act(s3: S3Client, settings: Settings, req: AfterSuccessInput) -> list[Outcome]:
    """Apply ``req.action`` to each of ``req.files``, one after the other; one outcome each.

    Raises:
        S3BatchError: A retryable S3 error (throttling, 5xx, the network): the attempt is retried, and the
            retry finds what this one did. Errors retrying cannot fix (denied, refused) end as ``skipped``.
    """
    attempt = activity.info().attempt
    outcomes: list[Outcome] = []
    for obj in req.files:
        bucket = obj.bucket or req.bucket
        activity.heartbeat(len(outcomes))
        try:
            check_allowed(settings, "sources", bucket, obj.key)
            outcomes.append(_one(s3, settings, req, bucket, obj, attempt))
        except S3BatchError as err:
            if err.retryable:
                raise
            outcomes.append(Outcome(done="skipped", reason=f"{req.action.action} failed: {err}"))
    return outcomes


class _Version(NamedTuple):
    """The version of a file that was processed."""

    bucket: str
    key: str
    etag: str
    version_id: str | None
    """None on an unversioned bucket."""

    @property
    def marker(self) -> str:
        """What an archived copy of it carries (:data:`~s3batch.after_success.COPY_OF_METADATA`)."""
        return self.etag if self.version_id is None else f"{self.etag} {self.version_id}"


def _one(
    s3: S3Client, settings: Settings, req: AfterSuccessInput, bucket: str, obj: ObjectRef, attempt: int
) -> Outcome:
    action = req.action
    head = _head(s3, bucket, obj.key)
    done = _Version(bucket, obj.key, obj.etag, obj.version_id or _version_of(head))
    # Still the version processed: its listed ETag, and the version its reads were pinned to.
    same = head is not None and (strip_etag(head["ETag"]), _version_of(head)) == (done.etag, done.version_id)
    current = head if same else None
    if isinstance(action, Archive):
        to = archive_location(action, bucket, req.prefix, obj.key)
        check_allowed(settings, "outputs", *to)
        if to == (bucket, obj.key):
            return Outcome(done="skipped", reason="the archived copy would be the file itself: left in place")
        return _archive(s3, settings, done, to, (head, current), retrying=attempt > 1)
    if current is None:
        # An earlier attempt may have deleted it, its result lost: then the version processed is gone.
        gone = head is None or (done.version_id is not None and _head(s3, bucket, obj.key, done.version_id) is None)
        deleted = isinstance(action, Delete) and attempt > 1 and gone
        return Outcome(done="deleted") if deleted else _changed(head, done)
    if isinstance(action, Delete):
        return Outcome(done="deleted") if _delete(s3, done) else _changed(None, done)
    return _tag(s3, done, dict(action.tags))


def _archive(
    s3: S3Client,
    settings: Settings,
    done: _Version,
    to: tuple[str, str],
    heads: tuple[dict[str, Any] | None, dict[str, Any] | None],
    *,
    retrying: bool,
) -> Outcome:
    """Copy (unless a copy of ``done`` is there already), then delete. ``heads``: the source's HEAD (None: gone),
    and the same when it is still the version processed (else None)."""
    head, current = heads
    uri = f"s3://{to[0]}/{to[1]}"
    copied = _copy_of(s3, *to) == done.marker
    if current is None:
        # Gone or changed: archived by an earlier attempt (the copy is there), or changed before any was made.
        archived = retrying and copied
        return Outcome(done="archived", to=uri) if archived else _changed(head, done)
    if not copied and not _copy(s3, settings, done, to, current):
        return _changed(None, done)
    if not _delete(s3, done):
        return Outcome(
            done="skipped",
            reason=f"s3://{done.bucket}/{done.key} changed between its copy and its delete: the new version is "
            f"left in place (the copy of the version processed is at {uri})",
        )
    return Outcome(done="archived", to=uri)


def _changed(head: dict[str, Any] | None, done: _Version) -> Outcome:
    """A file that is no longer the version processed (``head``: its current one; None: gone), left as it is."""
    where = f"s3://{done.bucket}/{done.key}"
    if head is None:
        return Outcome(done="skipped", reason=f"{where} changed or was deleted after it was processed: left as it is")
    version = _version_of(head)
    now = f"ETag {strip_etag(head['ETag'])}" + (f", version {version}" if version else "")
    return Outcome(
        done="skipped", reason=f"{where} changed after it was processed (now {now}): the new version is left in place"
    )


def _version_of(head: dict[str, Any] | None) -> str | None:
    """The VersionId of a HEAD's answer (None: unversioned, or versioning suspended: ``null``)."""
    version = head.get("VersionId") if head else None
    return None if version in (None, "", "null") else str(version)


def _head(s3: S3Client, bucket: str, key: str, version: str | None = None) -> dict[str, Any] | None:
    """The HEAD of the object's current version (or of ``version``); None when there is none."""
    kwargs: dict[str, Any] = {"Bucket": bucket, "Key": key}
    if version is not None:
        kwargs["VersionId"] = version
    try:
        return dict(s3.head_object(**kwargs))
    except ClientError as err:
        if error_code(err) in _MISSING:
            return None  # gone (or a delete marker on top)
        raise_s3_error(err, "looking at", bucket, key)
    except BotoCoreError as err:
        raise_s3_error(err, "looking at", bucket, key)


def _copy_of(s3: S3Client, bucket: str, key: str) -> str | None:
    """The version an archived copy at ``bucket/key`` copies (its marker), None when there is none."""
    head = _head(s3, bucket, key)
    return None if head is None else head.get("Metadata", {}).get(COPY_OF_METADATA)


def _copy(s3: S3Client, settings: Settings, done: _Version, to: tuple[str, str], head: dict[str, Any]) -> bool:
    """Copy the version ``done`` (``head``: its HEAD) to ``to``, marked; False when the source is no longer that
    version (412)."""
    source: CopySourceTypeDef = {"Bucket": done.bucket, "Key": done.key}
    if done.version_id is not None:
        source["VersionId"] = done.version_id
    extra: dict[str, Any] = {
        "CopySourceIfMatch": f'"{done.etag}"',
        "MetadataDirective": "REPLACE",
        "Metadata": {**head.get("Metadata", {}), COPY_OF_METADATA: done.marker},
        **{name: head[name] for name in _KEPT_HEADERS if head.get(name)},
        **sse_params(settings),
    }
    try:
        if int(head.get("ContentLength", 0)) <= COPY_OBJECT_LIMIT:
            s3.copy_object(CopySource=source, Bucket=to[0], Key=to[1], **extra)
        else:  # in parts (UploadPartCopy, each conditional on the ETag)
            s3.copy(source, to[0], to[1], ExtraArgs=extra)
    except ClientError as err:
        if error_code(err) in _CHANGED:
            return False
        raise_s3_error(err, f"archiving s3://{done.bucket}/{done.key} to", *to)
    except BotoCoreError as err:
        raise_s3_error(err, f"archiving s3://{done.bucket}/{done.key} to", *to)
    return True


def _delete(s3: S3Client, done: _Version) -> bool:
    """Delete the version ``done``: by its VersionId (versioned), else on condition of its ETag. False when the
    object is no longer that version (412)."""
    kwargs: dict[str, Any] = {"Bucket": done.bucket, "Key": done.key}
    if done.version_id is not None:
        kwargs["VersionId"] = done.version_id
    else:
        kwargs["IfMatch"] = f'"{done.etag}"'
    try:
        s3.delete_object(**kwargs)
    except ClientError as err:
        if error_code(err) in _CHANGED:
            return False
        if error_code(err) not in _MISSING:  # gone already: deleted
            raise_s3_error(err, "deleting", done.bucket, done.key)
    except BotoCoreError as err:
        raise_s3_error(err, "deleting", done.bucket, done.key)
    return True


def _tag(s3: S3Client, done: _Version, tags: dict[str, str]) -> Outcome:
    """Add ``tags`` to the version ``done``, keeping its other tags."""
    kwargs: dict[str, Any] = {"Bucket": done.bucket, "Key": done.key}
    if done.version_id is not None:
        kwargs["VersionId"] = done.version_id
    try:
        found = {t["Key"]: t["Value"] for t in s3.get_object_tagging(**kwargs).get("TagSet", [])}
        merged = {**found, **tags}
        if len(merged) > MAX_TAGS:
            reason = f"it has {len(found)} tags already, {len(merged)} with these (S3 allows {MAX_TAGS}): not tagged"
            return Outcome(done="skipped", reason=reason)
        if merged != found:
            s3.put_object_tagging(**kwargs, Tagging={"TagSet": [{"Key": k, "Value": v} for k, v in merged.items()]})
    except (ClientError, BotoCoreError) as err:
        raise_s3_error(err, "tagging", done.bucket, done.key)
    if done.version_id is None:  # no conditional tagging: was it still the version processed once tagged?
        head = _head(s3, done.bucket, done.key)
        if head is None or strip_etag(head["ETag"]) != done.etag:
            changed = _changed(head, done).reason
            return Outcome(done="skipped", reason=f"{changed}; it changed while it was tagged: the tags may be on it")
    return Outcome(done="tagged")

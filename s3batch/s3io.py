"""S3 access for the activities: pinned ranged reads, error translation, client construction.

boto3 is configured through its own chain (``AWS_ENDPOINT_URL_S3``, ``AWS_REGION``, credentials,
profiles); only retry and pool settings are set here. Transient errors (throttling, 5xx, resets)
are retried by botocore's ``standard`` retry mode first, then by Temporal's activity retries.
"""

from __future__ import annotations

import contextlib
import functools
import io
import time
import weakref
from collections.abc import Callable
from typing import Any, NoReturn

import boto3
import botocore.session
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ReadTimeoutError,
    ResponseStreamingError,
)
from botocore.loaders import Loader, create_loader
from urllib3.exceptions import ProtocolError

from s3batch.config import Settings
from s3batch.errors import AccessDenied, NotFound, S3Error, S3Refused, SourceChanged

S3Client = Any
"""A boto3 S3 client (boto3 ships no static types for it)."""

_MISSING_CODES = {"NoSuchKey", "NoSuchBucket", "NotFound", "404", "NoSuchVersion"}
_DENIED_CODES = {"AccessDenied", "403", "Forbidden"}
_CREDENTIALS_CODES = {
    "InvalidAccessKeyId": "no such access key ID",
    "SignatureDoesNotMatch": "the secret key is not the access key's",
}
_CHANGED_CODES = {"PreconditionFailed", "412"}
# Requests the server refuses as malformed: sending them again cannot succeed.
_REFUSED_CODES = {"InvalidRequest", "InvalidArgument", "KeyTooLongError", "InvalidBucketName", "InvalidObjectName"}

STREAM_ERRORS = (ProtocolError, ReadTimeoutError, ConnectionClosedError, ResponseStreamingError, OSError)

OWNERS: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
"""The expected bucket owner each client of :func:`make_client` sends (empty: none)."""


_LOADER: Loader | None = None
"""botocore's loader of service models, shared by every session of this process (see :func:`make_client`)."""


def _session() -> boto3.session.Session:
    """A new boto3 session (its own credentials and configuration, read from the chain as a fresh session reads
    them) sharing one loader of service models: a session of its own parses S3's service model and endpoint rules
    again, about 0.2 s of CPU a client, against 0.03 s with the loader's cache."""
    global _LOADER
    if _LOADER is None:
        _LOADER = create_loader()
    core = botocore.session.Session()
    core.register_component("data_loader", _LOADER)
    return boto3.session.Session(botocore_session=core)


def make_client(max_pool_connections: int = 32, *, expected_bucket_owner: str | None = None) -> S3Client:
    """An S3 client from boto3's default chain, with retries suited to long batch jobs.

    Args:
        max_pool_connections: HTTP connections kept (one per activity slot, and a few more).
        expected_bucket_owner: AWS account ID sent as ``ExpectedBucketOwner`` (and
            ``ExpectedSourceBucketOwner``) on every request that takes it; None: from
            ``S3BATCH_EXPECTED_BUCKET_OWNER``; empty: not sent.
    """
    config = Config(
        retries={"mode": "standard", "max_attempts": 6},
        max_pool_connections=max_pool_connections,
        connect_timeout=10,
        read_timeout=60,
    )
    client = _session().client("s3", config=config)
    owner = Settings().expected_bucket_owner if expected_bucket_owner is None else expected_bucket_owner
    OWNERS[client] = owner  # the data path's other client sends it too (s3batch.objects)
    if owner:
        # One place for every call (GET, HEAD, PUT, LIST, DELETE, COPY, paginators included): a
        # bucket that another account owns is refused by S3 instead of read or written.
        client.meta.events.register("before-parameter-build.s3", functools.partial(_expect_owner, owner))
    return client


def _expect_owner(owner: str, params: dict[str, Any], model: Any, **_: Any) -> None:
    members = model.input_shape.members if model.input_shape is not None else {}
    for name in ("ExpectedBucketOwner", "ExpectedSourceBucketOwner"):
        if name in members:
            params.setdefault(name, owner)


def error_code(err: ClientError) -> str:
    return str(err.response.get("Error", {}).get("Code", ""))


def is_missing_object(err: ClientError) -> bool:
    """The error says the object does not exist (HEAD answers a bare 404)."""
    return error_code(err) in {"404", "NoSuchKey", "NotFound"}


def raise_s3_error(err: Exception, action: str, bucket: str, key: str | None = None) -> NoReturn:
    """Re-raise an S3 error as an s3batch error that says what, where and what to do.

    Missing objects or buckets, denied access and changed sources are not retryable: retrying
    cannot fix them. Everything else (throttling, 5xx, network) is left retryable.
    """
    where = f"s3://{bucket}/{key}" if key is not None else f"s3://{bucket}"
    if isinstance(err, ClientError):
        code = error_code(err)
        if code in _CHANGED_CODES:
            raise SourceChanged(
                f"{where} changed since it was listed (its ETag no longer matches); the output of this "
                "file was not completed. Re-run the job to process the new version."
            ) from None
        if code in _MISSING_CODES:
            what = "bucket" if code == "NoSuchBucket" or key is None else "object"
            raise NotFound(
                f"{action} {where}: the {what} does not exist ({code}). Check the bucket and key, "
                "and that the endpoint and region are the right ones."
            ) from None
        if code in _CREDENTIALS_CODES:
            raise AccessDenied(
                f"{action} {where}: the S3 server refused the credentials ({code}: "
                f"{_CREDENTIALS_CODES[code]}). Check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), "
                "and that the endpoint and region are the right ones."
            ) from None
        if code in _DENIED_CODES:
            raise AccessDenied(
                f"{action} {where}: access denied ({code}). Give the worker's credentials the "
                "s3:GetObject/s3:ListBucket permissions on the source and s3:PutObject on the output."
            ) from None
        if code in _REFUSED_CODES:
            raise S3Refused(
                f"{action} {where}: the S3 server refused the request as invalid ({code}: {err}). "
                "Check the bucket, prefix and key names."
            ) from None
        raise S3Error(f"{action} {where} failed: {code}: {err}") from None
    if isinstance(err, (BotoCoreError, *STREAM_ERRORS)):
        raise S3Error(f"{action} {where} failed: {err}") from None
    raise err


class RangedReader(io.RawIOBase):
    """A read-only stream over one object version, fetched as a sequence of bounded ranged GETs.

    Every GET carries ``IfMatch`` (and ``VersionId`` when known), so an object overwritten while a
    long file is being read is noticed at the next window instead of mixing old and new bytes (an
    open GET keeps streaming the old bytes). A connection reset mid-window is retried from the exact
    byte position.
    """

    def __init__(
        self,
        client: S3Client,
        bucket: str,
        key: str,
        *,
        etag: str,
        size: int,
        version_id: str | None = None,
        start: int = 0,
        window: int = 16 * 1024 * 1024,
        on_bytes: Callable[[int], None] | None = None,
        stream_retries: int = 3,
    ) -> None:
        super().__init__()
        self._client = client
        self._bucket = bucket
        self._key = key
        self._etag = etag
        self._size = size
        self._version_id = version_id
        self._pos = start
        self._window = window
        self._body: Any = None
        self._window_end = start
        self._on_bytes = on_bytes
        self._stream_retries = stream_retries
        self._checked = False
        """A request pinned to the version has succeeded: the source is as listed."""

    def readable(self) -> bool:
        return True

    def _check(self) -> None:
        head = head_pinned(self._client, self._bucket, self._key, etag=self._etag, version_id=self._version_id)
        self._checked = True
        version = head.get("VersionId")
        if self._version_id is None and version and version != "null":
            self._version_id = version

    @property
    def position(self) -> int:
        """Bytes of the object read so far (from its start)."""
        return self._pos

    @property
    def checked(self) -> bool:
        """Whether a request pinned to the listed version has succeeded (the source is as listed)."""
        return self._checked

    def _open(self) -> None:
        end = min(self._pos + self._window, self._size) - 1
        kwargs: dict[str, Any] = {
            "Bucket": self._bucket,
            "Key": self._key,
            "Range": f"bytes={self._pos}-{end}",
            "IfMatch": f'"{self._etag}"',
        }
        if self._version_id:
            kwargs["VersionId"] = self._version_id
        from s3batch.objects import data_stores

        stores = data_stores(self._client, self._key)
        if stores is not None:  # the same request, through obstore
            got = stores.get(
                self._bucket, self._key, etag=self._etag, start=self._pos, end=end + 1, version_id=self._version_id
            )
            self._body, version = got
        else:
            try:
                response = self._client.get_object(**kwargs)
            except (ClientError, BotoCoreError) as err:
                raise_s3_error(err, "reading", self._bucket, self._key)
            self._body, version = response["Body"], response.get("VersionId")
        self._window_end = end + 1
        self._checked = True
        if self._version_id is None and version and version != "null":
            self._version_id = version  # pin the version this read started on

    @property
    def version_id(self) -> str | None:
        """The object version being read (None on an unversioned bucket)."""
        return self._version_id

    def readinto(self, buffer: Any) -> int:
        if self._pos >= self._size:
            if not self._checked:
                # Nothing left to read (a 0-byte object, or a resume at its end): still one
                # conditional request, so a deleted or changed source is noticed.
                self._check()
            return 0
        for attempt in range(self._stream_retries + 1):
            try:
                if self._body is None or self._pos >= self._window_end:
                    self._close_body()
                    self._open()
                want = min(len(buffer), self._window_end - self._pos)
                data = self._body.read(want)
                if not data:
                    raise ConnectionClosedError(endpoint_url=f"s3://{self._bucket}/{self._key}")
                n = len(data)
                buffer[:n] = data
                self._pos += n
                if self._on_bytes is not None:
                    self._on_bytes(n)
                return n
            except STREAM_ERRORS as err:
                self._close_body()
                if attempt == self._stream_retries:
                    raise_s3_error(err, "reading", self._bucket, self._key)
                time.sleep(0.2 * 2**attempt)
        raise AssertionError("unreachable")

    def _close_body(self) -> None:
        if self._body is not None:
            # Closing a broken stream must not hide the real error.
            with contextlib.suppress(Exception):
                self._body.close()
            self._body = None

    def close(self) -> None:
        self._close_body()
        super().close()


def strip_etag(etag: str) -> str:
    """An ETag as S3 lists it, without its quotes."""
    return etag.strip('"')


def any_object(client: S3Client, bucket: str, prefix: str) -> bool:
    """Whether any object exists under ``prefix`` (one LIST of at most one key)."""
    try:
        listed = client.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1)
    except (ClientError, BotoCoreError) as err:
        raise_s3_error(err, "listing", bucket, prefix)
    return bool(listed.get("KeyCount") or listed.get("Contents"))


def list_folder(client: S3Client, bucket: str, folder: str) -> dict[str, str]:
    """The objects directly in ``folder`` (an output folder), as ``{name: etag}`` (paginated LIST)."""
    found: dict[str, str] = {}
    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=folder):
            for item in page.get("Contents", []):
                name = item["Key"][len(folder) :]
                if "/" not in name:
                    found[name] = strip_etag(item["ETag"])
    except (ClientError, BotoCoreError) as err:
        raise_s3_error(err, "listing output under", bucket, folder)
    return found


def head_pinned(client: S3Client, bucket: str, key: str, *, etag: str, version_id: str | None = None) -> dict[str, Any]:
    """HEAD ``bucket/key`` on condition that it still has ``etag`` (and ``version_id``, when given).

    Raises ``NotFound`` when it is gone and ``SourceChanged`` when it was overwritten (non-retryable).
    """
    kwargs: dict[str, Any] = {"Bucket": bucket, "Key": key, "IfMatch": f'"{etag}"'}
    if version_id:
        kwargs["VersionId"] = version_id
    try:
        return client.head_object(**kwargs)
    except (ClientError, BotoCoreError) as err:
        raise_s3_error(err, "reading", bucket, key)


def delete_keys(client: S3Client, bucket: str, keys: list[str]) -> None:
    """Delete ``keys`` (DeleteObjects, 1,000 a request). A key S3 could not delete (listed under
    ``Errors`` of an otherwise successful response) fails the call (retryable) naming it."""
    for start in range(0, len(keys), 1000):
        batch = keys[start : start + 1000]
        try:
            response = client.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in batch]})
        except (ClientError, BotoCoreError) as err:
            raise_s3_error(err, "deleting objects in", bucket, batch[0])
        errors = response.get("Errors") or []
        if errors:
            first = errors[0]
            raise S3Error(
                f"deleting s3://{bucket}/{first.get('Key')}: {first.get('Code')}: {first.get('Message')} "
                f"({len(errors)} of {len(batch)} objects not deleted); the attempt is retried"
            )


def open_object(
    client: S3Client,
    bucket: str,
    key: str,
    *,
    etag: str,
    size: int,
    version_id: str | None = None,
    start: int = 0,
    window: int = 16 * 1024 * 1024,
    on_bytes: Callable[[int], None] | None = None,
) -> io.BufferedReader:
    """A buffered binary stream over ``bucket/key`` from byte ``start``, pinned to ``etag``."""
    raw = RangedReader(
        client,
        bucket,
        key,
        etag=etag,
        size=size,
        version_id=version_id,
        start=start,
        window=window,
        on_bytes=on_bytes,
    )
    # A small object's buffer is its size: a 1 MiB one for each 1 KB file is a fresh mapping per file.
    return io.BufferedReader(raw, buffer_size=max(8192, min(1024 * 1024, size - start)))

"""The data path's S3 requests (a source's ranged GETs, a part's PUT) through obstore, where it can take them.

A small file costs a GET and a PUT; in boto3 each costs 1-4 ms of the worker's CPU (event hooks, signing,
response parsing: issue 31, ``docs/explanation/performance.md``), several times the file's own work. obstore (Rust
``object_store`` bindings) makes the same request for about a tenth of that. It is used for those two
requests only (a manifest is read by the same reader as a source); everything else (listing, HEADs of
checkpoints, deletes, reports) stays on the boto3 client, and so does the configuration: the endpoint,
region, credentials (the client's own: its keys, or its chain's, asked again as they expire), the expected
bucket owner, come from boto3. The requests carry the same conditions
(``If-Match`` with the listed ETag, ``VersionId``) and the same user metadata, and their errors become the
same s3batch errors (:func:`s3batch.s3io.raise_s3_error`).

``S3BATCH_DATA_CLIENT=boto3`` (or obstore not installed) keeps every request on boto3. A PUT with
server-side encryption options, or with metadata that is not ASCII, goes through boto3 as well, and so does
every request for a key obstore would not send as it is (:func:`addressable`).
"""

from __future__ import annotations

import os
import re
import threading
import weakref
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn

from botocore import UNSIGNED
from botocore.exceptions import ClientError

from s3batch.s3io import OWNERS, raise_s3_error

if TYPE_CHECKING:
    from obstore import GetOptions
    from obstore.store import ClientConfig, S3Config, S3Store

    from s3batch.s3io import S3Client


class Got(NamedTuple):
    """An answered GET: its body (read with ``read(n)``) and the version it read (None: unversioned)."""

    body: Any
    version_id: str | None


class _Body:
    """A GET's body as ``read(n)``, over obstore's stream of chunks (the same shape as boto3's body)."""

    def __init__(self, result: Any) -> None:
        self._chunks = iter(result.stream(min_chunk_size=256 * 1024))
        self._left = memoryview(b"")

    def read(self, n: int = -1) -> bytes:
        if not self._left:
            try:
                self._left = memoryview(next(self._chunks))
            except StopIteration:
                return b""
            except Exception as err:  # noqa: BLE001 - obstore's errors: a broken stream, retried by the reader
                raise OSError(f"reading the response body: {err}") from None
        data = self._left if n < 0 else self._left[:n]
        self._left = self._left[len(data) :]
        return bytes(data)

    def close(self) -> None:
        self._chunks = iter(())


class ClientCredentials:
    """A boto3 client's own credentials, for obstore: the keys it was made with, or its session's chain (a
    role's temporary keys refreshed by botocore as they near their end). obstore keeps each answer until its
    ``expires_at``: at most five minutes, and never past the keys' own expiry."""

    def __init__(self, client: S3Client) -> None:
        # botocore keeps them on the client's signer (no public accessor); a client made with explicit keys
        # must sign with those, not with whatever the default chain finds.
        self._credentials = client._request_signer._credentials

    def __call__(self) -> dict[str, Any]:
        if self._credentials is None:
            raise ValueError("the S3 client has no credentials (boto3 found none in its chain)")
        frozen = self._credentials.get_frozen_credentials()  # refreshed by botocore first where due
        now = datetime.now(UTC)
        until = now + timedelta(minutes=5)
        expiry = getattr(self._credentials, "_expiry_time", None)
        if expiry is not None:
            until = max(min(until, expiry - timedelta(seconds=60)), now + timedelta(seconds=5))
        return {
            "access_key_id": frozen.access_key,
            "secret_access_key": frozen.secret_key,
            "token": frozen.token,
            "expires_at": until,
        }


class DataStores:
    """obstore stores (one per bucket) made from a boto3 client's configuration.

    Args:
        client: The worker's boto3 S3 client: its endpoint, region and credentials are used.
        owner: The expected bucket owner sent on every request (``x-amz-expected-bucket-owner``), or empty.
    """

    def __init__(self, client: S3Client, owner: str) -> None:
        self._endpoint = client.meta.endpoint_url
        self._region = client.meta.region_name or "us-east-1"
        # An unsigned client (public buckets) signs nothing here either.
        unsigned = client.meta.config.signature_version is UNSIGNED
        self._credentials = None if unsigned else ClientCredentials(client)
        self._tls = _tls_options(client)
        self._owner = owner
        config = client.meta.config
        retries = config.retries or {}
        attempts = retries.get("total_max_attempts") or retries.get("max_attempts", 4) + 1
        # The client's timeouts and retries (a user's own client may have others than make_client's): a read
        # stalled for read_timeout fails and is retried, as in botocore; the whole request has no limit of its own.
        self._options = {
            "connect_timeout": f"{config.connect_timeout}s",
            "read_timeout": f"{config.read_timeout}s",
            "timeout": "3600s",
        }
        self._retry = {"max_retries": max(0, int(attempts) - 1)}
        self._stores: dict[str, S3Store] = {}
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        """Requests made, by kind (``GetObject``, ``PutObject``): the accounting of a file's cost."""

    def _count(self, kind: str) -> None:
        with self._lock:
            self.counts[kind] += 1

    def _store(self, bucket: str) -> S3Store:
        store = self._stores.get(bucket)
        if store is not None:
            return store
        from obstore.store import S3Store

        with self._lock:
            store = self._stores.get(bucket)
            if store is None:
                options: ClientConfig = {**self._options}  # type: ignore[typeddict-item]
                # A checksum of each PUT's body, checked by S3 (boto3 sends a CRC32): an upload damaged on the way
                # fails instead of storing other bytes.
                config: S3Config = {
                    "region": self._region,
                    "skip_signature": self._credentials is None,
                    "checksum_algorithm": "SHA256",
                }
                if self._endpoint and not self._endpoint.endswith(".amazonaws.com"):
                    # A custom endpoint (path-style requests, as boto3), the boto3 client's even where
                    # AWS_ENDPOINT_URL_S3 says another (obstore reads the environment too, and that would win).
                    config["endpoint"] = config["aws_endpoint_url_s3"] = self._endpoint
                    options["allow_http"] = self._endpoint.startswith("http://")
                options.update(self._tls)  # type: ignore[typeddict-item]
                if self._owner:
                    options["default_headers"] = {"x-amz-expected-bucket-owner": self._owner}
                store = self._stores[bucket] = S3Store(
                    bucket,
                    config=config,
                    client_options=options,
                    retry_config=self._retry,  # type: ignore[arg-type]
                    credential_provider=self._credentials,  # type: ignore[arg-type]
                )
        return store

    def get(
        self, bucket: str, key: str, *, etag: str | None, start: int, end: int | None, version_id: str | None = None
    ) -> Got:
        """GET ``bucket/key`` bytes ``start`` to ``end`` (exclusive; None: to its end), on condition that it still
        has ``etag`` (and ``version_id``). Raises ``NotFound`` / ``SourceChanged`` as a boto3 GET would."""
        import obstore

        options: GetOptions = {}
        if end is not None:
            options["range"] = (start, end)
        elif start:
            options["range"] = {"offset": start}
        if etag is not None:
            options["if_match"] = f'"{etag}"'
        if version_id:
            options["version"] = version_id
        self._count("GetObject")
        try:
            result = obstore.get(self._store(bucket), key, options=options)
        except Exception as err:  # noqa: BLE001 - translated below
            _raise(err, "reading", bucket, key)
        version = result.meta.get("version")
        return Got(_Body(result), version if version and version != "null" else None)

    def put(self, bucket: str, key: str, body: bytes, content_type: str, metadata: dict[str, str]) -> str:
        """PUT ``body`` at ``bucket/key`` with ``metadata`` (user metadata); returns its ETag (quotes stripped)."""
        import obstore

        attributes: dict[str, str] = {"Content-Type": content_type, **metadata}
        self._count("PutObject")
        try:
            result = obstore.put(self._store(bucket), key, body, attributes=attributes, use_multipart=False)
        except Exception as err:  # noqa: BLE001 - translated below
            _raise(err, "writing", bucket, key)
        return (result.get("e_tag") or "").strip('"')


_CODES = {
    "NotFoundError": "NoSuchKey",
    "PreconditionError": "PreconditionFailed",
    "PermissionDeniedError": "AccessDenied",
    "UnauthenticatedError": "InvalidAccessKeyId",
}


_STATUS_CODES = {"400": "InvalidRequest", "403": "AccessDenied", "404": "NoSuchKey", "412": "PreconditionFailed"}


def _raise(err: Exception, action: str, bucket: str, key: str) -> NoReturn:
    """Raise obstore's ``err`` as the s3batch error boto3's would have become: by S3's error code where its
    text quotes the answer's, else by its kind or HTTP status (anything else: retryable)."""
    text = str(err)
    found = re.search(r"<Code>(\w+)</Code>", text)
    status = re.search(r"\bstatus:? (\d{3})\b", text)
    code = found.group(1) if found else _CODES.get(type(err).__name__)
    if code is None:
        code = _STATUS_CODES.get(status.group(1), "InternalError") if status else "InternalError"
    # The text of obstore's error names the request, never the object's bytes.
    raise_s3_error(ClientError({"Error": {"Code": code, "Message": str(err)[:300]}}, action), action, bucket, key)


def _tls_options(client: S3Client) -> dict[str, Any]:
    """The client's certificate checks for obstore: a CA bundle of its own (``AWS_CA_BUNDLE``, ``verify=path``)
    trusted beside the system's roots, or none (``verify=False``), as boto3 does for its requests."""
    verify = getattr(getattr(getattr(client, "_endpoint", None), "http_session", None), "_verify", True)
    if verify is False:
        return {"allow_invalid_certificates": True}
    if isinstance(verify, str):
        return {"root_certificate": Path(verify).read_bytes()}
    return {}


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def addressable(key: str) -> bool:
    """Whether obstore sends ``key`` to S3 as it is. Its paths are not S3's keys: a leading or trailing ``/``
    is dropped (``/a`` and ``a/`` would read ``a``, another object), and a key with an empty, ``.`` or ``..``
    segment or an ASCII control character is refused. Any such key goes through boto3, which sends every key."""
    if not key or key.startswith("/") or key.endswith("/") or _CONTROL.search(key):
        return False
    return all(part not in ("", ".", "..") for part in key.split("/"))


_ALL: weakref.WeakKeyDictionary[Any, DataStores | None] = weakref.WeakKeyDictionary()
_ALL_LOCK = threading.Lock()


def data_stores(client: S3Client, key: str | None = None) -> DataStores | None:
    """The obstore stores for the data requests of ``client`` (made once per client), or None where its data
    requests stay on boto3 (``S3BATCH_DATA_CLIENT=boto3``, obstore missing, or ``client`` not a boto3 client),
    and where the request is for a ``key`` obstore would not send as it is."""
    if key is not None and not addressable(key):
        return None
    try:
        return _ALL[client]
    except KeyError:
        pass
    except TypeError:
        return None  # cannot be a boto3 client
    with _ALL_LOCK:
        if client not in _ALL:
            _ALL[client] = _make(client)
        return _ALL[client]


def _make(client: S3Client) -> DataStores | None:
    from s3batch.config import Settings

    meta = getattr(client, "meta", None)
    if meta is None or getattr(meta, "service_model", None) is None:
        return None  # a stand-in client (tests)
    if Settings().data_client != "obstore":
        return None
    try:
        import obstore  # noqa: F401 - only whether it is installed
    except ImportError:
        return None
    verify = getattr(getattr(getattr(client, "_endpoint", None), "http_session", None), "_verify", True)
    if isinstance(verify, str) and os.path.isdir(verify):
        return None  # a folder of CA certificates: obstore takes a bundle only
    # The owner make_client was given (or found in S3BATCH_EXPECTED_BUCKET_OWNER) for its own requests.
    owner = OWNERS.get(client)
    return DataStores(client, Settings().expected_bucket_owner if owner is None else owner)

"""Custom search attributes of s3batch jobs, so the Web UI and ``temporal workflow list --query``
can filter them (``S3BatchSource="incoming/customers/"``, ``S3BatchStatus="failed"``).

Upserting an attribute the namespace does not know fails the workflow *task* (the job would hang),
so the workflow only upserts when its run carries ``S3BatchSource``: the starter sets it at start,
which the server accepts only when the attributes are registered. A job started without it (plain
``temporal workflow start``, or a namespace without the attributes) runs the same, unindexed.

With an encryption key, ``S3BatchSource`` names nothing: it holds ``hmac:`` and 32 hex digits, an
HMAC-SHA256 of ``bucket/prefix`` keyed with a key derived from the current encryption key
(:func:`source_value`). The same source always gives the same value under the same key, so jobs can
still be filtered by source (``s3batch list --source bucket/prefix``, or the query
``python -m s3batch.search_attributes query bucket/prefix`` prints), but the value cannot be turned
back into the names. Search attributes are not payloads: the codec never sees them.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import logging
import sys
from collections.abc import Sequence

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest, ListSearchAttributesRequest
from temporalio.client import Client
from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes
from temporalio.service import RPCError

log = logging.getLogger(__name__)

SOURCE = SearchAttributeKey.for_keyword("S3BatchSource")
"""``bucket/prefix`` of the job's source; with an encryption key, ``hmac:<32 hex digits>`` of it."""
STATUS = SearchAttributeKey.for_keyword("S3BatchStatus")
"""``processing``, ``paused``, ``succeeded``, ``failed`` or ``cancelled``."""
FILES_DONE = SearchAttributeKey.for_int("S3BatchFilesDone")
FILES_FAILED = SearchAttributeKey.for_int("S3BatchFilesFailed")

_TYPES = {
    SOURCE.name: IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD,
    STATUS.name: IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD,
    FILES_DONE.name: IndexedValueType.INDEXED_VALUE_TYPE_INT,
    FILES_FAILED.name: IndexedValueType.INDEXED_VALUE_TYPE_INT,
}


HASHED = "hmac:"
"""Prefix of a hashed ``S3BatchSource`` (a plain one starts with a bucket name, which has no ``:``)."""


def search_key(key: bytes) -> bytes:
    """The key that hashes search attribute values, derived from an encryption key (never the key
    itself, so an attribute value says nothing about the payload key)."""
    return hmac.new(key, b"s3batch search attribute key", hashlib.sha256).digest()


def source_value(bucket: str, prefix: str, keys: Sequence[bytes] = ()) -> str:
    """The ``S3BatchSource`` of a job: ``bucket/prefix``, or with a keyring (first = current key)
    ``hmac:`` + the first 32 hex digits of HMAC-SHA256(search_key(current key), ``bucket/prefix``)."""
    plain = f"{bucket}/{prefix}"
    if not keys:
        return plain
    digest = hmac.new(search_key(keys[0]), plain.encode(), hashlib.sha256).hexdigest()
    return HASHED + digest[:32]


def source_values(bucket: str, prefix: str, keys: Sequence[bytes] = ()) -> list[str]:
    """Every value ``S3BatchSource`` may hold for this source: one per key of the keyring (jobs
    started before a rotation carry the value of the key current then), or the plain one."""
    if not keys:
        return [source_value(bucket, prefix)]
    return [source_value(bucket, prefix, [key]) for key in keys]


def source_query(bucket: str, prefix: str, keys: Sequence[bytes] = ()) -> str:
    """A visibility query clause that matches the jobs of this source (exact bucket and prefix)."""
    values = ", ".join(f'"{value}"' for value in source_values(bucket, prefix, keys))
    return f"{SOURCE.name} IN ({values})"


def at_start(bucket: str, prefix: str, keys: Sequence[bytes] = ()) -> TypedSearchAttributes:
    """Search attributes to start a job with (accepted only where they are registered)."""
    return TypedSearchAttributes([SearchAttributePair(SOURCE, source_value(bucket, prefix, keys))])


async def ensure_registered(client: Client) -> bool:
    """Register the missing attributes in the client's namespace (worker start-up).

    Returns:
        True when all of them are registered; False where the server does not allow it (e.g. a
        cloud namespace without the permission), after logging why. Jobs run either way.
    """
    try:
        listed = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace=client.namespace)
        )
        missing = {name: kind for name, kind in _TYPES.items() if name not in listed.custom_attributes}
        if missing:
            await client.operator_service.add_search_attributes(
                AddSearchAttributesRequest(namespace=client.namespace, search_attributes=missing)
            )
            log.info("registered search attributes %s", ", ".join(sorted(missing)))
        return True
    except RPCError as err:
        log.warning("cannot register s3batch search attributes (%s); jobs run without them", err.message)
        return False


def main(argv: list[str] | None = None) -> int:
    """``python -m s3batch.search_attributes query bucket/prefix``: print the query clause that
    selects the jobs of a source, with the keys of the environment (``S3BATCH_ENCRYPTION_KEY`` ...)."""
    from s3batch.codec import KeyringError
    from s3batch.config import Settings

    parser = argparse.ArgumentParser(prog="python -m s3batch.search_attributes")
    commands = parser.add_subparsers(dest="command", required=True)
    query = commands.add_parser("query", help="the S3BatchSource clause for `temporal workflow list --query`")
    query.add_argument("source", metavar="BUCKET/PREFIX", help="the job's source, e.g. incoming/customers/")
    args = parser.parse_args(argv)
    bucket, slash, prefix = args.source.removeprefix("s3://").partition("/")
    if not bucket or not slash:
        parser.error("give the source as BUCKET/PREFIX (e.g. incoming/customers/, or incoming/ for a whole bucket)")
    try:
        keys = Settings().keyring()
    except KeyringError as err:
        parser.error(f"the encryption settings are not usable: {err}")
    sys.stdout.write(source_query(bucket, prefix, keys) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

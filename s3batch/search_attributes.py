"""Custom search attributes of s3batch jobs, so the Web UI and ``temporal workflow list --query``
can filter them (``S3BatchSource="incoming/customers/"``, ``S3BatchStatus="failed"``).

Upserting an attribute the namespace does not know fails the workflow *task* (the job would hang),
so the workflow only upserts when its run carries ``S3BatchSource``: the starter sets it at start,
which the server accepts only when the attributes are registered. A job started without it (plain
``temporal workflow start``, or a namespace without the attributes) runs the same, unindexed.
"""

from __future__ import annotations

import logging

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest, ListSearchAttributesRequest
from temporalio.client import Client
from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes
from temporalio.service import RPCError

log = logging.getLogger(__name__)

SOURCE = SearchAttributeKey.for_keyword("S3BatchSource")
"""``bucket/prefix`` of the job's source."""
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


def source_value(bucket: str, prefix: str) -> str:
    return f"{bucket}/{prefix}"


def at_start(bucket: str, prefix: str) -> TypedSearchAttributes:
    """Search attributes to start a job with (accepted only where they are registered)."""
    return TypedSearchAttributes([SearchAttributePair(SOURCE, source_value(bucket, prefix))])


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

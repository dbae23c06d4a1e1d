"""Example handler with a side effect: each record is POSTed to an HTTP endpoint with an
``Idempotency-Key`` header, so the endpoint can drop the repeats a crash causes.

    S3BATCH_HANDLER_MODULES=examples.idempotent_http IDEMPOTENT_HTTP_URL=http://127.0.0.1:8080/records s3batch-worker

The guarantee: s3batch hands each chunk to the handler at least once (again, from the chunk's first
record, after a crash, a hand-over or a retry), and every record gets the same key each time
(``chunk_context().record_key(line)``: job, source key, version, line). An endpoint that stores the
keys it has seen applies each record exactly once. The records are also written to the job's sink
as they are (like ``passthrough``), after the calls for their chunk succeeded.
"""

from __future__ import annotations

import os
import urllib.request
from collections.abc import Sequence

from s3batch.formats.common import Record
from s3batch.handlers import HandlerResult, chunk_context, chunk_handler
from s3batch.jsonvalues import encode_json

URL_ENV = "IDEMPOTENT_HTTP_URL"
"""The endpoint every record is POSTed to."""


@chunk_handler("http_idempotent")
def post_each(records: Sequence[Record]) -> HandlerResult:
    """POST each record (its JSON) with its idempotency key; an HTTP error fails the chunk (retried whole)."""
    url = os.environ[URL_ENV]
    context = chunk_context()
    for record in records:
        request = urllib.request.Request(
            url,
            data=encode_json(record.value),
            method="POST",
            headers={
                "Content-Type": "application/json",
                "Idempotency-Key": context.record_key(record.line),
                "S3Batch-Attempt": str(context.attempt),
            },
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            response.read()
    return HandlerResult([encode_json(r.value) for r in records], [], encoded=True, dropped=0)

"""Issue 36, finding 1: every object a worker reads is one of its allowed sources, whatever named it.

A worker whose ``S3BATCH_ALLOWED_SOURCES`` is one bucket is given jobs whose manifests name objects of
another bucket (an inventory's ``destinationBucket`` and ``files``, an inventory data file's rows, a plain
list's rows), a listing of that bucket, a listing page of such a manifest with no start check before it,
a redrive of a report naming keys the globs do not match, and a ledger write naming an output elsewhere.
Each is refused with ``InvalidInput``; every S3 request the worker sends is recorded, and none is for
the other bucket; the keys only the other bucket's objects (or the manifest) held appear nowhere in the
job's history, its failure or what it wrote. Real SeaweedFS, a real Temporal dev server.
"""

from __future__ import annotations

import gzip
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from s3batch.activities.s3_activities import S3Activities
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment
from temporalio.worker import Worker

from s3batch.config import Settings
from s3batch.dev.stack import Stack
from s3batch.incremental import WriteLedgerInput
from s3batch.messages import ListObjectsInput
from s3batch.models import S3BatchInput
from s3batch.plugin import S3BatchPlugin
from s3batch.s3io import make_client
from tests.helpers.data import make_csv
from tests.helpers.history import history_text
from tests.helpers.jobs import new_id
from tests.helpers.output import list_keys

MARKER = "q7x3-private"
"""In the keys only the outside bucket's objects and the manifests hold (never in a job input)."""


class _Sent:
    """Every S3 request a client sends: operation and bucket."""

    def __init__(self, client: Any) -> None:
        self.requests: list[tuple[str, str]] = []
        client.meta.events.register("provide-client-params.s3.*", self._record)

    def _record(self, params: dict[str, Any], model: Any, **_: Any) -> None:
        self.requests.append((model.name, str(params.get("Bucket", ""))))

    def to(self, bucket: str) -> list[tuple[str, str]]:
        return [r for r in self.requests if r[1] == bucket]


@pytest.fixture
def outside(s3: Any) -> str:
    """A bucket the worker may not read, with a private object and an inventory data file listing it."""
    bucket = f"sec-{uuid.uuid4().hex[:10]}"
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key=f"private/credentials-{MARKER}.csv", Body=make_csv(3))
    rows = f'"{bucket}","private/credentials-{MARKER}.csv"\n'.encode()
    s3.put_object(Bucket=bucket, Key=f"inv/data-{MARKER}.csv.gz", Body=gzip.compress(rows))
    return bucket


@pytest.fixture
async def one_bucket_worker(
    stack: Stack, task_queue: str, buckets: tuple[str, str]
) -> AsyncIterator[tuple[Worker, _Sent]]:
    """An in-process worker allowed to read the test's source bucket only; its S3 requests recorded."""
    src, _ = buckets
    plain = await Client.connect(stack.config.temporal_address)
    s3 = make_client()
    requests = _Sent(s3)
    settings = Settings.explicit(allowed_sources=f"{src}/*")
    plugin = S3BatchPlugin(s3, settings=settings, register_search_attributes=False)
    async with Worker(plain, task_queue=task_queue, plugins=[plugin], max_concurrent_activities=4) as w:
        yield w, requests


async def _refused(client: Client, task_queue: str, spec: S3BatchInput, tag: str) -> tuple[str, str]:
    """Run ``spec``: it fails with InvalidInput. Its message, and all the text of its history."""
    job_id = new_id(tag)
    with pytest.raises(WorkflowFailureError) as failed:
        await client.execute_workflow("S3BatchWorkflow", spec, id=job_id, task_queue=task_queue)
    cause: Any = failed.value.cause
    while cause.cause is not None and getattr(cause, "type", None) != "InvalidInput":
        cause = cause.cause
    assert getattr(cause, "type", None) == "InvalidInput", failed.value
    return cause.message, await history_text(client, job_id)


def _written(s3: Any, out: str) -> str:
    """Everything in the output bucket, keys and bodies."""
    return "\n".join(f"{k}\n{s3.get_object(Bucket=out, Key=k)['Body'].read().decode(errors='replace')}"
                     for k in list_keys(s3, out, ""))  # fmt: skip


def _inventory(destination: str, files: list[str]) -> bytes:
    return json.dumps({
        "sourceBucket": destination, "destinationBucket": f"arn:aws:s3:::{destination}", "fileFormat": "CSV",
        "fileSchema": "Bucket, Key", "files": [{"key": f} for f in files],
    }).encode()  # fmt: skip


async def test_manifests_naming_objects_of_another_bucket_are_refused_before_any_request_there(
    client: Client, one_bucket_worker: tuple[Worker, _Sent], task_queue: str, s3: Any, buckets: tuple[str, str],
    outside: str,
) -> None:
    src, out = buckets
    _, sent = one_bucket_worker
    s3.put_object(Bucket=src, Key="in/ok.csv", Body=make_csv(2))
    base = {"output_bucket": out, "output_prefix": "o/"}

    # 1. An inventory manifest.json whose destinationBucket is the other bucket: its data file is never read.
    s3.put_object(Bucket=src, Key="m/inventory.json", Body=_inventory(outside, [f"inv/data-{MARKER}.csv.gz"]))
    spec = S3BatchInput.model_validate({"manifest": f"s3://{src}/m/inventory.json", **base})
    message, history = await _refused(client, task_queue, spec, "sec-inv-destination")
    assert "S3BATCH_ALLOWED_SOURCES" in message and "files[0]" in message and "destinationBucket" in message
    assert f"s3://{src}/m/inventory.json" in message

    # 2. An inventory whose data file (in the allowed bucket) lists objects of the other bucket.
    rows = f'"{src}","in/ok.csv"\n"{outside}","private/credentials-{MARKER}.csv"\n'.encode()
    s3.put_object(Bucket=src, Key="m/data.csv.gz", Body=gzip.compress(rows))
    s3.put_object(Bucket=src, Key="m/manifest.json", Body=_inventory(src, ["m/data.csv.gz"]))
    spec = S3BatchInput.model_validate({"manifest": f"s3://{src}/m/manifest.json", **base})
    message2, history2 = await _refused(client, task_queue, spec, "sec-inv-rows")
    assert "S3BATCH_ALLOWED_SOURCES" in message2 and f"row 2 of s3://{src}/m/data.csv.gz" in message2

    # 3. A plain list naming an object of the other bucket first (the two-bucket check would name it).
    s3.put_object(Bucket=src, Key="m/list.csv", Body=f"{outside},private/credentials-{MARKER}.csv\n".encode())
    spec = S3BatchInput.model_validate({"manifest": f"s3://{src}/m/list.csv", **base})
    message3, history3 = await _refused(client, task_queue, spec, "sec-list")
    assert "S3BATCH_ALLOWED_SOURCES" in message3 and f"row 1 of s3://{src}/m/list.csv" in message3

    # 4. The other bucket as the job's own source: refused by the start check (as before).
    spec = S3BatchInput.model_validate({"bucket": outside, "prefix": "private/", **base})
    message4, history4 = await _refused(client, task_queue, spec, "sec-listing")
    assert f"may not read from s3://{outside}/private/" in message4

    assert sent.to(outside) == [], sent.to(outside)  # not one request for the other bucket
    assert sent.requests, "the worker sent no request at all: the recording is broken"
    for text in (message, history, message2, history2, message3, history3, _written(s3, out)):
        assert MARKER not in text and outside not in text, text[:3000]
    assert MARKER not in message4 + history4  # the job named the bucket and prefix, nothing under them


def _run(acts: S3Activities, method: str, arg: Any) -> Any:
    return ActivityEnvironment().run(getattr(acts, method), arg)


def _invalid(acts: S3Activities, method: str, arg: Any) -> str:
    with pytest.raises(ApplicationError) as info:
        _run(acts, method, arg)
    assert info.value.type == "InvalidInput" and info.value.non_retryable, info.value
    return info.value.message


def test_listing_pages_redrives_and_ledger_writes_check_each_object_themselves(
    s3: Any, buckets: tuple[str, str], outside: str
) -> None:
    """The activities check again what they read, without the job's start check before them: a page of a
    manifest whose data file changed since the start check, a redrive page of keys the globs do not match
    (the report lies in an output, which others may write), a ledger write of a run whose output is elsewhere."""
    src, out = buckets
    client = make_client()
    recorded = _Sent(client)
    acts = S3Activities(client, Settings.explicit(allowed_sources=f"{src}/*", allowed_outputs=f"{out}/*"))
    rows = f'"{outside}","private/credentials-{MARKER}.csv"\n'.encode()
    s3.put_object(Bucket=src, Key="m/data.csv.gz", Body=gzip.compress(rows))
    s3.put_object(Bucket=src, Key="m/manifest.json", Body=_inventory(src, ["m/data.csv.gz"]))
    page = ListObjectsInput(bucket="", prefix="", manifest=f"s3://{src}/m/manifest.json")
    message = _invalid(acts, "list_objects", page)
    assert f"row 1 of s3://{src}/m/data.csv.gz" in message and MARKER not in message and outside not in message

    exact = S3Activities(client, Settings.explicit(allowed_sources=f"{src}/in/"))  # the prefix, not the keys under it
    outside_requests, recorded.requests = recorded.to(outside), []
    s3.put_object(Bucket=src, Key="in/a.csv", Body=make_csv(1))
    failed = {"files": [{"key": "in/a.csv", "status": "failed"}]}
    s3.put_object(Bucket=out, Key="r/_report.json", Body=json.dumps(failed))
    redrive = ListObjectsInput(bucket=src, prefix="in/", report=f"s3://{out}/r/_report.json")
    assert f"may not read from s3://{src}/in/a.csv" in _invalid(exact, "list_objects", redrive)
    assert ("HeadObject", src) not in recorded.requests  # refused before its HEAD

    ledger = WriteLedgerInput(
        ledger=f"s3://{out}/led/", run_id="r", source=f"s3://{src}/in/", output_bucket=outside,
        output_prefix="runs/r/", report_key="runs/r/_report.json", status="succeeded", listing_done=True,
    )  # fmt: skip
    assert f"may not write to s3://{outside}/runs/r/" in _invalid(acts, "write_ledger", ledger)
    assert outside_requests == recorded.to(outside) == [], outside_requests

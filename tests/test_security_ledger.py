"""Issue 36, findings 4 and 9: an incremental ledger is its source's, and bounded.

A job of another source (another bucket or prefix, or a typo) run on a ledger used to take it over: it
rewrote the watermark and emptied the retries, and the next run of the ledger's own source reported
objects it never processed as skipped. The ledger was also read whole, without a bound, on every listing
page. Real SeaweedFS and a real Temporal dev server.
"""

from __future__ import annotations

import datetime
import json
from typing import Any

import pytest
from s3batch.activities.incremental import Ledgers, write_ledger
from s3batch.activities.s3_activities import S3Activities
from s3batch.workflows.batch import S3BatchWorkflow
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment
from temporalio.worker import Worker

from s3batch.config import Settings
from s3batch.errors import InvalidInput
from s3batch.incremental import Ledger, ListIncrementalInput, PageRecord, WriteLedgerInput, advance
from s3batch.models import S3BatchInput
from s3batch.s3io import make_client
from tests.helpers.data import put_files
from tests.helpers.jobs import new_id
from tests.helpers.output import list_keys


def _job(src: str, out: str, prefix: str, output_prefix: str) -> S3BatchInput:
    return S3BatchInput.model_validate({
        "bucket": src, "prefix": prefix, "output_bucket": out, "output_prefix": output_prefix,
        "handler": "passthrough", "incremental": {"ledger": f"s3://{out}/shared/"},
    })  # fmt: skip


def _ledger_body(s3: Any, out: str) -> bytes:
    return bytes(s3.get_object(Bucket=out, Key="shared/ledger.json")["Body"].read())


async def test_a_job_of_another_source_is_refused_by_the_ledger_naming_both(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets: tuple[str, str]
) -> None:
    src, out = buckets
    put_files(s3, src, {"in/a/1.jsonl": b'{"a": 1}\n', "in/b/1.jsonl": b'{"b": 1}\n'})
    first = await client.execute_workflow(
        S3BatchWorkflow.run, _job(src, out, "in/a/", "a/"), id=new_id("led-a"), task_queue=task_queue
    )
    assert first.totals.files_succeeded == 1
    body = _ledger_body(s3, out)
    assert json.loads(body)["source"] == f"s3://{src}/in/a/"

    with pytest.raises(WorkflowFailureError) as failed:
        await client.execute_workflow(
            S3BatchWorkflow.run, _job(src, out, "in/b/", "b/"), id=new_id("led-b"), task_queue=task_queue
        )
    cause: Any = failed.value.cause
    while cause.cause is not None and getattr(cause, "type", None) != "InvalidInput":
        cause = cause.cause
    assert getattr(cause, "type", None) == "InvalidInput", failed.value
    assert f"s3://{src}/in/a/" in cause.message and f"s3://{src}/in/b/" in cause.message, cause.message
    assert f"s3://{out}/shared/ledger.json" in cause.message and "Nothing was listed or processed" in cause.message
    assert _ledger_body(s3, out) == body  # the ledger is A's, as A left it
    assert not [k for k in list_keys(s3, out, "b/") if "/part-" in k]

    put_files(s3, src, {"in/a/2.jsonl": b'{"a": 2}\n'})
    again = await client.execute_workflow(
        S3BatchWorkflow.run, _job(src, out, "in/a/", "a/"), id=new_id("led-a2"), task_queue=task_queue
    )
    assert again.totals.files_succeeded == 1  # only the new object: A's ledger kept what A processed


def test_a_ledger_write_of_another_source_is_refused(s3: Any, buckets: tuple[str, str]) -> None:
    """The ledger's write checks the source too (a run of another source that listed before the ledger had one)."""
    _, out = buckets
    s3.put_object(Bucket=out, Key="led/ledger.json", Body=Ledger(source="s3://s/in/").to_json())
    body = s3.get_object(Bucket=out, Key="led/ledger.json")["Body"].read()
    req = WriteLedgerInput(
        ledger=f"s3://{out}/led/", run_id="r", source="s3://s/other/", output_bucket=out, output_prefix="r/",
        report_key="r/_report.json", status="succeeded", listing_done=True,
    )  # fmt: skip
    with pytest.raises(InvalidInput, match="the source s3://s/in/, not of this job's source s3://s/other/"):
        write_ledger(s3, req, lambda *a: pytest.fail("written"), Ledgers())
    assert s3.get_object(Bucket=out, Key="led/ledger.json")["Body"].read() == body


# A ledger as the release before this one wrote it (format s3batch-ledger/1): entries keyed by key, under
# its one source. Both releases read and write this layout.
_OLD_LEDGER = """{
 "format": "s3batch-ledger/1", "last_execution": "E1", "last_run": "job-1",
 "near": {"in/k": ["e1", "2026-12-01T11:59:00.000000Z"]}, "retry": {"in/failed": "e2"},
 "runs": [{"run": "job-1", "execution": "E1", "status": "succeeded"}], "source": "s3://src/in/",
 "totals": {"runs": 1}, "watermark": "2026-12-01T12:00:00.000000Z", "window_seconds": 900
}"""


def test_ledger_entries_are_keyed_by_bucket_and_key_in_the_earlier_layout() -> None:
    ledger = Ledger.model_validate_json(_OLD_LEDGER)
    at = datetime.datetime(2026, 12, 1, 11, 59, tzinfo=datetime.UTC)
    assert ledger.kind("src", "in/k", "e1", at) is None  # known: skipped as unchanged
    assert ledger.kind("src", "in/failed", "e2", at) == "retried"
    # The same keys in another bucket are other objects: neither known nor to retry, and not cut by the watermark.
    assert ledger.kind("elsewhere", "in/k", "e1", at) == "new"
    assert ledger.kind("elsewhere", "in/failed", "e2", at - datetime.timedelta(days=1)) == "new"
    req = WriteLedgerInput(
        ledger="s3://out/led/", run_id="job-2", source="s3://src/in/", output_bucket="out", output_prefix="r/",
        report_key="r/_report.json", status="succeeded", listing_done=True,
    )  # fmt: skip
    page = PageRecord(ledger_etag=None, listed_at="2026-12-01T13:00:00.000000Z",
                      taken=[("in/new", "e3", "2026-12-01T12:59:00.000000Z", "new")])  # fmt: skip
    written = json.loads(advance(ledger, req, [page], {"in/new": ("succeeded", "e3")}).to_json())
    assert set(written) == set(json.loads(_OLD_LEDGER)) and written["source"] == "s3://src/in/"
    assert written["near"]["in/new"] == ["e3", "2026-12-01T12:59:00.000000Z"]  # the layout an earlier worker reads


class _Gets:
    """The HTTP status of each GetObject and whether any ListObjectsV2 or PutObject was sent."""

    def __init__(self, client: Any) -> None:
        self.statuses: list[int] = []
        self.operations: list[str] = []
        client.meta.events.register("after-call.s3.GetObject", self._got)
        client.meta.events.register("provide-client-params.s3.*", self._sent)

    def _got(self, http_response: Any, **_: Any) -> None:
        self.statuses.append(http_response.status_code)

    def _sent(self, model: Any, **_: Any) -> None:
        self.operations.append(model.name)


def _page(acts: S3Activities, src: str, out: str, token: str | None) -> Any:
    req = ListIncrementalInput(
        bucket=src, prefix="in/", continuation_token=token, page_size=1, ledger=f"s3://{out}/led/",
        output_bucket=out, output_prefix="run/",
    )  # fmt: skip
    return ActivityEnvironment().run(acts.list_incremental, req)


def test_listing_pages_read_the_ledger_once_per_version(s3: Any, buckets: tuple[str, str]) -> None:
    """Each page asks for the ledger only if it changed (304 while it has not): not read and parsed whole per page."""
    src, out = buckets
    put_files(s3, src, {f"in/k{i}": b"x" for i in range(4)})
    s3.put_object(Bucket=out, Key="led/ledger.json", Body=Ledger(source=f"s3://{src}/in/").to_json())
    client = make_client()
    gets = _Gets(client)
    acts = S3Activities(client, Settings.explicit())
    token, keys = None, []
    for _ in range(4):
        page = _page(acts, src, out, token)
        keys += [o.key for o in page.objects]
        token = page.next_token
    assert keys == [f"in/k{i}" for i in range(4)] and token is None
    assert gets.statuses == [200, 304, 304, 304], gets.statuses

    later = Ledger(source=f"s3://{src}/in/", watermark="2999-01-01T00:00:00.000000Z")  # everything is older
    s3.put_object(Bucket=out, Key="led/ledger.json", Body=later.to_json())
    assert _page(acts, src, out, None).objects == []  # the new version is read and used
    assert gets.statuses[-1] == 200


def test_a_ledger_over_the_bound_is_refused_before_it_is_read(s3: Any, buckets: tuple[str, str]) -> None:
    """An object over ``S3BATCH_MAX_LEDGER_BYTES`` in the ledger's place is refused by its size: never parsed (it
    is not even a ledger, which reading it would have said), nothing listed, nothing written."""
    src, out = buckets
    put_files(s3, src, {"in/k": b"x"})
    s3.put_object(Bucket=out, Key="led/ledger.json", Body=b"x" * 10_000)
    client = make_client()
    gets = _Gets(client)
    acts = S3Activities(client, Settings.explicit(max_ledger_bytes=4_096))
    with pytest.raises(ApplicationError) as refused:
        _page(acts, src, out, None)
    assert refused.value.type == "InvalidInput" and refused.value.non_retryable, refused.value
    message = refused.value.message
    assert f"s3://{out}/led/ledger.json is 10,000 bytes, over this worker's bound of 4,096" in message, message
    assert "S3BATCH_MAX_LEDGER_BYTES" in message and "not an s3batch ledger" not in message
    assert gets.operations == ["GetObject"], gets.operations

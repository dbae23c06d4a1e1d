"""Jobs bigger than one listing page (500 keys) and one workflow run (500 files): a continuation
token that dropped or repeated a page, or a continue-as-new that lost a run's results, shows here as
a key missing from (or twice in) the report or the output."""

from __future__ import annotations

import collections
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from s3batch.workflows.batch import LIST_PAGE_SIZE, S3BatchWorkflow
from temporalio.client import Client
from temporalio.worker import Worker

from s3batch import layout
from s3batch.messages import S3BatchResult
from s3batch.models import S3BatchInput
from tests.helpers.data import put_files
from tests.helpers.history import history_events, scheduled_activities
from tests.helpers.output import list_keys, report


def body(i: int) -> bytes:
    return b'{"file": %d, "row": 0}\n{"file": %d, "row": 1}\n' % (i, i)


def expected_part(i: int) -> bytes:
    """The exact part a passthrough job writes for ``body(i)``."""
    return b'{"file":%d,"row":0}\n{"file":%d,"row":1}\n' % (i, i)


def read_all(s3: Any, bucket: str, keys: list[str]) -> dict[str, bytes]:
    with ThreadPoolExecutor(16) as pool:
        bodies = pool.map(lambda k: s3.get_object(Bucket=bucket, Key=k)["Body"].read(), keys)
        return dict(zip(keys, bodies, strict=True))


async def run_job(client: Client, task_queue: str, job: S3BatchInput) -> tuple[str, S3BatchResult]:
    job_id = f"pages-{uuid.uuid4().hex[:8]}"
    result = await client.execute_workflow(S3BatchWorkflow.run, job, id=job_id, task_queue=task_queue)
    return job_id, result


async def test_a_job_over_three_listing_pages_processes_each_key_exactly_once(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets: tuple[str, str]
) -> None:
    src, out = buckets
    n = 1_100  # pages of 500, 500 and 100 keys; runs of 500, 500 and 100 files (continue-as-new)
    keys = {f"many/{i:05d}.jsonl": body(i) for i in range(n)}
    put_files(s3, src, keys)

    job_id, result = await run_job(
        client, task_queue, S3BatchInput(bucket=src, prefix="many/", output_bucket=out, output_prefix="o/")
    )

    assert result.status == "succeeded"
    assert (result.totals.files_listed, result.totals.files_succeeded, result.totals.files_failed) == (n, n, 0)
    assert result.totals.records_written == 2 * n
    events = await history_events(client, job_id)
    assert scheduled_activities(events).count("s3batch.list_objects") == -(-n // LIST_PAGE_SIZE) == 3
    rep = report(s3, out, "o/")
    counted = collections.Counter(f["key"] for f in rep["files"])
    assert set(counted) == set(keys), "keys missing from the report, or not listed"
    assert [k for k, c in counted.items() if c != 1] == [], "keys reported more than once"
    assert {f["status"] for f in rep["files"]} == {"succeeded"}
    assert all((f["records"], f["records_written"], f["chunks"]) == (2, 2, 1) for f in rep["files"])

    # Exactly one part per source key, with exactly the records of that key.
    parts = {k: layout.part_key("o/", k, 0) for k in keys}
    outputs = [k for k in list_keys(s3, out, "o/") if not k.startswith("o/_")]
    assert sorted(outputs) == sorted(parts.values())
    written = read_all(s3, out, list(parts.values()))
    wrong = [k for i, k in enumerate(keys) if written[parts[k]] != expected_part(i)]
    assert wrong == [], f"{len(wrong)} files with wrong output, e.g. {wrong[:3]}"


async def test_redrive_of_more_than_a_page_of_failed_files(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets: tuple[str, str]
) -> None:
    """520 files fail (no known format: ``.data``), more than one page of the report's failed files;
    the redrive (told their format) processes each of them once and nothing else."""
    src, out = buckets
    failing = {f"rd/{i:05d}.data": body(i) for i in range(520)}
    good = {f"rd/{i:05d}.jsonl": body(i) for i in range(520, 560)}
    put_files(s3, src, {**failing, **good})
    job = S3BatchInput(bucket=src, prefix="rd/", output_bucket=out, output_prefix="o/", max_failed_files=1_000)

    _, first = await run_job(client, task_queue, job)
    assert (first.totals.files_succeeded, first.totals.files_failed) == (len(good), len(failing))
    original = report(s3, out, "o/")
    assert sorted(f["key"] for f in original["files"] if f["status"] == "failed") == sorted(failing)

    redrive = job.model_copy(update={"format": "jsonl", "only_failed_of": f"s3://{out}/o/_report.json"})
    job_id, second = await run_job(client, task_queue, redrive)

    assert second.status == "succeeded"
    assert (second.totals.files_listed, second.totals.files_succeeded) == (len(failing), len(failing))
    events = await history_events(client, job_id)
    assert scheduled_activities(events).count("s3batch.list_objects") == 2  # 500 + 20 failed files
    counted = collections.Counter(f["key"] for f in report(s3, out, "o/")["files"])
    assert counted == collections.Counter(list(failing)), "each failed file exactly once, and only those"
    parts = {k: layout.part_key("o/", k, 0) for k in failing}
    written = read_all(s3, out, list(parts.values()))
    wrong = [k for k in failing if written[parts[k]] != expected_part(int(k[3:8]))]
    assert wrong == [], f"{len(wrong)} redriven files with wrong output, e.g. {wrong[:3]}"

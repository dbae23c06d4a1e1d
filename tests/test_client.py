"""``s3batch.client`` used from Python, as a user's code would, against the real stack: start a job,
follow its progress and in-flight files, pause, resume and set its concurrency, read its outcome and
report, list it, redrive its failed file; and the errors each call raises for a job in the wrong state."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.worker import Worker

import tests.slow_handlers  # noqa: F401 - registers slow_passthrough (50 ms a chunk) for the in-process worker
from s3batch import client as api
from s3batch import layout
from s3batch.dev.sample_data import customers_csv, upload_chunks
from s3batch.errors import InvalidInput
from s3batch.models import S3BatchInput
from tests.helpers import run, wait_for


def slow_job(src: str, out: str, **kw: Any) -> S3BatchInput:
    """A job whose files take 50 ms a chunk of 50 records, one file at a time."""
    values: dict[str, Any] = {
        "bucket": src,
        "prefix": "in/",
        "output_bucket": out,
        "output_prefix": "o/",
        "handler": "slow_passthrough",
        "chunk_records": 50,
        "heartbeat_timeout_seconds": 20,
        "max_concurrent_files": 1,
        "group_max_files": 1,
    }
    return S3BatchInput(**{**values, **kw})


async def in_flight_past_record_0(client: Client, wid: str) -> api.JobView:
    """Poll ``describe`` until a file in flight has a checkpoint past record 0."""

    async def progressed() -> api.JobView | None:
        view = await api.describe(client, wid)
        assert view.status == "running", view
        return view if any(f.checkpoint and f.checkpoint.next_record > 0 for f in view.in_flight) else None

    return await wait_for(progressed, 60, f"a checkpoint past record 0 of job {wid}", interval=0.3)


async def test_a_job_is_started_followed_controlled_and_reported_from_python(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets: tuple[str, str]
):
    src, out = buckets
    # 100 chunks at 50 ms each (about five seconds in flight), then two more files.
    upload_chunks(s3, src, "in/a.csv", customers_csv(5_000, seed=1))
    for name in ("b", "c"):
        upload_chunks(s3, src, f"in/{name}.csv", customers_csv(100, seed=2))
    job = slow_job(src, out)

    started = await api.start(client, job, task_queue=task_queue)
    wid = started.workflow_id
    assert wid.startswith(f"s3batch-{src}-") and not started.already_running
    assert started.ui_url.endswith(f"/namespaces/default/workflows/{wid}")
    again = await api.start(client, job, wid, task_queue)
    assert again.already_running and again.run_id == started.run_id

    view = await in_flight_past_record_0(client, wid)
    [f] = view.in_flight
    head = s3.head_object(Bucket=src, Key="in/a.csv")
    assert f.key == "in/a.csv" and f.state == "started" and f.attempt == 1
    assert f.checkpoint is not None and f.checkpoint.etag == head["ETag"].strip('"')
    assert f.size == head["ContentLength"] and 0 < (f.fraction or 0) <= 1
    assert view.progress is not None and view.progress.in_flight == ["in/a.csv"]

    paused = await api.pause(client, wid)
    assert paused.paused and paused.max_concurrent_files == 1
    with pytest.raises(api.ReportNotFound, match="no report at"):
        await api.report(client, wid)  # not ended: no report yet
    with pytest.raises(api.ControlRejected, match=r"set_concurrency rejected.*from 1 to 1000"):
        await api.set_concurrency(client, wid, 0)
    assert (await api.set_concurrency(client, wid, 2)).max_concurrent_files == 2
    assert not (await api.resume(client, wid)).paused

    result, error = await api.outcome(client, wid)
    assert error is None and result is not None and result.status == "succeeded"
    assert result.totals.files_succeeded == 3 and result.totals.records_written == 5_200

    stored = await api.report(client, wid)
    assert stored.uri == f"s3://{out}/o/_report.json" and stored.report.job_id == wid
    assert sorted((f.key, f.status, f.records_written) for f in stored.report.files) == [
        ("in/a.csv", "succeeded", 5_000), ("in/b.csv", "succeeded", 100), ("in/c.csv", "succeeded", 100),
    ]  # fmt: skip
    done = await api.describe(client, wid)
    assert done.status == "succeeded" and done.in_flight == [] and done.result == result
    [summary] = await api.list_jobs(client, f'WorkflowId="{wid}"')
    assert (summary.status, summary.task_queue) == ("succeeded", task_queue) and summary.close_time is not None

    # Finished: controls, a restart under the same ID and a redrive are refused, saying why.
    with pytest.raises(api.JobNotRunning):
        await api.pause(client, wid)
    with pytest.raises(api.JobNotRunning, match="it ended: succeeded"):
        await api.cancel(client, wid)
    with pytest.raises(api.JobIdUsed, match="already ran") as used:
        await api.start(client, job, wid, task_queue)
    assert used.value.workflow_id == wid and used.value.run_id == started.run_id
    with pytest.raises(api.NothingToRedrive, match="no failed or cancelled files"):
        await api.prepare_redrive(client, wid)


async def test_unknown_job_ids_raise_job_not_found(client: Client):
    wid = f"no-such-job-{uuid.uuid4().hex[:8]}"
    for call in (api.describe, api.pause, api.cancel, api.report, api.prepare_redrive):
        with pytest.raises(api.JobNotFound, match=f"no job with ID '{wid}' in namespace 'default'"):
            await call(client, wid)


async def test_a_redrive_plan_takes_the_failed_file_and_keeps_the_original_report(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets: tuple[str, str]
):
    src, out = buckets
    s3.put_object(Bucket=src, Key="in/good.jsonl", Body=b'{"n": 1}\n')
    s3.put_object(Bucket=src, Key="in/bad.xml", Body=b"<n>1</n>\n")  # no reader for .xml: the file fails
    job = S3BatchInput(bucket=src, prefix="in/", output_bucket=out, output_prefix="o/", max_failed_files=1)
    wid = (await api.start(client, job, f"redrive-{uuid.uuid4().hex[:8]}", task_queue)).workflow_id
    result, _ = await api.outcome(client, wid)
    assert result is not None and (result.totals.files_succeeded, result.totals.files_failed) == (1, 1)

    with pytest.raises(api.JobIdUsed, match="already ran and is finished"):
        await api.prepare_redrive(client, wid, new_id=wid)  # the new job's ID must be unused
    plan = await api.prepare_redrive(client, wid, new_id=f"{wid}-again")
    assert [f.key for f in plan.files] == ["in/bad.xml"] and plan.counts()["failed"] == 1 and not plan.unlisted
    assert plan.task_queue == task_queue and plan.report == f"s3://{out}/o/_report.json"
    copy_key = layout.report_copy_key("o/", plan.workflow_id)
    assert plan.original_report == f"s3://{out}/{copy_key}" and plan.job.only_failed_of == plan.original_report
    assert plan.job.model_copy(update={"only_failed_of": None}) == job
    original = s3.get_object(Bucket=out, Key="o/_report.json")["Body"].read()
    assert s3.get_object(Bucket=out, Key=copy_key)["Body"].read() == original

    redrive = await api.start(client, plan.job, plan.workflow_id, plan.task_queue)
    result, _ = await api.outcome(client, redrive.workflow_id)
    assert result is not None and (result.totals.files_listed, result.totals.files_failed) == (1, 1)
    stored = await api.report(client, redrive.workflow_id)
    assert [(f.key, f.status) for f in stored.report.files] == [("in/bad.xml", "failed")]


async def test_a_report_overwritten_by_something_else_is_refused_by_name_without_a_traceback(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets: tuple[str, str]
):
    src, out = buckets
    s3.put_object(Bucket=src, Key="in/a.jsonl", Body=b'{"n": 1}\n')
    job = S3BatchInput(bucket=src, prefix="in/", output_bucket=out, output_prefix="o/")
    wid = (await api.start(client, job, f"garbled-{uuid.uuid4().hex[:8]}", task_queue)).workflow_id
    assert (await api.outcome(client, wid)).result is not None
    # --json prints the report as written (same keys, same order), read through the typed JobReport.
    written = json.loads(s3.get_object(Bucket=out, Key="o/_report.json")["Body"].read())
    as_json = await run("s3batch", "report", wid, "--json")
    assert as_json.code == 0 and as_json.stdout == json.dumps(written, indent=2) + "\n", as_json
    s3.put_object(Bucket=out, Key="o/_report.json", Body=b"not a report")

    with pytest.raises(InvalidInput, match=f"s3://{out}/o/_report.json is not an s3batch job report"):
        await api.report(client, wid)
    r = await run("s3batch", "report", wid)
    assert r.code == 8 and f"s3://{out}/o/_report.json is not an s3batch job report" in r.stderr, r
    assert "Traceback" not in r.stderr, r

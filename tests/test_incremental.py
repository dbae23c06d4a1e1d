"""Incremental jobs (issue 16): runs of one ledger process each version of each object once."""

from __future__ import annotations

import contextlib
import datetime
import json
from typing import Any

import pytest
from s3batch.activities.incremental import Ledgers, list_incremental_page
from s3batch.workflows.batch import S3BatchWorkflow
from temporalio.client import Client, WorkflowFailureError
from temporalio.worker import Worker

import tests.fault_handlers as fault_handlers
from s3batch.incremental import (
    Ledger,
    ListIncrementalInput,
    PageRecord,
    WriteLedgerInput,
    advance,
    iso,
    run_output_prefix,
)
from s3batch.models import S3BatchInput
from tests.helpers.data import put_files
from tests.helpers.jobs import new_id
from tests.helpers.output import list_keys, read_jsonl


def _job(src: str, out: str, **kw: Any) -> S3BatchInput:
    options: dict[str, Any] = {
        "prefix": "in/",
        "output_bucket": out,
        "output_prefix": "inc/",
        "handler": "explode_until_fixed",
        "max_attempts": 1,
        "incremental": {},
    }
    return S3BatchInput.model_validate({"bucket": src, **options, **kw})


def _ledger(s3: Any, out: str, prefix: str = "inc/ledger/") -> dict[str, Any]:
    return json.loads(s3.get_object(Bucket=out, Key=f"{prefix}ledger.json")["Body"].read())


def _processed(s3: Any, out: str, job_id: str) -> dict[str, list[Any]]:
    """Key -> records the run wrote, under its own output prefix."""
    run = run_output_prefix("inc/", job_id)
    rows: dict[str, list[Any]] = {}
    for key in list_keys(s3, out, run):
        if key.rsplit("/", 1)[-1].startswith("part-"):
            source = key[len(run) :].rsplit("/", 1)[0]
            rows.setdefault(source, []).extend(read_jsonl(s3, out, f"{run}{source}/"))
    return rows


async def test_three_runs_process_each_version_once(client: Client, worker: Worker, task_queue: str, s3: Any, buckets):
    src, out = buckets
    fault_handlers.BOOM_FIXED = False
    try:
        put_files(s3, src, {f"in/f{i}.jsonl": f'{{"v": "f{i}-1"}}\n'.encode() for i in range(5)})
        s3.put_object(Bucket=src, Key="in/boom.jsonl", Body=b'{"v": "BOOM"}\n')
        job = _job(src, out)  # max_failed_files 0: run 1 fails (JobFailed) on boom

        # Run 1: everything is new; boom fails (the handler cannot process it yet), and so does the run.
        first = await _run_job(client, task_queue, s3, out, job)
        assert set(first) == {f"in/f{i}.jsonl" for i in range(5)}
        ledger = _ledger(s3, out)
        assert ledger["retry"] == {"in/boom.jsonl": s3.head_object(Bucket=src, Key="in/boom.jsonl")["ETag"].strip('"')}
        assert ledger["runs"][-1]["new"] == 6

        # Between runs: two added, one overwritten, one deleted, the rest unchanged; the handler is fixed.
        s3.put_object(Bucket=src, Key="in/g0.jsonl", Body=b'{"v": "g0-1"}\n')
        s3.put_object(Bucket=src, Key="in/g1.jsonl", Body=b'{"v": "g1-1"}\n')
        s3.put_object(Bucket=src, Key="in/f2.jsonl", Body=b'{"v": "f2-2"}\n')
        s3.delete_object(Bucket=src, Key="in/f4.jsonl")
        fault_handlers.BOOM_FIXED = True
        second = await _run_job(client, task_queue, s3, out, job)
        assert second == {
            "in/g0.jsonl": [{"v": "g0-1"}],
            "in/g1.jsonl": [{"v": "g1-1"}],
            "in/f2.jsonl": [{"v": "f2-2"}],
            "in/boom.jsonl": [{"v": "BOOM"}],  # the failed run's file, picked up by the next
        }
        summary = _ledger(s3, out)["runs"][-1]
        assert (summary["changed"], summary["retried"], summary["skipped_unchanged"]) == (1, 1, 3)
        assert summary["new"] == 2 and _ledger(s3, out)["retry"] == {}

        # Run 3: nothing changed, nothing processed.
        third = await _run_job(client, task_queue, s3, out, job)
        assert third == {}
        assert _ledger(s3, out)["runs"][-1]["skipped_unchanged"] == 7
        # Every version of every object was processed exactly once over the three runs.
        versions = [r["v"] for run in (first, second, third) for rows in run.values() for r in rows]
        assert sorted(versions) == sorted(["f0-1", "f1-1", "f2-1", "f3-1", "f4-1", "f2-2", "g0-1", "g1-1", "BOOM"])
    finally:
        fault_handlers.BOOM_FIXED = False


async def _run_job(client: Client, task_queue: str, s3: Any, out: str, job: S3BatchInput) -> dict[str, list[Any]]:
    job_id = new_id("inc")
    # A run over max_failed_files fails; its report and the ledger are written all the same.
    with contextlib.suppress(WorkflowFailureError):
        await client.execute_workflow(S3BatchWorkflow.run, job, id=job_id, task_queue=task_queue)
    report_key = f"{run_output_prefix('inc/', job_id)}_report.json"
    report = json.loads(s3.get_object(Bucket=out, Key=report_key)["Body"].read())
    assert report["job_id"] == job_id
    return _processed(s3, out, job_id)


def test_object_written_during_the_listing_is_taken_once(s3: Any, buckets):
    """The race at the edge: while a run lists page by page, one object is written before the page it
    sorts into was listed (seen by this run) and one after (missed by it). The next run takes the
    missed one and not the seen one, through the ledger this run leaves."""
    src, out = buckets
    put_files(s3, src, {f"in/k{i:02d}": b"x" for i in range(6)})
    written: dict[str, bytes] = {}

    def put(bucket: str, key: str, body: bytes) -> None:
        written[key] = body
        s3.put_object(Bucket=bucket, Key=key, Body=body)

    def page(token: str | None, prefix: str, ledger: str) -> tuple[list[str], str | None]:
        req = ListIncrementalInput(
            bucket=src, prefix="in/", continuation_token=token, page_size=3, ledger=ledger, window_seconds=60,
            output_bucket=out, output_prefix=prefix,
        )
        result = list_incremental_page(s3, req, put, Ledgers())
        return [o.key for o in result.objects], result.next_token

    ledger_uri = f"s3://{out}/ledger/"
    keys, token = page(None, "run1/", ledger_uri)
    s3.put_object(Bucket=src, Key="in/k00a", Body=b"late")  # sorts into the page already listed: missed
    s3.put_object(Bucket=src, Key="in/k04a", Body=b"seen")  # sorts into the next page: seen now
    while token is not None:
        more, token = page(token, "run1/", ledger_uri)
        keys += more
    assert "in/k00a" not in keys and "in/k04a" in keys and len(keys) == 7

    pages = [PageRecord.model_validate_json(body) for body in written.values()]
    req = WriteLedgerInput(
        ledger=ledger_uri, run_id="run1", source=f"s3://{src}/in/", window_seconds=60, output_bucket=out,
        output_prefix="run1/", report_key="run1/_report.json", status="succeeded", listing_done=True,
    )
    statuses = {key: ("succeeded", etag) for p in pages for key, etag, _, _ in p.taken}
    ledger = advance(Ledger(), req, pages, statuses)
    s3.put_object(Bucket=out, Key="ledger/ledger.json", Body=ledger.to_json())
    assert advance(Ledger(), req, pages, statuses).to_json() == ledger.to_json()  # same run, same bytes

    written.clear()
    keys, token = page(None, "run2/", ledger_uri)
    while token is not None:
        more, token = page(token, "run2/", ledger_uri)
        keys += more
    assert keys == ["in/k00a"]
    assert Ledgers().read(s3, ledger_uri)[0].watermark == ledger.watermark


@pytest.mark.parametrize("runs", [50])
def test_ledger_stays_bounded(runs: int):
    """50 runs over 10,000 objects, 200 new ones per run: the ledger holds only the objects of one
    window before the watermark (and the last 20 runs' summaries), not the 10,000."""
    start = datetime.datetime(2026, 12, 1, tzinfo=datetime.UTC)
    ledger = Ledger()
    sizes = []
    for run in range(runs):
        listed_at = start + datetime.timedelta(hours=run + 1)
        taken = []
        for i in range(10_000 if run == 0 else 200):
            key = f"in/{run:03d}/{i:05d}"
            modified = listed_at - datetime.timedelta(seconds=(i % 1800) + 1)  # spread over the last half hour
            if ledger.kind("s", key, "e", modified) is not None:
                taken.append((key, "e", iso(modified), "new"))
        page = PageRecord(ledger_etag=None, listed_at=iso(listed_at), taken=taken)
        req = WriteLedgerInput(
            ledger="s3://l/", run_id=f"r{run}", source="s3://s/in/", window_seconds=900, output_bucket="o",
            output_prefix=f"r{run}/", report_key="r", status="succeeded", listing_done=True,
        )
        ledger = advance(ledger, req, [page], {t[0]: ("succeeded", "e") for t in taken})
        sizes.append(len(ledger.to_json()))
    assert len(ledger.runs) == 20 and ledger.totals["runs"] == runs
    assert sizes[0] > 200_000  # the first run remembers its objects of the last 15 minutes (half of them)
    assert len(ledger.near) == 200  # afterwards: the last run's objects, all within its window
    assert max(sizes[1:]) < 40_000 and sizes[-1] - sizes[25] < 2_000, sizes


async def test_run_resumes_across_continue_as_new(client: Client, worker: Worker, task_queue: str, s3: Any, buckets):
    """A first run over a prefix continues as new (2 files per run here) like any job: every run of it
    writes under the same run prefix (from the job as given, not prefixed again), and the ledger records all."""
    src, out = buckets
    put_files(s3, src, {f"in/c{i}.jsonl": f'{{"c": {i}}}\n'.encode() for i in range(5)})
    job = _job(src, out, handler="passthrough", group_max_files=1)
    job_id = new_id("inc-can")
    handle = await client.start_workflow(
        S3BatchWorkflow.run, args=[job, {"files_per_run": 2}], id=job_id, task_queue=task_queue
    )
    result = await handle.result()
    assert result.totals.files_succeeded == 5
    assert (await client.get_workflow_handle(job_id).describe()).run_id != handle.run_id  # it continued as new
    assert sorted(_processed(s3, out, job_id)) == [f"in/c{i}.jsonl" for i in range(5)]
    ledger = _ledger(s3, out)
    assert ledger["last_run"] == job_id and ledger["runs"][-1]["new"] == 5 and len(ledger["near"]) == 5
    assert not [k for k in list_keys(s3, out, "inc/runs/") if "/runs/" in k[len("inc/runs/") :]]


async def test_a_second_workflow_of_one_job_id_is_refused_before_it_lists(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets
):
    """A job ID started again once its workflow closed (``temporal schedule backfill`` over a tick that already
    ran, or ``temporal workflow start`` with the same ID) fails at its first listing page, naming the earlier
    run: it would write into that run's output folder (its report overwritten) and its ledger write would be
    taken for that run's retry and record nothing, so the next run would process its files a second time."""
    src, out = buckets
    put_files(s3, src, {f"in/a{i}.jsonl": f'{{"v": "a{i}"}}\n'.encode() for i in range(2)})
    job = _job(src, out, handler="passthrough")
    job_id = new_id("inc-twice")
    await client.execute_workflow(S3BatchWorkflow.run, job, id=job_id, task_queue=task_queue)
    report_key = f"{run_output_prefix('inc/', job_id)}_report.json"
    report = s3.get_object(Bucket=out, Key=report_key)["Body"].read()
    ledger = _ledger(s3, out)
    assert ledger["last_run"] == job_id and ledger["last_execution"] and ledger["runs"][-1]["execution"]

    s3.put_object(Bucket=src, Key="in/b.jsonl", Body=b'{"v": "b"}\n')
    with pytest.raises(WorkflowFailureError) as failed:
        await client.execute_workflow(S3BatchWorkflow.run, job, id=job_id, task_queue=task_queue)
    message = str(failed.value.cause.cause if failed.value.cause.cause else failed.value.cause)
    assert f"job {job_id!r} already ran on the ledger" in message and "Nothing was listed or processed" in message
    assert s3.get_object(Bucket=out, Key=report_key)["Body"].read() == report  # the first run's report kept
    assert _ledger(s3, out) == ledger
    assert sorted(_processed(s3, out, job_id)) == ["in/a0.jsonl", "in/a1.jsonl"]

    later = await _run_job(client, task_queue, s3, out, job)  # a new ID takes what the refused start did not
    assert later == {"in/b.jsonl": [{"v": "b"}]}


async def test_cancelled_run_leaves_the_rest_to_the_next(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets
):
    """A run cancelled midway records the files it finished; the next run processes exactly the others."""
    import tests.slow_handlers  # noqa: F401  (registers slow_passthrough)
    from tests.helpers.data import make_csv
    from tests.helpers.jobs import until

    src, out = buckets
    put_files(s3, src, {f"in/s{i}.csv": make_csv(1000) for i in range(6)})
    job = _job(src, out, handler="slow_passthrough", chunk_records=100, group_max_files=1, max_concurrent_files=1)
    first_id = new_id("inc-cancel")
    handle = await client.start_workflow(S3BatchWorkflow.run, job, id=first_id, task_queue=task_queue)
    await until(lambda p: p.files_succeeded >= 2, handle)
    await handle.cancel()
    await wait_for_end(handle)
    report_key = f"{run_output_prefix('inc/', first_id)}_report.json"
    report = json.loads(s3.get_object(Bucket=out, Key=report_key)["Body"].read())
    succeeded = {f["key"] for f in report["files"] if f["status"] == "succeeded"}
    ledger = _ledger(s3, out)
    assert report["status"] == "cancelled" and len(succeeded) >= 2
    assert set(ledger["near"]) == succeeded and set(ledger["retry"]) == {f"in/s{i}.csv" for i in range(6)} - succeeded
    second = await _run_job(client, task_queue, s3, out, job.model_copy(update={"handler": "passthrough"}))
    assert set(second) == set(ledger["retry"])  # exactly the files the cancelled run did not finish
    assert _ledger(s3, out)["retry"] == {}


async def wait_for_end(handle: Any) -> None:
    with contextlib.suppress(Exception):
        await handle.result()


def test_write_ledger_is_idempotent_and_refuses_a_ledger_changed_meanwhile(s3: Any, buckets):
    from s3batch.activities.incremental import write_ledger

    from s3batch.errors import SourceChanged

    _, out = buckets
    uri = f"s3://{out}/led/"

    def put_ledger(bucket: str, key: str, body: bytes, etag: str | None) -> None:
        condition = {"IfMatch": f'"{etag}"'} if etag else {"IfNoneMatch": "*"}
        s3.put_object(Bucket=bucket, Key=key, Body=body, **condition)

    def run_files(run: str, ledger_etag: str | None) -> WriteLedgerInput:
        page = PageRecord(ledger_etag=ledger_etag, listed_at="2026-12-01T12:00:00.000000Z",
                          taken=[("in/a", "e1", "2026-12-01T11:59:00.000000Z", "new")])
        s3.put_object(Bucket=out, Key=f"{run}/_s3batch/incremental/page-first.json", Body=page.model_dump_json())
        s3.put_object(Bucket=out, Key=f"{run}/_report.json", Body=json.dumps(
            {"files": [{"key": "in/a", "etag": "e1", "status": "succeeded"}]}))
        return WriteLedgerInput(ledger=uri, run_id=run, source="s3://s/in/", output_bucket=out,
                                output_prefix=f"{run}/", report_key=f"{run}/_report.json", status="succeeded",
                                listing_done=True)

    req = run_files("r1", None)
    write_ledger(s3, req, put_ledger, Ledgers())
    body = s3.get_object(Bucket=out, Key="led/ledger.json")["Body"].read()
    write_ledger(s3, req, put_ledger, Ledgers())  # a retry of the same run: nothing changes
    assert s3.get_object(Bucket=out, Key="led/ledger.json")["Body"].read() == body
    assert json.loads(body)["near"] == {"in/a": ["e1", "2026-12-01T11:59:00.000000Z"]}

    stale = run_files("r2", None)  # cut with no ledger, but r1 wrote one meanwhile
    with pytest.raises(SourceChanged, match="changed while job 'r2' ran"):
        write_ledger(s3, stale, put_ledger, Ledgers())
    assert s3.get_object(Bucket=out, Key="led/ledger.json")["Body"].read() == body


def test_a_ledger_names_an_earlier_workflow_of_the_same_job_id_only_when_both_say_theirs() -> None:
    """``Ledger.ran_before``: another workflow of the job ID in the last run or in the kept summaries; never for
    the same workflow (its retry, or a later run of its continue-as-new chain), nor where the ledger (written
    by an earlier version) or the job (an earlier version's workflow) does not record one."""
    summary = {"run": "job-a", "execution": "E1", "report": "s3://out/inc/runs/job-a/_report.json"}
    ledger = Ledger(last_run="job-b", last_execution="E9", runs=[summary, {"run": "job-b", "execution": "E9"}])
    assert ledger.ran_before("job-a", "E2") == summary
    assert ledger.ran_before("job-a", "E1") is None
    assert ledger.ran_before("job-a", None) is None
    assert ledger.ran_before("job-b", "E3") == {"run": "job-b", "execution": "E9"}
    assert ledger.ran_before("job-c", "E4") is None
    legacy = Ledger(last_run="job-a", runs=[{"run": "job-a"}])
    assert legacy.ran_before("job-a", "E2") is None

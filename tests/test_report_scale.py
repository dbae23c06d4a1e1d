"""The report of a big job: written from the segments of its runs with memory bounded whatever the
number of files (``s3batch.report_store.final_report`` and ``put_report``), complete and exact, its books
still checked, and read by ``s3batch report`` and redrive as before (same format, same bytes)."""

from __future__ import annotations

import json
import tracemalloc
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from s3batch.activities.s3_activities import S3Activities
from s3batch.workflows.batch import S3BatchWorkflow
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment
from temporalio.worker import Worker

from s3batch import layout
from s3batch.accounting import key_digest
from s3batch.client import prepare_redrive
from s3batch.errors import ACCOUNTING_ERROR, S3Error
from s3batch.messages import FileResult, FinalReportInput, ListObjectsInput, ListObjectsResult, ReasonCount, Totals
from s3batch.models import JobSpec, S3BatchInput
from s3batch.report import parse_report
from s3batch.report_store import final_report, put_report, segment_body
from s3batch.s3io import make_client
from tests.helpers import run, untraced
from tests.helpers.data import put_files
from tests.helpers.jobs import new_id

MB = 1_000_000


def _result(i: int, status: str = "succeeded") -> FileResult:
    return FileResult(
        key=f"in/{i:07d}.csv",
        etag="0123456789abcdef0123456789abcdef",
        status=status,  # type: ignore[arg-type]
        records=1,
        records_written=1,
        bytes_read=100,
        chunks=1,
    )


def _final(out: str, files: list[FileResult], totals: Totals, **kw: Any) -> FinalReportInput:
    return FinalReportInput(
        job_id="job-scale",
        job=JobSpec(bucket="src", prefix="in/", output_bucket=out, output_prefix="o/"),
        status="succeeded",
        totals=totals,
        files=files,
        **{"segments": 0, **kw},
    )


def _put_segments(s3: Any, out: str, segments: list[list[FileResult]]) -> None:
    def put(n: int) -> None:
        s3.put_object(Bucket=out, Key=layout.segment_key("o/", n), Body=segment_body(segments[n]))

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(put, range(len(segments))))


def _report_body(s3: Any, out: str) -> bytes:
    return s3.get_object(Bucket=out, Key=layout.report_key("o/"))["Body"].read()


# ------------------------------------------------------------------------------ same bytes as before


@pytest.mark.parametrize("files", [0, 1, 3], ids=["no-file", "one-file", "three-files"])
def test_the_streamed_report_is_the_bytes_of_the_whole_report(files: int) -> None:
    """The writer streams the report, yet writes exactly ``JobReport.to_json()`` of the whole report
    (what it wrote before): same keys, order and indentation, reject fields and warnings included."""
    results = [_result(i) for i in range(files)]
    if results:
        results[0] = results[0].model_copy(
            update={"rejected": 1, "reject_ratio": 0.5, "reject_reasons": [ReasonCount(reason="bad \u00e9", count=1)]}
        )
        odd = {"warnings": ["looks like ';'-separated"], "key": "in/\u00e9\n.csv", "error": "Bad\"File\" \\ \t"}
        results[-1] = results[-1].model_copy(update=odd)
    totals = Totals(files_listed=files, files_succeeded=files)
    segment = [r.model_dump(mode="json") for r in results[:1]]
    req = _final("out", results[1:], totals, listed_digest=key_digest(r.key for r in results))
    body = b"".join(final_report(req, lambda: segment).chunks())
    written = json.loads(body)
    assert [f["key"] for f in written["files"]] == [r.key for r in results]
    assert parse_report(body, "s3://out/o/_report.json").to_json() == body  # i.e. JobReport.to_json() of it
    assert body == json.dumps(written, indent=1).encode()
    assert ("warnings" in written) == (files == 0)  # the empty prefix's warning
    assert b"s3batch-files-" not in body  # the marker the summary's JSON is split at


def test_a_report_over_one_part_is_uploaded_in_parts_with_the_same_bytes(s3: Any, buckets: tuple[str, str]) -> None:
    chunks = [bytes([65 + i % 26]) * 1_000_003 for i in range(13)]  # 13 MB: two 6 MB parts, then 1 MB
    put_report(s3, buckets[1], "o/_report.json", chunks, {}, part_bytes=5 * 1024 * 1024)
    head = s3.head_object(Bucket=buckets[1], Key="o/_report.json")
    assert head["ETag"].endswith('-3"')  # a multipart upload of three parts
    assert _report_body(s3, buckets[1]) == b"".join(chunks)
    assert not s3.list_multipart_uploads(Bucket=buckets[1]).get("Uploads")


# ------------------------------------------------------------------------------ bounded memory


@pytest.mark.timeout(900)  # CPU-bound under tracemalloc: half a minute alone, minutes beside the parallel suite
def test_the_report_of_200000_files_is_written_with_bounded_memory(s3: Any, buckets: tuple[str, str]) -> None:
    """200,000 file results in 100 segments: the writer holds one segment and one upload part, not the
    files (a list of them alone would take hundreds of MB), and the report is complete and exact."""
    with untraced():  # a measurement over 200,000 entries: the smaller tests cover the same code
        _write_the_report_of_200000_files(s3, buckets[1])


def _write_the_report_of_200000_files(s3: Any, out: str) -> None:
    per, count = 2_000, 100
    _put_segments(s3, out, [[_result(n * per + i) for i in range(per)] for n in range(count)])
    files = per * count
    keys = [f"in/{i:07d}.csv" for i in range(files)]
    totals = Totals(files_listed=files, files_succeeded=files)
    req = _final(out, [], totals, segments=count, listed_digest=key_digest(keys))
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        key = ActivityEnvironment().run(S3Activities(s3).write_report, req)
        _, writer_peak = tracemalloc.get_traced_memory()
        # What holding the files would cost: one segment's entries as dicts, times the segments.
        tracemalloc.reset_peak()
        before, _ = tracemalloc.get_traced_memory()
        one_segment = [json.loads(line) for line in segment_body([_result(i) for i in range(per)]).splitlines()]
        held = (tracemalloc.get_traced_memory()[0] - before) * count
    finally:
        tracemalloc.stop()
    del one_segment
    assert key == "o/_report.json"
    assert writer_peak < 50 * MB, f"the report writer peaked at {writer_peak / MB:.0f} MB"
    assert held > 4 * writer_peak, (held, writer_peak)  # bounded: far below what the files take
    head = s3.head_object(Bucket=out, Key=key)
    assert head["ContentLength"] > 50 * MB and head["ETag"].endswith('"') and "-" in head["ETag"]  # in parts
    written = json.loads(_report_body(s3, out))
    assert written["status"] == "succeeded" and "accounting_errors" not in written
    assert [f["key"] for f in written["files"]] == keys
    assert written["files"][-1] == _result(files - 1).model_dump(mode="json")


# ------------------------------------------------------------------------------ the books, streamed


def test_segments_that_do_not_add_up_to_the_totals_fail_loudly(s3: Any, buckets: tuple[str, str]) -> None:
    """A key repeated in a later segment in place of one lost (the count still right): the books fail
    with AccountingError, and the report written says why (the repeat found by a second pass)."""
    out = buckets[1]
    segments = [[_result(n * 10 + i) for i in range(10)] for n in range(3)]
    segments[2][4] = _result(3)  # in/0000024.csv lost, in/0000003.csv twice
    _put_segments(s3, out, segments)
    listed = key_digest(f"in/{i:07d}.csv" for i in range(30))
    req = _final(out, [], Totals(files_listed=30, files_succeeded=30), segments=3, listed_digest=listed)
    with pytest.raises(ApplicationError) as failure:
        ActivityEnvironment().run(S3Activities(s3).write_report, req)
    err = failure.value
    assert err.type == ACCOUNTING_ERROR and err.non_retryable
    assert "1 key(s) appear more than once in the report" in err.message
    assert "the report's keys are not the keys the job listed" in err.message
    written = json.loads(_report_body(s3, out))
    assert written["status"] == "failed"
    assert written["accounting_errors"] == [
        "1 key(s) appear more than once in the report",
        "the report's keys are not the keys the job listed",
    ]
    assert len(written["files"]) == 30


def test_a_segment_short_of_a_file_fails_the_counts(s3: Any, buckets: tuple[str, str]) -> None:
    out = buckets[1]
    _put_segments(s3, out, [[_result(i) for i in range(5)], [_result(i) for i in range(5, 9)]])
    req = _final(
        out,
        [_result(10, "failed")],
        Totals(files_listed=11, files_succeeded=10, files_failed=1),
        segments=2,
        listed_digest=key_digest(f"in/{i:07d}.csv" for i in range(11)),
    )
    with pytest.raises(ApplicationError) as failure:
        ActivityEnvironment().run(S3Activities(s3).write_report, req)
    assert failure.value.type == ACCOUNTING_ERROR
    assert parse_report(_report_body(s3, out), "report").accounting_errors == [
        "the report lists 10 files, but the job listed 11",
        "the report has 9 succeeded files, the totals say 10",
        "the report's keys are not the keys the job listed",
    ]


def test_files_that_change_between_the_books_and_the_writing_leave_no_report(s3: Any, buckets: tuple[str, str]) -> None:
    """The writer counts the files again as it writes them: a segment that changed since the books
    were checked fails the write (retryable) before the upload completes, and no part is left open."""
    out = buckets[1]
    files = 20_000  # over one 5 MiB part: the multipart upload is started, then aborted
    read = [[_result(i).model_dump(mode="json") for i in range(files)]]
    changed = [*read[0][:-1], _result(files - 1, "failed").model_dump(mode="json")]
    reads = iter([read[0], changed])
    listed = key_digest(f["key"] for f in read[0])
    req = _final(out, [], Totals(files_listed=files, files_succeeded=files), segments=1, listed_digest=listed)
    report = final_report(req, lambda: next(reads))
    assert report.head.status == "succeeded"  # as counted the first time
    with pytest.raises(S3Error, match="changed while the report was written"):
        put_report(s3, out, "o/_report.json", report.chunks(), {}, part_bytes=5 * 1024 * 1024)
    assert s3.list_objects_v2(Bucket=out, Prefix="o/_report.json")["KeyCount"] == 0
    assert not s3.list_multipart_uploads(Bucket=out).get("Uploads")


# ------------------------------------------------------------------------------ a real job of many runs


FILES, BAD, PER_RUN = 3_000, 4, 100


async def test_a_job_of_3000_files_over_30_runs_reports_each_once_and_redrives(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets: tuple[str, str]
) -> None:
    """3,000 small objects, 100 files per run (30 runs, 29 segments and the last run's files): the
    report holds each file once with its outcome, ``s3batch report`` reads it, and a redrive takes
    exactly the files that failed."""
    src, out = buckets
    bad = {f"in/{i:05d}.csv.gz" for i in range(0, FILES, FILES // BAD)}  # not gzip: each fails for good
    keys = sorted({f"in/{i:05d}.csv" for i in range(FILES)} - {k.removesuffix(".gz") for k in bad} | bad)

    put_files(s3, src, {key: b"id,name\r\n1,%s\r\n" % key.encode() for key in keys})
    job = S3BatchInput(bucket=src, prefix="in/", output_bucket=out, output_prefix="o/", max_failed_files=BAD)
    wid = new_id("scale")
    handle = await client.start_workflow(
        S3BatchWorkflow.run, args=[job, {"files_per_run": PER_RUN}], id=wid, task_queue=task_queue
    )
    result = await handle.result()
    assert result.status == "succeeded", result
    assert result.totals.files_succeeded == FILES - BAD and result.totals.files_failed == BAD
    segments = s3.list_objects_v2(Bucket=out, Prefix=layout.segment_key("o/", 0)[: -len("00000.jsonl")])
    assert segments["KeyCount"] >= FILES // PER_RUN - 1

    body = _report_body(s3, out)
    report = parse_report(body, "report")
    assert report.to_json() == body
    assert sorted(f.key for f in report.files) == keys  # each once (in the order the runs finished them)
    assert {f.key for f in report.files if f.status == "failed"} == bad
    assert report.totals.files_listed == FILES and not report.accounting_errors

    shown = await run("s3batch", "report", wid, "--json")
    assert shown.code == 0, shown
    assert json.loads(shown.stdout) == json.loads(body)
    table = await run("s3batch", "report", wid)
    assert table.code == 0 and all(key in table.stdout for key in bad), table

    plan = await prepare_redrive(client, wid, f"{wid}-again")
    assert sorted(f.key for f in plan.files) == sorted(bad) and not plan.unlisted
    copied = s3.get_object(Bucket=out, Key=layout.report_copy_key("o/", plan.workflow_id))["Body"].read()
    assert copied == body  # the redrive reads its files from this copy


def test_a_redrive_reads_its_report_once_not_once_a_page(s3: Any, buckets: tuple[str, str]) -> None:
    """Each listing page of a redrive used to GET and parse the whole report: quadratic in the files to
    redrive. The worker keeps the plan by report version: one GET for all pages, a HEAD each page, and
    a report replaced meanwhile (another version) is read again."""
    src, out = buckets
    failed = [_result(i, "failed") for i in range(1_200)]
    report = {"job_id": "j", "status": "failed", "input": {"bucket": src, "output_bucket": out}}
    key = "o/_s3batch/redrive-of-j.json"
    s3.put_object(Bucket=out, Key=key, Body=json.dumps({**report, "files": [f.model_dump() for f in failed]}))
    counted = make_client()
    calls: list[str] = []
    counted.meta.events.register("before-call.s3.*", lambda event_name, **_: calls.append(event_name.split(".")[-1]))
    activities = S3Activities(counted)
    env = ActivityEnvironment()

    def page(token: str | None) -> ListObjectsResult:
        req = ListObjectsInput(bucket=src, prefix="in/", report=f"s3://{out}/{key}", continuation_token=token)
        return env.run(activities.list_objects, req)

    listed: list[str] = []
    token: str | None = None
    for _ in range(3):
        result = page(token)
        listed += [o.key for o in result.objects]
        token = result.next_token
    assert token is None and listed == [f.key for f in failed]  # pages of 500, 500 and 200, in order
    assert calls.count("GetObject") == 1
    assert calls.count("HeadObject") == 3 + len(failed)  # the report each page, each file (gone: "deleted")

    # Another version of the report (other failed files): the next page reads it.
    s3.put_object(Bucket=out, Key=key, Body=json.dumps({**report, "files": [f.model_dump() for f in failed[:2]]}))
    assert [o.key for o in page(None).objects] == [f.key for f in failed[:2]]
    assert calls.count("GetObject") == 2

"""Thresholds on rejects (issue 17), against the real SeaweedFS and Temporal dev server.

A file that is mostly rejects fails (``TooManyRejects``) at the chunk boundary where it crossed its
limit, keeping what it committed; under its limits it succeeds with a warning a person sees (the
report, the CLI; without limits a file whose every record is rejected fails: tests/test_all_rejected.py); a
``;``-separated file read as ``,`` gets the delimiter hint; the job's own limit
fails the job with the counts; and the counts and reasons survive a crash and resume.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest
from rich.console import Console
from s3batch.activities.s3_activities import S3Activities
from s3batch.workflows.status import details, job_progress
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment
from temporalio.worker import Worker

from s3batch import layout
from s3batch.checkpoint import Checkpoint
from s3batch.cli.render import print_view
from s3batch.cli.watch import watch_renderable
from s3batch.client.views import JobView
from s3batch.formats.common import Record
from s3batch.handlers import HandlerResult, Reject, chunk_handler, record_handler
from s3batch.messages import FileResult, JobState, ObjectRef, ProcessFileInput, Progress
from s3batch.models import S3BatchInput
from s3batch.rejects import HANDLER_REASON, RATIO_MIN_RECORDS, reason_key, with_job_warnings
from tests.helpers import run
from tests.helpers.jobs import execute, new_id
from tests.helpers.output import committed_parts, report

OUT = "o/"
MARKER = "SECRET-MARKER-17"
"""In every record: it must never reach an error, a reason, a warning or a checkpoint."""
HEADER = "customer_id,email,name,country,amount,created_at"
EMAIL_REASON = "email: String should match pattern '^[^@\\s]+@[^@\\s]+\\.[^@\\s]+$'"


def customers_csv(rows: int, bad: Any = lambda i: True) -> bytes:
    """A customers CSV; rows where ``bad(i)`` have an invalid email (with the marker in it), every
    fifth bad row also an invalid country."""
    lines = [HEADER]
    for i in range(rows):
        email = f"{MARKER}-{i}" if bad(i) else f"c{i}@example.com"
        country = "france" if bad(i) and i % 5 == 0 else "FR"
        lines.append(f"{i + 1},{email},Name {i},{country},1.00,2024-01-02T03:04:05Z")
    return ("\n".join(lines) + "\n").encode()


def upload(s3: Any, bucket: str, key: str, body: bytes) -> ObjectRef:
    s3.put_object(Bucket=bucket, Key=key, Body=body)
    head = s3.head_object(Bucket=bucket, Key=key)
    return ObjectRef(key=key, etag=head["ETag"].strip('"'), size=len(body))


def file_input(buckets: tuple[str, str], obj: ObjectRef, **options: Any) -> ProcessFileInput:
    src, out = buckets
    fields: dict[str, Any] = {"handler": "customers", "chunk_records": 100, "format": "auto"}
    fields.update(options)
    return ProcessFileInput(
        job_id="job-rejects", bucket=src, obj=obj, output_bucket=out, output_prefix=OUT,
        max_record_bytes=1024 * 1024, **fields,
    )  # fmt: skip


class Crash(Exception):
    """Stands for the worker dying right after a heartbeat."""


def attempt(
    s3: Any, req: ProcessFileInput, *, number: int = 1, details: list[Any] | None = None, crash_at: int | None = None
) -> tuple[FileResult | None, list[dict[str, Any]]]:
    """One attempt of ``process_file`` (a fresh ``activity.info()``, the last heartbeat as plain JSON);
    with ``crash_at``, the worker dies right after heartbeating that chunk's checkpoint."""
    beats: list[dict[str, Any]] = []
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, attempt=number, heartbeat_details=details or [])

    def on_heartbeat(*d: Any) -> None:
        beats.append(json.loads(d[0].model_dump_json()))
        if crash_at is not None and beats[-1]["chunk"] == crash_at:
            raise Crash("killed")

    env.on_heartbeat = on_heartbeat
    try:
        return env.run(S3Activities(s3).process_file, req), beats
    except ApplicationError as err:
        if err.type != "Crash":
            raise
        return None, beats


def expected_reasons(body: bytes) -> dict[str, int]:
    """The reasons of the rejects of ``body`` (a customers CSV), as the report counts them."""
    counts: Counter[str] = Counter()
    for line in body.decode().splitlines()[1:]:
        email_bad, country_bad = MARKER in line, ",france," in line
        if email_bad and country_bad:
            counts[reason_key(f"{EMAIL_REASON}; country: String should match pattern '^[A-Z]{{2}}$'")] += 1
        elif email_bad:
            counts[EMAIL_REASON] += 1
    return dict(counts)


def no_marker(*texts: Any) -> None:
    for text in texts:
        assert MARKER not in json.dumps(text, default=str), text


# ------------------------------------------------------------------------------------- one file


def test_all_invalid_rows_over_the_ratio_fail_at_the_boundary_that_crossed_it(
    s3: Any, buckets: tuple[str, str]
) -> None:
    src, out = buckets
    obj = upload(s3, src, "in/customers.csv", customers_csv(2500))
    with pytest.raises(ApplicationError) as failure:
        attempt(s3, file_input(buckets, obj, max_rejected_ratio=0.5))
    err = failure.value
    assert err.type == "TooManyRejects" and err.non_retryable
    # 100 % rejects from the first chunk on; the ratio is enforced once 1,000 records were read, so
    # the file stops right after the chunk that reached them: chunks 0-9 committed, nothing more.
    crossing_chunk = RATIO_MIN_RECORDS // 100 - 1
    parts = committed_parts(s3, out, layout.file_dir(OUT, obj.key))
    assert [cp.chunk for cp in parts] == list(range(1, crossing_chunk + 2))
    assert parts[-1].rejected == parts[-1].next_record == RATIO_MIN_RECORDS and not parts[-1].done
    assert f"s3://{src}/in/customers.csv: 1000 of the 1000 records read were rejected (100.0%)" in err.message
    assert "over max_rejected_ratio=0.5" in err.message and EMAIL_REASON in err.message
    assert f"its 10 committed parts and rejects under s3://{out}/{OUT}in/customers.csv/ are kept" in err.message
    detail = err.details[0]
    assert (detail["records"], detail["rejected"], detail["chunks"], detail["reject_ratio"]) == (1000, 1000, 10, 1.0)
    assert sum(r["count"] for r in detail["reject_reasons"]) == 1000
    no_marker(err.message, detail, [cp.model_dump() for cp in parts])


def test_a_count_limit_crossed_in_the_first_chunk_commits_that_chunk_only(s3: Any, buckets: tuple[str, str]) -> None:
    src, out = buckets
    obj = upload(s3, src, "in/customers.csv", customers_csv(500, lambda i: i % 2 == 0))
    with pytest.raises(ApplicationError) as failure:
        attempt(s3, file_input(buckets, obj, max_rejected_records=40))
    assert failure.value.type == "TooManyRejects"
    assert "50 of the 100 records read were rejected (50.0%), over max_rejected_records=40" in failure.value.message
    assert [cp.chunk for cp in committed_parts(s3, out, layout.file_dir(OUT, obj.key))] == [1]


def test_under_its_limits_a_file_succeeds_with_its_ratio_and_reasons(s3: Any, buckets: tuple[str, str]) -> None:
    src, _ = buckets
    body = customers_csv(1500, lambda i: i % 10 == 3)  # 10 % rejected: at the warning line, not over it
    obj = upload(s3, src, "in/customers.csv", body)
    result, _ = attempt(s3, file_input(buckets, obj, max_rejected_ratio=0.1, max_rejected_records=150))
    assert result is not None and result.status == "succeeded"
    assert (result.rejected, result.reject_ratio, result.warnings) == (150, 0.1, None)
    assert {r.reason: r.count for r in result.reject_reasons or []} == expected_reasons(body)


def test_counts_and_reasons_survive_a_crash_and_resume_from_heartbeat_or_parts(
    s3: Any, buckets: tuple[str, str]
) -> None:
    src, _ = buckets
    body = customers_csv(1000, lambda i: i % 3 == 0)
    objs = [upload(s3, src, key, body) for key in ("in/a.csv", "in/b.csv")]
    beats_of = {}
    for obj in objs:
        first, beats = attempt(s3, file_input(buckets, obj, max_rejected_records=400), crash_at=6)
        assert first is None and beats[-1]["chunk"] == 6 and beats[-1]["reject_reasons"]
        beats_of[obj.key] = beats
    # a.csv resumed from its last heartbeat, b.csv from an old one (the parts' checkpoints carry the rest).
    a, b = objs
    old = [beat for beat in beats_of[b.key] if beat["chunk"] == 2][-1]
    for obj, hint in ((a, [beats_of[a.key][-1]]), (b, [old])):
        result, _ = attempt(s3, file_input(buckets, obj, max_rejected_records=400), number=2, details=hint)
        assert result is not None and result.resumed_from_record == 600
        assert result.rejected == body.count(MARKER.encode()) == 334
        assert {r.reason: r.count for r in result.reject_reasons or []} == expected_reasons(body)
        assert result.warnings and result.warnings[0].startswith("33.4% of its records were rejected (334 of 1000;")
        no_marker(result.model_dump())
    # The same file again, complete, under a lower limit (a redrive): it fails on its final counts.
    with pytest.raises(ApplicationError) as failure:
        attempt(s3, file_input(buckets, a, max_rejected_records=250), number=3, details=[beats_of[a.key][-1]])
    assert "334 of the 1000 records read were rejected" in failure.value.message
    # A lower limit crossed after a resume counts the rejects of before the crash too.
    c = upload(s3, src, "in/c.csv", body)
    _, beats = attempt(s3, file_input(buckets, c, max_rejected_records=400), crash_at=6)
    with pytest.raises(ApplicationError) as failure:
        attempt(s3, file_input(buckets, c, max_rejected_records=250), number=2, details=[beats[-1]])
    assert "267 of the 800 records read were rejected" in failure.value.message


@pytest.mark.parametrize(("delimiter", "option"), [(";", '"delimiter": ";"'), ("\t", '"delimiter": "\\t"')])
def test_a_file_with_another_delimiter_read_as_comma_gets_the_hint(
    s3: Any, buckets: tuple[str, str], delimiter: str, option: str
) -> None:
    src, _ = buckets
    rows = [delimiter.join(["id", "name", "city"])]
    rows += [delimiter.join([str(i), f"Name {i}", "Lyon"]) for i in range(300)]
    obj = upload(s3, src, "in/export.csv", ("\n".join(rows) + "\n").encode())
    result, beats = attempt(s3, file_input(buckets, obj, handler="passthrough", chunk_records=20))
    assert result is not None and result.status == "succeeded" and result.rejected == 0
    assert result.warnings == [
        f"its CSV header is one column whose name contains {delimiter!r}, and its data lines split evenly on it: "
        f"the file looks {delimiter!r}-separated, read as ','-separated; set {option} in the job input"
    ]
    assert {b["delimiter_hint"] for b in beats if b["chunk"] > 0} == {delimiter}  # kept for a resume


def test_a_comma_file_whose_single_column_name_has_a_semicolon_gets_no_hint(s3: Any, buckets: tuple[str, str]) -> None:
    src, _ = buckets
    obj = upload(s3, src, "in/notes.csv", b"note;s\nplain\nsemi;colon\n")
    result, _ = attempt(s3, file_input(buckets, obj, handler="passthrough"))
    assert result is not None and result.warnings is None


# ------------------------------------------------------------------------------------ whole jobs


def job(src: str, out: str, **options: Any) -> S3BatchInput:
    return S3BatchInput(bucket=src, prefix="in/", output_bucket=out, output_prefix=OUT, handler="customers", **options)


@pytest.mark.parametrize("group_max_files", [1, 100], ids=["file-activity", "group-activity"])
async def test_a_job_over_the_ratio_reports_the_file_failed_with_its_counts(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets: tuple[str, str], group_max_files: int
) -> None:
    src, out = buckets
    upload(s3, src, "in/customers.csv", customers_csv(1500))
    upload(s3, src, "in/good.csv", customers_csv(20, lambda i: False))
    spec = job(src, out, chunk_records=100, max_rejected_ratio=0.5, group_max_files=group_max_files)
    with pytest.raises(WorkflowFailureError) as failure:
        await execute(client, task_queue, spec, "ratio")
    cause = failure.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "JobFailed"
    rep = report(s3, out)
    by_key = {entry["key"]: entry for entry in rep["files"]}  # the report lists files as they finish
    assert sorted(by_key) == ["in/customers.csv", "in/good.csv"]
    f, good = by_key["in/customers.csv"], by_key["in/good.csv"]
    assert good["status"] == "succeeded" and "reject_ratio" not in good and "warnings" not in good
    assert f["status"] == "failed" and f["error"].startswith("TooManyRejects: ")
    assert (f["records"], f["rejected"], f["chunks"], f["reject_ratio"]) == (1000, 1000, 10, 1.0)
    assert f["reject_reasons"][0]["reason"] == EMAIL_REASON
    assert rep["totals"]["rejected"] == 1000 and rep["input"]["max_rejected_ratio"] == 0.5
    assert "max_rejected_records" not in rep["input"]  # options not set stay out of the report
    no_marker(rep)


async def test_under_a_limit_that_allows_all_rejects_it_succeeds_with_the_warnings_in_the_report_and_the_cli(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets: tuple[str, str]
) -> None:
    """Every record of both files is rejected: without a limit that allows it, each would fail (see
    tests/test_all_rejected.py); ``--max-rejected-ratio 1.0`` accepts them, and the warnings still say so."""
    src, out = buckets
    upload(s3, src, "in/customers.csv", customers_csv(300))
    upload(s3, src, "in/semicolons.csv", b"id;name;city\n" + b"".join(b"%d;Ann;Lyon\n" % i for i in range(40)))
    wid = new_id("warn")
    r = await run(
        "s3batch", "start", "--bucket", src, "--prefix", "in/", "--output-bucket", out, "--output-prefix", OUT,
        "--handler", "customers", "--task-queue", task_queue, "--id", wid, "--wait", "--max-rejected-ratio", "1.0",
    )  # fmt: skip
    assert r.code == 0, r
    rep = report(s3, out)
    assert rep["status"] == "succeeded" and rep["input"]["max_rejected_ratio"] == 1.0
    files = {f["key"]: f for f in rep["files"]}
    customers, semi = files["in/customers.csv"], files["in/semicolons.csv"]
    assert (customers["reject_ratio"], customers["reject_reasons"][0]["reason"]) == (1.0, EMAIL_REASON)
    assert sum(r["count"] for r in customers["reject_reasons"]) == 300
    assert customers["warnings"][0].startswith("100.0% of its records were rejected (300 of 300;")
    assert any('set "delimiter": ";" in the job input' in w for w in semi["warnings"])
    shown = await run("s3batch", "report", wid)
    status = await run("s3batch", "status", wid)
    for output in (shown.stdout, r.stdout, status.stdout):
        flat = " ".join(output.split())
        assert "warning in/customers.csv: 100.0% of its records were rejected" in flat, output
        assert 'in/semicolons.csv: its CSV header is one column whose name contains' in flat, output
    no_marker(rep, shown.stdout, status.stdout)


async def test_the_job_total_fails_the_job_with_the_counts_and_writes_the_report(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets: tuple[str, str]
) -> None:
    src, out = buckets
    for name in ("a", "b", "c"):
        upload(s3, src, f"in/{name}.csv", customers_csv(50))
    # Every record of each file is rejected: max_rejected_ratio 1.0 lets each file succeed, the job's total fails it.
    spec = job(src, out, max_rejected_total=60, max_rejected_ratio=1.0, max_concurrent_files=1, group_max_files=1)
    with pytest.raises(WorkflowFailureError) as failure:
        await execute(client, task_queue, spec, "total")
    cause = failure.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "TooManyRejects" and cause.non_retryable
    assert cause.message.startswith(
        "100 records were rejected over the job's files, over max_rejected_total=60 (100 records read, 100.0% "
        "rejected; 2 files done of 3 listed)."
    )
    assert f"The report: s3://{out}/{OUT}_report.json" in cause.message
    rep = report(s3, out)
    assert rep["status"] == "failed"
    assert [(f["key"], f["status"]) for f in rep["files"]] == [
        ("in/a.csv", "succeeded"),
        ("in/b.csv", "succeeded"),
        ("in/c.csv", "not_started"),
    ]
    assert rep["totals"]["rejected"] == 100 and rep["totals"]["files_not_started"] == 1


def test_the_job_limits_are_checked_at_start_naming_the_field() -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"max_rejected_ratio": 1.5}, "max_rejected_ratio"),
        ({"max_rejected_records": -1}, "max_rejected_records"),
        ({"max_rejected_total": "10"}, "max_rejected_total"),  # strict: never coerced
    ]
    for bad, field in cases:
        with pytest.raises(ValueError, match=field):
            S3BatchInput.model_validate({"bucket": "src", "output_bucket": "out", **bad})
    assert "max_rejected_ratio" not in S3BatchInput(bucket="src", output_bucket="out").model_dump()
    assert Checkpoint(etag="e", fingerprint="f").reject_reasons == []


def test_a_running_job_shows_its_warnings_in_the_web_ui_details_watch_and_status(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # While the job runs, status and watch show what the progress query returns, the Web UI the
    # workflow's current details: all from the job's state.
    warned = FileResult(key="in/a.csv", etag="e", status="succeeded", warnings=["80.0% of its records were rejected"])
    state = JobState(listing_done=True, warnings=with_job_warnings(None, warned))
    assert "warning: in/a.csv: 80.0% of its records were rejected" in details(state, None, 0, 8, False, None)
    p: Progress = job_progress(state, {}, 8, False)
    view = JobView(workflow_id="job-1", run_id="r", status="running", ui_url="http://ui", progress=p)
    console = Console(width=200, color_system=None)
    with console.capture() as shown:
        console.print(watch_renderable(view, []))
    assert "warning  in/a.csv: 80.0% of its records were rejected" in shown.get()
    print_view(view)
    assert "warning  in/a.csv: 80.0% of its records were rejected" in capsys.readouterr().out
    # Without warnings the state is written as before (continue-as-new carries it).
    assert "warnings" not in JobState().model_dump()
    assert with_job_warnings(None, FileResult(key="b", etag="e", status="succeeded")) is None


@record_handler("rejects-test-quoting")
def _quoting(value: dict[str, str]) -> dict[str, str]:
    if value["email"].startswith(MARKER):
        raise ValueError(f"bad email {value['email']}")  # quotes the record, as handlers may
    return value


@chunk_handler("rejects-test-no-summary")
def _no_summary(records: Sequence[Record]) -> HandlerResult:
    return HandlerResult([], [Reject(r.line, f"refused {r.value}") for r in records], dropped=0)


@pytest.mark.parametrize(
    ("handler", "reason"),
    [("rejects-test-quoting", "ValueError raised by the handler"), ("rejects-test-no-summary", HANDLER_REASON)],
)
def test_a_handler_reason_that_may_quote_the_record_is_counted_by_its_summary_only(
    s3: Any, buckets: tuple[str, str], handler: str, reason: str
) -> None:
    src, out = buckets
    obj = upload(s3, src, "in/customers.csv", customers_csv(30))
    # Every record is rejected: a limit that allows it, or the file fails (tests/test_all_rejected.py).
    result, beats = attempt(s3, file_input(buckets, obj, handler=handler, chunk_records=10, max_rejected_ratio=1.0))
    assert result is not None and result.rejected == 30
    assert [(r.reason, r.count) for r in result.reject_reasons or []] == [(reason, 30)]
    no_marker(result.model_dump(), beats)
    # The rejects file keeps the full reason (it holds the record anyway).
    body = s3.get_object(Bucket=out, Key=layout.rejects_key(OUT, obj.key, 0))["Body"].read()
    assert MARKER in json.loads(body.splitlines()[0])["reason"]

"""The stage modules' own contracts: the error hierarchy and its one translation, the job report
model (read back and written byte-for-byte), and the heartbeat details of the checkpoint module."""

from __future__ import annotations

import datetime
import json
from typing import Any

import pytest
from s3batch.activities.boundary import boundary, to_application_error
from temporalio.exceptions import ActivityError, ApplicationError, ApplicationErrorCategory, RetryState

from s3batch import errors
from s3batch.checkpoint import Checkpoint, HeartbeatDetails
from s3batch.errors import NON_RETRYABLE_TYPES, BadFile, S3Error, UnknownFormatError, WorkerShutdown, describe_failure
from s3batch.messages import FileResult, FinalReportInput, Totals
from s3batch.models import JobSpec
from s3batch.report import JobReport, parse_report, redrive_plan
from s3batch.report_store import assemble_report, find_report, read_report

# ---------------------------------------------------------------------------------------- errors


def test_non_retryable_types_are_the_hand_written_list_of_before() -> None:
    # The list every retry policy carried, in its order, before it was derived from the hierarchy.
    assert NON_RETRYABLE_TYPES == [
        "SourceChanged",
        "NotFound",
        "AccessDenied",
        "UnknownHandler",
        "InvalidInput",
        "BadFile",
        "S3Refused",
        "OutputKeyTooLong",
        "AccountingError",
        "TooManyRejects",  # added by issue 17 (thresholds on rejects), after the list of before
    ]
    assert {"S3Error", "HandlerError", "WorkerShutdown"}.isdisjoint(NON_RETRYABLE_TYPES)


def test_an_unknown_format_is_a_bad_file_and_a_value_error() -> None:
    err = UnknownFormatError("x")
    assert isinstance(err, BadFile) and isinstance(err, ValueError)
    assert err.type == "BadFile" and not err.retryable


def test_the_boundary_translates_each_error_once_with_its_type_retryability_and_hints() -> None:
    bad = to_application_error(BadFile("s3://b/k is corrupt"), {"attempt": 2})
    assert (bad.type, bad.message, bad.non_retryable) == ("BadFile", "s3://b/k is corrupt", True)
    assert bad.details == ({"attempt": 2},)
    transient = to_application_error(S3Error("reading s3://b/k failed"))
    assert transient.type == "S3Error" and not transient.non_retryable
    assert transient.category == ApplicationErrorCategory.UNSPECIFIED and transient.next_retry_delay is None
    shutdown = to_application_error(WorkerShutdown("worker shutting down"))
    assert shutdown.category == ApplicationErrorCategory.BENIGN
    assert shutdown.next_retry_delay == datetime.timedelta(milliseconds=100) and not shutdown.non_retryable


def test_the_boundary_leaves_other_exceptions_alone() -> None:
    @boundary()
    def fails(kind: str) -> None:
        if kind == "bad":
            raise errors.InvalidInput("the job asks for too much")
        raise KeyError(kind)

    with pytest.raises(ApplicationError) as info:
        fails("bad")
    assert info.value.type == "InvalidInput" and info.value.non_retryable and info.value.__cause__ is None
    with pytest.raises(KeyError):
        fails("other")


def _activity_error(cause: BaseException | None) -> ActivityError:
    err = ActivityError(
        "activity failed",
        scheduled_event_id=5,
        started_event_id=6,
        identity="worker",
        activity_type="s3batch.process_file",
        activity_id="1",
        retry_state=RetryState.NON_RETRYABLE_FAILURE,
    )
    err.__cause__ = cause
    return err


class _Wrapper(Exception):
    """Stands for a WorkflowFailureError: anything with a ``cause``."""

    def __init__(self, cause: BaseException | None) -> None:
        super().__init__("workflow failed")
        self.cause = cause


def test_describe_failure_names_the_activity_error_under_the_wrappers() -> None:
    app = ApplicationError("s3://b/k: access denied", type="AccessDenied")
    assert describe_failure(_activity_error(app)) == "AccessDenied: s3://b/k: access denied"
    assert describe_failure(_Wrapper(_activity_error(app))) == "AccessDenied: s3://b/k: access denied"
    assert describe_failure(_Wrapper(ApplicationError("no type"))) == "Error: no type"
    assert describe_failure(_Wrapper(TimeoutError("too slow"))) == "TimeoutError: too slow"
    assert describe_failure(_Wrapper(None)) == "workflow failed"


# ---------------------------------------------------------------------------------------- report


def _final(files: list[FileResult], totals: Totals, **kwargs: Any) -> FinalReportInput:
    job = JobSpec(bucket="src", prefix="in/", output_bucket="out", output_prefix="o/")
    return FinalReportInput(
        job_id="job-1", job=job, status="succeeded", totals=totals, segments=0, files=files, **kwargs
    )


def test_a_report_reads_back_whole_and_writes_the_same_bytes() -> None:
    files = [
        FileResult(key="in/a.csv", etag="e1", status="succeeded", records=3, records_written=3),
        FileResult(key="in/b.csv", etag="e2", status="failed", error="BadFile: s3://src/in/b.csv is corrupt"),
    ]
    report = assemble_report(_final(files, Totals(files_listed=2, files_succeeded=1, files_failed=1)), [])
    body = report.to_json()
    written = json.loads(body)
    keys = ["job_id", "status", "finished_at", "source", "output", "input", "totals", "listing", "files"]
    assert list(written) == keys
    assert written["files"] == [f.model_dump(mode="json") for f in files]
    assert written["listing"] == {"done": True, "continuation_token": None, "last_listed_key": None}
    assert body == json.dumps(written, indent=1).encode()
    # Read back, then written again: the same bytes, a field from another version included.
    newer = json.dumps({**written, "from_a_newer_release": {"x": 1}}, indent=1).encode()
    assert parse_report(newer, "s3://out/o/_report.json").to_json() == newer
    assert parse_report(body, "s3://out/o/_report.json").to_json() == body


def test_a_report_whose_books_are_off_says_so_and_fails() -> None:
    files = [FileResult(key="in/a.csv", etag="e1", status="succeeded")]
    report = assemble_report(_final(files, Totals(files_listed=2, files_succeeded=1)), [])
    assert report.status == "failed"
    assert report.accounting_errors == ["the report lists 1 files, but the job listed 2"]
    assert list(json.loads(report.to_json()))[-1] == "accounting_errors"


def test_redrive_plan_takes_failed_cancelled_and_unstarted_files_under_the_prefix() -> None:
    report = parse_report(
        json.dumps(
            {
                "files": [
                    {"key": "in/a", "status": "succeeded"},
                    {"key": "in/b", "status": "failed"},
                    {"key": "other/c", "status": "failed"},
                    {"key": "in/d", "status": "cancelled"},
                    {"key": "in/e", "status": "not_started"},
                ],
                "listing": {"done": False, "continuation_token": None},
            }
        ).encode(),
        "s3://out/r.json",
    )
    assert redrive_plan(report, "in/") == (["in/b", "in/d", "in/e"], "")
    ended = report.model_copy(update={"listing": report.listing.model_copy(update={"done": True})})
    assert redrive_plan(ended, "in/") == (["in/b", "in/d", "in/e"], None)


def test_something_else_is_not_a_report() -> None:
    for body in (b"not json", b"[]", b'{"files": "nope"}', b'{"files": [{"status": "failed"}]}'):
        with pytest.raises(errors.InvalidInput, match=r"s3://out/x\.json is not an s3batch job report"):
            parse_report(body, "s3://out/x.json")


def test_reports_on_s3_are_read_through_one_module(s3: Any, buckets: tuple[str, str]) -> None:
    _, out = buckets
    assert find_report(s3, out, "o/_report.json") is None
    report = assemble_report(_final([], Totals()), [])
    s3.put_object(Bucket=out, Key="o/_report.json", Body=report.to_json())
    found = find_report(s3, out, "o/_report.json")
    assert found is not None and found[0] == JobReport.model_validate_json(report.to_json())
    assert found[1] == s3.head_object(Bucket=out, Key="o/_report.json")["ETag"]
    with pytest.raises(errors.NotFound, match=r"reading the job report s3://.*/o/missing\.json: the object does not"):
        read_report(s3, out, "o/missing.json")


# ---------------------------------------------------------------------------------------- heartbeat


def test_heartbeat_details_keep_their_wire_shape() -> None:
    cp = Checkpoint(etag="e", fingerprint="f", next_record=10, chunk=1)
    assert HeartbeatDetails(cp).args() == (cp,)
    assert HeartbeatDetails(cp, 3).args() == (cp, 3)
    assert HeartbeatDetails(cp, 3, 1_200).args() == (cp, 3, 1_200)  # with the group's finished bytes
    assert HeartbeatDetails.of([cp.model_dump(mode="json"), 3, 1_200]).group_done == 1_200
    assert HeartbeatDetails.of([cp.model_dump(mode="json"), 3]).group_done is None  # an earlier version's
    # As the SDK hands them back: plain values.
    back = HeartbeatDetails.of([cp.model_dump(mode="json"), 3])
    assert back.group_index == 3 and back.read() == cp
    assert HeartbeatDetails.of([]) == HeartbeatDetails(None, None) and HeartbeatDetails.of([]).read() is None
    assert HeartbeatDetails.of([{"etag": 1}]).read() is None  # unreadable: ignored, never raised
    assert HeartbeatDetails.of([cp.model_dump(mode="json"), "x"]).group_index is None

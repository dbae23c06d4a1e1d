"""The final report checks the job's books: every listed key exactly once, status counts equal to
the totals, the keys' digest equal to the listing's. A report that does not add up is written as
``failed`` with its ``accounting_errors`` and the activity fails with ``AccountingError``."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from s3batch.activities.s3_activities import S3Activities
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from s3batch.accounting import combine, key_digest
from s3batch.errors import ACCOUNTING_ERROR
from s3batch.messages import FileResult, FinalReportInput, ReportSegmentInput, Totals
from s3batch.models import JobSpec
from tests.helpers.books import report_problems
from tests.helpers.output import report


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(st.lists(st.text(max_size=12), max_size=30), st.randoms())
def test_key_digest_is_order_independent_and_sees_a_lost_or_doubled_key(keys: list[str], rnd: Any) -> None:
    shuffled = list(keys)
    rnd.shuffle(shuffled)
    assert key_digest(shuffled) == key_digest(keys)
    half = len(keys) // 2
    assert combine(key_digest(keys[:half]), key_digest(keys[half:])) == key_digest(keys)
    if keys:
        assert key_digest(keys[1:]) != key_digest(keys)  # one lost
        assert key_digest([*keys, keys[0]]) != key_digest(keys)  # one doubled
        if keys[0] != "swapped":
            assert key_digest(["swapped", *keys[1:]]) != key_digest(keys)  # one swapped for another


def _files(*pairs: tuple[str, str]) -> list[dict[str, Any]]:
    return [FileResult(key=k, etag="e", status=s).model_dump(mode="json") for k, s in pairs]  # type: ignore[arg-type]


def test_report_problems_name_what_does_not_add_up() -> None:
    files = _files(("a", "succeeded"), ("b", "failed"), ("c", "not_started"))
    totals = Totals(files_listed=3, files_succeeded=1, files_failed=1, files_not_started=1).model_dump()
    assert report_problems(files, totals, key_digest(["a", "b", "c"])) == []
    assert report_problems(files, totals, None) == []  # a job started before digests: counts only
    doubled = report_problems([*files, files[0]], totals, key_digest(["a", "b", "c"]))
    assert any("4 files" in p for p in doubled) and any("more than once" in p for p in doubled)
    swapped = _files(("a", "succeeded"), ("x", "failed"), ("c", "not_started"))
    assert report_problems(swapped, totals, key_digest(["a", "b", "c"])) == [
        "the report's keys are not the keys the job listed"
    ]
    miscounted = report_problems(files, {**totals, "files_failed": 0, "files_succeeded": 2}, None)
    assert miscounted == [
        "the report has 1 succeeded files, the totals say 2",
        "the report has 1 failed files, the totals say 0",
    ]


def _final(buckets: tuple[str, str], files: list[FileResult], totals: Totals, **kw: Any) -> FinalReportInput:
    src, out = buckets
    return FinalReportInput(
        job_id="job-books",
        job=JobSpec(bucket=src, output_bucket=out, output_prefix="o/"),
        status="succeeded",
        totals=totals,
        segments=kw.pop("segments", 0),
        files=files,
        **kw,
    )


def test_a_report_that_adds_up_is_written_as_is(s3: Any, buckets: tuple[str, str]) -> None:
    acts = S3Activities(s3)
    env = ActivityEnvironment()
    earlier = [FileResult(key="in/a.csv", etag="e", status="succeeded", records=2, records_written=2)]
    segment = ReportSegmentInput(output_bucket=buckets[1], output_prefix="o/", segment=0, files=earlier)
    env.run(acts.write_report_segment, segment)
    last = [FileResult(key="in/b.csv", etag="e", status="failed", error="BadFile: x")]
    totals = Totals(files_listed=2, files_succeeded=1, files_failed=1, records=2, records_written=2)
    key = env.run(
        acts.write_report, _final(buckets, last, totals, segments=1, listed_digest=key_digest(["in/a.csv", "in/b.csv"]))
    )
    rep = report(s3, buckets[1])
    assert key == "o/_report.json"
    assert rep["status"] == "succeeded" and "accounting_errors" not in rep
    assert [f["key"] for f in rep["files"]] == ["in/a.csv", "in/b.csv"]
    assert rep["listing"] == {"done": True, "continuation_token": None, "last_listed_key": None}


def test_a_report_that_does_not_add_up_fails_loudly_and_says_why(s3: Any, buckets: tuple[str, str]) -> None:
    files = [FileResult(key="in/a.csv", etag="e", status="succeeded")]
    totals = Totals(files_listed=2, files_succeeded=2)  # one file's result is missing
    with pytest.raises(ApplicationError) as failure:
        ActivityEnvironment().run(
            S3Activities(s3).write_report,
            _final(buckets, files, totals, listed_digest=key_digest(["in/a.csv", "in/b.csv"])),
        )
    err = failure.value
    assert err.type == ACCOUNTING_ERROR and err.non_retryable
    assert "the report lists 1 files, but the job listed 2" in err.message
    rep = report(s3, buckets[1])
    assert rep["status"] == "failed"
    assert "the report has 1 succeeded files, the totals say 2" in rep["accounting_errors"]
    assert "the report's keys are not the keys the job listed" in rep["accounting_errors"]

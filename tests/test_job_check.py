"""The job's check (``s3batch.check_job``) asks its reads at once (the source, the output bucket, the output's
owner) and still fails as if it had asked them one by one: the first thing wrong, in that order, is the error
the user sees, and nothing is written before all of them have answered."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest
from s3batch.activities.ownership import write_check_metadata
from s3batch.activities.s3_activities import S3Activities, at_once
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from s3batch import layout
from s3batch.models import JobSpec


class First(Exception):
    pass


class Second(Exception):
    pass


def test_at_once_runs_the_calls_together_and_returns_their_results_in_order() -> None:
    gate = threading.Barrier(3, timeout=5)  # passes only when all three calls run at the same time

    def call(value: int) -> int:
        gate.wait()
        return value

    assert at_once(lambda: call(1), lambda: call(2), lambda: call(3)) == [1, 2, 3]


@pytest.mark.parametrize("slow", [0, 1, 2])
def test_at_once_raises_the_first_failure_in_order_after_every_call_has_ended(slow: int) -> None:
    ended: list[int] = []

    def call(n: int) -> None:
        if n == slow:
            time.sleep(0.2)  # whichever call is slow, the order of the errors is the calls' order
        ended.append(n)
        if n == 1:
            raise First(n)
        if n == 2:
            raise Second(n)

    with pytest.raises(First):
        at_once(lambda: call(0), lambda: call(1), lambda: call(2))
    assert sorted(ended) == [0, 1, 2], "every call ended before the error was raised"


def _check(s3: Any, job: JobSpec) -> ApplicationError:
    with pytest.raises(ApplicationError) as info:
        ActivityEnvironment().run(S3Activities(s3).check_job, job)
    return info.value


def _outputs(s3: Any, bucket: str, prefix: str) -> list[str]:
    return [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])]


def test_a_missing_source_is_named_before_a_missing_output_bucket(s3: Any) -> None:
    missing_src, missing_out = f"missing-{uuid.uuid4().hex[:8]}", f"missing-{uuid.uuid4().hex[:8]}"
    error = _check(s3, JobSpec(bucket=missing_src, prefix="in/", output_bucket=missing_out, output_prefix="o/"))
    assert error.type == "NotFound" and f"s3://{missing_src}/in/" in error.message, error.message


def test_a_missing_output_bucket_is_named_when_the_source_is_there(s3: Any, buckets: tuple[str, str]) -> None:
    src, _ = buckets
    missing_out = f"missing-{uuid.uuid4().hex[:8]}"
    error = _check(s3, JobSpec(bucket=src, prefix="in/", output_bucket=missing_out, output_prefix="o/"))
    assert error.type == "NotFound" and missing_out in error.message and src not in error.message, error.message


def test_a_missing_source_is_named_before_an_output_another_job_holds(s3: Any, buckets: tuple[str, str]) -> None:
    src, out = buckets
    other = JobSpec(bucket=src, prefix="other/", output_bucket=out, output_prefix="o/")
    probe = layout.write_check_key("o/")
    s3.put_object(Bucket=out, Key=probe, Body=b"", Metadata=write_check_metadata("the-other-job", other))
    missing_src = f"missing-{uuid.uuid4().hex[:8]}"
    error = _check(s3, JobSpec(bucket=missing_src, prefix="in/", output_bucket=out, output_prefix="o/"))
    assert error.type == "NotFound" and f"s3://{missing_src}/in/" in error.message, error.message
    # With the source there, the other job's output is what the check refuses, and it writes nothing.
    error = _check(s3, JobSpec(bucket=src, prefix="in/", output_bucket=out, output_prefix="o/"))
    assert error.type == "InvalidInput" and "the-other-job" in error.message, error.message
    assert _outputs(s3, out, "o/") == [probe]
    assert s3.head_object(Bucket=out, Key=probe)["Metadata"] == write_check_metadata("the-other-job", other)

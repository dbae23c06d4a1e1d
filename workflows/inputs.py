"""The workflow's two arguments, validated: the job (:func:`parse_job`) and the state carried over by
continue-as-new (:func:`parse_state`). A bad argument fails the job at once with a non-retryable
``InvalidInput`` naming the field, never the workflow task (which the server would retry forever)."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from s3batch.errors import INVALID_INPUT
    from s3batch.messages import JobState
    from s3batch.models import S3BatchInput
    from s3batch.validation import describe_validation_error

_M = TypeVar("_M", bound=BaseModel)

TUNING_STATE_FIELDS = frozenset({"files_per_run", "hand_over"})
"""What a job may pass as the second argument when its run did not continue from another: tuning
knobs (tests use them to force continue-as-new after a few files, the benchmark to compare with and
without the hand-over of files in flight), nothing that says what was done."""


def parse_job(raw: Any) -> S3BatchInput:
    """Validate the workflow input, turning a bad input into a clear, non-retryable failure.

    The workflow method takes ``Any`` on purpose: had it declared ``S3BatchInput``, a decoding error
    would fail the workflow *task*, which the server retries forever (the job would hang).
    """
    if isinstance(raw, S3BatchInput):
        return raw
    if raw is None:
        raise ApplicationError(
            "invalid job input: input: no input given; pass the job as JSON, e.g. "
            '{"bucket": "incoming", "output_bucket": "processed"}',
            type=INVALID_INPUT,
            non_retryable=True,
        )
    return _validated(S3BatchInput, raw, "job input", "input")


def parse_state(raw: Any, *, continued: bool) -> JobState:
    """Validate the state handed over by continue-as-new.

    Args:
        raw: The workflow's second argument.
        continued: The run continued from another (``workflow.info().continued_run_id`` is set):
            only then may the state carry progress (run number, totals, pending files, digests...).
            A job started with a forged state would skip its pre-flight check, report files it never
            processed, or pass its own books. A new job may give the tuning knobs only
            (``{"files_per_run": N, "hand_over": false}``).

    Raises:
        ApplicationError: ``InvalidInput`` naming the second argument (the job fails at once).
    """
    what = "second argument (continue-as-new state)"
    if raw is None:
        return JobState()
    if not continued:
        fields = sorted(str(name) for name in raw) if isinstance(raw, dict) else None
        if fields is None or not TUNING_STATE_FIELDS.issuperset(fields):
            given = (
                f"fields {', '.join(repr(name[:40]) for name in fields[:8])}{' ...' if len(fields) > 8 else ''}"
                if fields
                else f"a {type(raw).__name__}"
            )
            raise ApplicationError(
                f"invalid {what}: state: only a run continued from another (continue-as-new) carries a state; a "
                f"new job may pass at most {{\"files_per_run\": N, \"hand_over\": false}} there, got {given}. "
                "Start the job with its input as the only argument.",
                type=INVALID_INPUT,
                non_retryable=True,
            )
    return _validated(JobState, raw, what, "state")


def _validated(model: type[_M], raw: Any, what: str, root: str) -> _M:
    """``model`` from ``raw``, or a non-retryable ``InvalidInput`` failure naming each bad field."""
    try:
        return model.model_validate(raw)
    except ValidationError as err:
        raise ApplicationError(
            f"invalid {what}: {describe_validation_error(err, what=root)}",
            type=INVALID_INPUT,
            non_retryable=True,
        ) from None

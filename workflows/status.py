"""What a job shows while it runs: the Web UI's current details (a few lines of Markdown) and the
search attributes (status, files done and failed, and the source) that index it."""

from __future__ import annotations

from typing import Any

from temporalio import workflow
from temporalio.common import SearchAttributeUpdate

with workflow.unsafe.imports_passed_through():
    from rich import filesize  # the CLI's sizes (pure arithmetic: deterministic)

    from s3batch import layout
    from s3batch import search_attributes as sa
    from s3batch.messages import JobState, ObjectRef, Progress
    from s3batch.models import S3BatchInput
    from s3batch.sinks.spec import PostgresSink, destination


def state_word(state: JobState, cancelling: bool, final: str | None) -> str:
    """The job's status as indexed: the final one, ``cancelling``, ``paused`` or ``processing``."""
    if final:
        return final
    if cancelling:
        return "cancelling"
    return "paused" if state.paused else "processing"


def details(
    state: JobState, spec: S3BatchInput | None, in_flight: int, limit: int, cancelling: bool, final: str | None
) -> str:
    """The Web UI's current details of the job."""
    t = state.totals
    head = ""
    if spec:  # a manifest job names its manifest instead of a bucket and prefix; a table job its table
        into = f"s3://{spec.output_bucket}/{spec.output_prefix}"
        if isinstance(spec.sink, PostgresSink):
            into = destination(spec.sink, spec.output_bucket, spec.output_prefix)
        head = f"{spec.manifest or f's3://{spec.bucket}/{spec.prefix}'} -> {into}"
    if final:
        word = final
    elif cancelling:
        word = "cancelling"
    elif state.paused:
        word = "paused (files in flight finish)"
    else:
        word = "listing" if not state.listing_done else "processing"
    return (
        f"**{word}** {head}\n\n"
        f"files: {t.files_succeeded + t.files_failed:,} done of {t.files_listed:,} listed"
        f"{'' if state.listing_done else '+'}, {t.files_failed:,} failed, "
        f"{in_flight} in flight (max {limit})"
        f"{f', {t.files_cancelled:,} cancelled' if t.files_cancelled else ''}\n\n"
        f"records: {t.records_written:,} written, {t.rejected:,} rejected"
        f"{f', {t.already_written:,} already written by an earlier job' if t.already_written else ''}; "
        f"{filesize.decimal(t.bytes_read)} read"
        + "".join(f"\n\nwarning: {w}" for w in [*(state.warnings or ()), *empty_warning(state, spec, final)])
        + (f"\n\nreport: s3://{spec.output_bucket}/{layout.report_key(spec.output_prefix)}" if final and spec else "")
    )


def empty_warning(state: JobState, spec: S3BatchInput | None, final: str | None) -> list[str]:
    """The warning of a finished job whose prefix matched no file (the job still succeeds unless
    ``fail_if_empty``)."""
    if not final or spec is None or state.totals.files_listed or not state.listing_done:
        return []
    return [f"no file matched s3://{spec.bucket}/{spec.prefix}: nothing was processed (check the prefix)"]


def job_progress(
    state: JobState, in_flight: dict[str, ObjectRef], limit: int, cancelling: bool, spec: S3BatchInput | None = None
) -> Progress:
    """The ``progress`` query's answer: counters of the whole job (all runs so far), files in flight, where the
    records go (``spec``: the job, once the run has it)."""
    t = state.totals
    return Progress(
        files_listed=t.files_listed,
        files_succeeded=t.files_succeeded,
        files_failed=t.files_failed,
        files_in_flight=len(in_flight),
        records=t.records,
        records_written=t.records_written,
        rejected=t.rejected,
        bytes_read=t.bytes_read,
        listing_done=state.listing_done,
        run=state.run,
        already_written=t.already_written or 0,
        in_flight=sorted(in_flight),
        paused=state.paused,
        max_concurrent_files=limit,
        cancelling=cancelling,
        files_cancelled=t.files_cancelled,
        warnings=list(state.warnings or ()),
        destination=destination(spec.sink, spec.output_bucket, spec.output_prefix) if spec is not None else None,
    )


class SearchIndex:
    """Upserts the job's search attributes when their values change."""

    def __init__(self) -> None:
        self.indexed: tuple[str, int, int] | None = None
        """Search attribute values last upserted (status, files done, files failed)."""
        self.checked_source: tuple[bool, str | None] | None = None
        """This run's check result about ``S3BatchSource``: whether it said, and the value it gave
        (None: leave it out). None when no check ran in this run."""

    def upsert(self, state: JobState, spec: S3BatchInput | None, cancelling: bool, final: str | None) -> None:
        # Only once the attributes are known to exist (the worker registered them, or the run was
        # started with S3BatchSource): upserting unregistered ones would fail the workflow task
        # and hang the job.
        if not state.indexed:
            return
        t = state.totals
        status = state_word(state, cancelling, final)
        values = (status, t.files_succeeded + t.files_failed, t.files_failed)
        if values == self.indexed:
            return
        updates: list[SearchAttributeUpdate[Any]] = [
            sa.STATUS.value_set(status),
            sa.FILES_DONE.value_set(values[1]),
            sa.FILES_FAILED.value_set(values[2]),
        ]
        if self.indexed is None and workflow.info().typed_search_attributes.get(sa.SOURCE) is None:
            source = self._source_attribute(spec)
            if source is not None:
                updates.append(sa.SOURCE.value_set(source))
        self.indexed = values
        workflow.upsert_search_attributes(updates)

    def _source_attribute(self, spec: S3BatchInput | None) -> str | None:
        """The ``S3BatchSource`` to upsert for a run started without one, or None to leave it out.

        The workflow cannot know whether payloads are encrypted (the codec runs outside its sandbox),
        so the value comes from the worker's check: an HMAC when the worker has a key. Only the run
        that ran the check upserts it; later runs inherit it through continue-as-new.

        No patch guards this: an upsert is the same command whatever attributes and values it
        carries, and replaying the v0.1.0 histories with other values (or without S3BatchSource in
        the upsert) passes (tests/test_replay.py).
        """
        if self.checked_source is None or spec is None:
            return None
        said, value = self.checked_source
        if said:
            return value
        # The check ran on a worker whose activities do not report the value (an earlier release):
        # plain, as that release does. docs/explanation/security.md says to upgrade every worker.
        return sa.source_value(spec.bucket, spec.prefix)


def source_of(check: Any) -> tuple[bool, str | None]:
    """``(said, value)`` about ``S3BatchSource`` in a check result: ``said`` is False when the result
    has no ``source`` at all (activities of an earlier release), whether declared or an extra field."""
    extra = getattr(check, "model_extra", None) or {}
    fields: set[str] = getattr(check, "model_fields_set", set())
    if "source" not in fields and "source" not in extra:
        return False, None
    value = getattr(check, "source", None)
    return True, value if isinstance(value, str) and value else None

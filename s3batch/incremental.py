"""Incremental jobs: process only the objects that are new or changed since the last run of a ledger.

Pure (no I/O): the workflow sandbox and the models import this module; the S3 side is in
:mod:`s3batch.activities.incremental`.

A job with ``"incremental": {"ledger": "s3://bucket/prefix/"}`` (default: ``{output_prefix}ledger/``
in the output bucket) reads ``{ledger}ledger.json`` while it lists, takes only the objects the ledger
does not know in their current version, writes its output under its own prefix
``{output_prefix}runs/{job-id}/`` and, after its report, advances the ledger over the files that
succeeded. The ledger is bounded: it holds

- ``watermark``: when the listing of the last complete run started (the S3 server's clock, the
  ``Date`` of its first ListObjectsV2 page);
- ``source``: ``s3://bucket/prefix`` of the job that writes it. A ledger remembers one source: a job of
  another source is refused at its first listing page (it would rewrite the watermark and the retries,
  and the next run of the ledger's own source would skip objects it never processed);
- ``near``: the objects processed whose ``LastModified`` is at most ``window_seconds`` before the
  watermark (key -> ``[etag, last_modified]``), so an object written while a listing ran (a
  ``LastModified`` before the watermark but not yet listed) is neither missed nor processed twice;
- ``retry``: the files of earlier runs that did not succeed (failed, cancelled, never started),
  taken again by the next run whatever their time (key -> etag);
- ``runs``: the last :data:`KEPT_RUNS` runs' summaries (new, changed, retried, skipped as unchanged).

An object is taken when its key is in ``retry``, or its ``(key, etag)`` is not in ``near`` and its
``LastModified`` is at or after ``watermark - window`` (every object when there is no watermark yet).
Objects older than the window are not remembered one by one: the ledger stays the size of the
uploads of one window, whatever the number of objects under the prefix. An overwrite is ``changed``
when the ledger still remembers the earlier version (within the window), else it counts as ``new``.
Objects whose upload took longer than the window may be missed: keep the window above the longest
upload (default 15 minutes).

Entries are keyed by bucket and key: those of ``near`` and ``retry`` are objects of the bucket of
``source`` (the file keeps one bucket's keys under its one source, as earlier releases wrote it, so
ledgers of either release are read by workers of both), and an object of another bucket is never
found in them (:meth:`Ledger.kind`). A worker reads a ledger of at most ``S3BATCH_MAX_LEDGER_BYTES``
(:data:`DEFAULT_MAX_LEDGER_BYTES`), about 100 bytes an object of the window.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from s3batch.fielddocs import Documented
from s3batch.selection import KeyFilter, split_s3_uri

LEDGER_NAME = "ledger.json"
LEDGER_FORMAT = "s3batch-ledger/1"
KEPT_RUNS = 20
"""Run summaries kept in the ledger (each run's own report has every file)."""
DEFAULT_WINDOW_SECONDS = 900
DEFAULT_MAX_LEDGER_BYTES = 64 * 1024 * 1024
"""The largest ``ledger.json`` a worker reads by default (``S3BATCH_MAX_LEDGER_BYTES``): some 600,000
objects uploaded within one window."""

Kind = Literal["new", "changed", "retried"]


class Incremental(Documented, BaseModel):
    """The job option ``incremental``: process only what is new or changed since the last run."""

    model_config = ConfigDict(extra="forbid", strict=True)

    ledger: str | None = Field(None, pattern=r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/([^/].*/)?$")
    """``s3://bucket/prefix/`` of the ledger (``ledger.json`` there); default ``{output_prefix}ledger/``
    in the output bucket."""
    window_seconds: int = Field(DEFAULT_WINDOW_SECONDS, ge=1, le=7 * 86_400)
    """How long before the watermark objects are remembered one by one (keep it above the longest upload)."""


class Ledger(BaseModel):
    """``ledger.json`` (see the module docstring)."""

    model_config = ConfigDict(extra="allow")

    format: str = LEDGER_FORMAT
    source: str = ""
    window_seconds: int = DEFAULT_WINDOW_SECONDS
    watermark: str | None = None
    near: dict[str, tuple[str, str]] = Field(default_factory=dict)
    retry: dict[str, str] = Field(default_factory=dict)
    last_run: str | None = None
    last_execution: str | None = None
    """The first run ID of the last job's workflow (None: written by an earlier version)."""
    runs: list[dict[str, Any]] = Field(default_factory=list)
    totals: dict[str, int] = Field(default_factory=dict)

    def to_json(self) -> bytes:
        """Readable and deterministic (sorted keys): the same run writes the same bytes."""
        return (json.dumps(self.model_dump(mode="json"), indent=1, sort_keys=True) + "\n").encode()

    def cut(self) -> datetime.datetime | None:
        """Objects modified before this time are not taken (unless in ``retry``)."""
        if self.watermark is None:
            return None
        return _time(self.watermark) - datetime.timedelta(seconds=self.window_seconds)

    def kind(self, bucket: str, key: str, etag: str, modified: datetime.datetime) -> Kind | None:
        """Whether the object ``bucket/key`` is taken, and why (None: skipped as unchanged). The ledger's
        entries and watermark are those of its source's bucket: an object of another one is new."""
        if self.source and split_s3_uri(self.source)[0] != bucket:
            return "new"
        if key in self.retry:
            return "retried"
        known = self.near.get(key)
        if known is not None and known[0] == etag:
            return None
        cut = self.cut()
        if cut is not None and modified < cut:
            return None
        return "changed" if known is not None else "new"

    def ran_before(self, job_id: str, execution: str | None) -> dict[str, Any] | None:
        """The summary of an earlier job of workflow ID ``job_id`` that was another workflow (its first run ID
        is not ``execution``): a second start of one ID, e.g. a schedule's tick run again by ``temporal
        schedule backfill``. None when there is none (or the ledger or the job do not say)."""
        if execution is None:
            return None
        # The last run's summary is the last of ``runs`` (written with ``last_run`` and ``last_execution``).
        found = [r for r in self.runs if r.get("run") == job_id and r.get("execution") not in (None, execution)]
        return found[-1] if found else None


class ListIncrementalInput(BaseModel):
    """A page of an incremental job's listing (``s3batch.list_incremental``)."""

    model_config = ConfigDict(extra="allow")

    bucket: str
    prefix: str
    continuation_token: str | None = None
    page_size: int = Field(500, ge=1, le=1_000)
    selection: KeyFilter | None = None
    ledger: str
    """``s3://bucket/prefix/`` of the ledger."""
    window_seconds: int = DEFAULT_WINDOW_SECONDS
    output_bucket: str
    output_prefix: str
    """The run's own output prefix: the page's record goes under its ``_s3batch/incremental/``."""
    job_id: str | None = None
    """The job's workflow ID (None from a workflow of an earlier version)."""
    execution: str | None = None
    """The job's first run ID (``workflow.info().first_execution_run_id``: the same through continue-as-new)."""


class WriteLedgerInput(BaseModel):
    """Advance the ledger after the run's report (``s3batch.write_ledger``)."""

    model_config = ConfigDict(extra="allow")

    ledger: str
    run_id: str
    """The job's workflow ID."""
    execution: str | None = None
    """The job's first run ID (see ``ListIncrementalInput.execution``)."""
    source: str
    window_seconds: int = DEFAULT_WINDOW_SECONDS
    output_bucket: str
    output_prefix: str
    report_key: str
    status: str
    listing_done: bool


class PageRecord(BaseModel):
    """What one listing page took, kept under the run's output until the ledger is written."""

    model_config = ConfigDict(extra="allow")

    ledger_etag: str | None
    """The ledger the page was cut with (None: there was none yet)."""
    listed_at: str | None = None
    """The first page's: when the listing started (the S3 server's clock)."""
    taken: list[tuple[str, str, str, str]] = Field(default_factory=list)
    """``[key, etag, last_modified, kind]`` of each object taken."""
    skipped: int = 0
    """Objects left out as unchanged."""


def ledger_uri(output_bucket: str, output_prefix: str, option: Incremental) -> str:
    return option.ledger or f"s3://{output_bucket}/{output_prefix}ledger/"


def ledger_location(uri: str) -> tuple[str, str]:
    """Bucket and key of ``ledger.json`` under the ledger prefix ``uri``."""
    bucket, prefix = split_s3_uri(uri)
    return bucket, f"{prefix}{LEDGER_NAME}"


_UNSAFE_ID = re.compile(r"[^A-Za-z0-9_.:=@+-]")


def run_output_prefix(output_prefix: str, job_id: str) -> str:
    """``{output_prefix}runs/{job-id}/``: each run of an incremental job writes under its own prefix
    (characters of the ID other than letters, digits and ``_.:=@+-`` become ``_``)."""
    name = _UNSAFE_ID.sub("_", job_id).strip(".") or "_"
    return f"{output_prefix}runs/{name}/"


def pages_dir(output_prefix: str) -> str:
    return f"{output_prefix}_s3batch/incremental/"


def page_key(output_prefix: str, token: str | None) -> str:
    """Where a page's record goes: named by its continuation token (a retried page overwrites it)."""
    name = "first" if token is None else hashlib.sha256(token.encode()).hexdigest()[:24]
    return f"{pages_dir(output_prefix)}page-{name}.json"


def iso(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _time(value: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))


def advance(
    old: Ledger, req: WriteLedgerInput, pages: list[PageRecord], statuses: Mapping[str, tuple[str, str]]
) -> Ledger:
    """The ledger after a run: ``pages`` are its listing's records, ``statuses`` its report's files
    (key -> ``(status, etag)``). Only files that succeeded advance it; the others go to ``retry``."""
    succeeded: dict[str, tuple[str, str]] = {}
    retry = {} if req.listing_done else dict(old.retry)
    counts = {"new": 0, "changed": 0, "retried": 0, "skipped_unchanged": 0}
    listed_at = None
    for page in pages:
        counts["skipped_unchanged"] += page.skipped
        listed_at = page.listed_at or listed_at
        for key, etag, modified, kind in page.taken:
            counts[kind] = counts.get(kind, 0) + 1
            status, done_etag = statuses.get(key, ("not_started", etag))
            if status == "succeeded" and done_etag == etag:
                succeeded[key] = (etag, modified)
                retry.pop(key, None)
            else:
                retry[key] = etag
    watermark = listed_at if req.listing_done and listed_at else old.watermark
    window = datetime.timedelta(seconds=req.window_seconds)
    cut = None if watermark is None else _time(watermark) - window
    near = {
        key: entry
        for key, entry in sorted({**old.near, **succeeded}.items())
        if key not in retry and (cut is None or _time(entry[1]) >= cut)
    }
    summary = {
        "run": req.run_id,
        **({} if req.execution is None else {"execution": req.execution}),
        "status": req.status,
        "listed_at": listed_at,
        "succeeded": len(succeeded),
        "to_retry": len(retry),
        **counts,
        "report": f"s3://{req.output_bucket}/{req.report_key}",
    }
    totals = dict(old.totals)
    for name in ("new", "changed", "retried", "skipped_unchanged"):
        totals[name] = totals.get(name, 0) + counts[name]
    totals["runs"] = totals.get("runs", 0) + 1
    return Ledger(
        source=req.source,
        window_seconds=req.window_seconds,
        watermark=watermark,
        near=near,
        retry=dict(sorted(retry.items())),
        last_run=req.run_id,
        last_execution=req.execution,
        runs=[*old.runs, summary][-KEPT_RUNS:],
        totals=totals,
    )

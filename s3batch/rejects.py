"""Rejects, summed up: their most common reasons, the reject ratio, the job's limits on them
(``max_rejected_records``, ``max_rejected_ratio``, ``max_rejected_total``) and the warnings a person
should see (a high reject ratio, a CSV header that looks like another delimiter was meant).

A file's tally lives in its checkpoint (``reject_reasons``: the top :data:`MAX_REASONS` reasons as
``[reason, count]`` pairs, each reason at most :data:`REASON_CHARS` ASCII characters), so it survives
a resume on another worker and stays small enough for a heartbeat and S3 user metadata (2 KB). The
reasons counted are never record contents: the parsers' reasons describe the syntax, validation
reasons name fields and constraints (``s3batch.validation``), and a handler's reject counts under
its ``Reject.summary`` only (:data:`HANDLER_REASON` without one); the full reason, which may quote
the record, stays in the rejects files.

When the ratio is checked: a ratio over the first few records says little (one bad first row of a
big file is 100 %), so ``max_rejected_ratio`` is enforced at a chunk boundary only once
:data:`RATIO_MIN_RECORDS` records were read, and always at the end of the file (a small file is
judged on all its records). ``max_rejected_records`` is a plain count, checked at every boundary.

Pure Python (pydantic only): the workflow sandbox imports this module.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, ValidationError

from s3batch.errors import TooManyRejects
from s3batch.messages import FileResult, ReasonCount, Totals

MAX_REASONS = 5
"""Reasons kept per file (the most common)."""
REASON_CHARS = 100
"""A reason is cut to this many characters (``...`` marks a cut)."""
RATIO_MIN_RECORDS = 1_000
"""``max_rejected_ratio`` is checked at a chunk boundary once this many records were read (and at
the end of the file whatever its size)."""
WARN_RATIO = 0.10
"""A file whose reject ratio is above this gets a warning, limits or not."""
MAX_JOB_WARNINGS = 10
"""Warnings the job keeps for ``status``, ``watch`` and the Web UI (the report has every file's)."""
HANDLER_REASON = "rejected by the handler (its reason is in the rejects file)"
"""What a handler's reject without a ``summary`` counts under."""
DELIMITERS = (";", "\t", "|")
"""Delimiters a one-column CSV header is checked for."""
_PROBE_RECORDS = 50
"""Data records of a file's first chunk the delimiter probe looks at."""

_NUMBERED = re.compile(r"\b(lines?|byte|column|char) \d+(?:-\d+)?")

Tally = list[tuple[str, int]]
"""``[reason, count]`` pairs, most common first (the checkpoint's ``reject_reasons``)."""


def reason_key(summary: str | None) -> str:
    """The reason a reject counts under: its summary with line, byte and column numbers replaced by
    ``N`` (so the same problem on different lines counts once), ASCII, at most :data:`REASON_CHARS`."""
    if summary is None:
        return HANDLER_REASON
    text = _NUMBERED.sub(lambda m: f"{m.group(1)} N", " ".join(summary.split()))
    text = text.encode("ascii", "backslashreplace").decode("ascii")
    return text if len(text) <= REASON_CHARS else text[: REASON_CHARS - 3] + "..."


def merge(tally: Sequence[Sequence[Any]], chunk: Counter[str]) -> Tally:
    """``tally`` with a chunk's reasons added, the :data:`MAX_REASONS` most common kept.

    Counts are exact for the reasons that stay in the top from their first chunk on; a reason that
    enters it later was counted among the others before. The rejects not under a kept reason are the
    file's ``rejected`` minus the sum of the counts.
    """
    counts: Counter[str] = Counter()
    for reason, count in tally:
        counts[str(reason)] += int(count)
    counts.update(chunk)
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return [(reason, count) for reason, count in ranked[:MAX_REASONS]]


def ratio(rejected: int, records: int) -> float:
    """Rejected / records read (0.0 for no records), rounded to 4 digits."""
    return round(rejected / records, 4) if records else 0.0


def describe_reasons(tally: Sequence[Sequence[Any]], rejected: int, limit: int = 3) -> str:
    """``reason (count); ...`` of the ``limit`` most common reasons, and how many others."""
    shown = [f"{reason} ({count})" for reason, count in list(tally)[:limit]]
    others = rejected - sum(int(count) for _, count in list(tally)[:limit])
    if others > 0:
        shown.append(f"{others} other{'s' if others > 1 else ''}")
    return "; ".join(shown) or "none"


class FileLimits(BaseModel):
    """A file's limits on its rejects (None: no limit)."""

    model_config = ConfigDict(frozen=True)

    max_rejected_records: int | None = None
    max_rejected_ratio: float | None = None


ALL_REJECTED = "all_rejected"
"""What :func:`crossed` names for a whole file of records every one of which was rejected, under no limit."""


def crossed(limits: FileLimits, rejected: int, records: int, *, done: bool, whole_file: bool = False) -> str | None:
    """Which limit ``rejected`` of ``records`` read is over (``"max_rejected_records=N"`` ...), or
    None. The ratio counts from :data:`RATIO_MIN_RECORDS` records read on, or at the end of the file.

    ``whole_file``: the counts are a whole file's (not one byte-range split's). Such a file of one or more
    records, done, every one rejected, is over the default limit (:data:`ALL_REJECTED`) when the job set
    neither ``max_rejected_records`` nor ``max_rejected_ratio``: a job that sets one says how many rejects
    it accepts (``max_rejected_ratio: 1.0``: all of them)."""
    if limits.max_rejected_records is not None and rejected > limits.max_rejected_records:
        return f"max_rejected_records={limits.max_rejected_records}"
    max_ratio = limits.max_rejected_ratio
    enforced = records and (done or records >= RATIO_MIN_RECORDS)
    if max_ratio is not None and enforced and rejected / records > max_ratio:
        return f"max_rejected_ratio={max_ratio}"
    if whole_file and done and all_rejected(limits, rejected, records):
        return ALL_REJECTED
    return None


def all_rejected(limits: FileLimits, rejected: int, records: int) -> bool:
    """Whether ``records`` (one or more) were all rejected and no limit was set (see :func:`crossed`)."""
    unset = limits.max_rejected_records is None and limits.max_rejected_ratio is None
    return unset and records > 0 and rejected >= records


def all_rejected_advice(output: str, job_id: str | None = None) -> str:
    """What to do about a file whose every record was rejected (its rejects files under ``output``) by job
    ``job_id`` (None: not known here)."""
    return (
        f"Fix what rejected them (the rejects files under {output} give each rejected line and its full "
        f"reason), then bring them in with `s3batch redrive --rejected {job_id or '<this job>'}` (it processes "
        "those records again, once); or, to accept such a file, set a reject limit that allows it, "
        'e.g. "max_rejected_ratio": 1.0 (s3batch start --max-rejected-ratio 1.0).'
    )


class Progress(Protocol):
    """What a file's counts are read from (``s3batch.checkpoint.Checkpoint``)."""

    next_record: int
    records_written: int
    rejected: int
    dropped: int
    chunk: int
    reject_reasons: list[tuple[str, int]]


def file_counts(cp: Progress, *, earlier: bool = False) -> dict[str, Any]:
    """The ``FileResult`` fields of a file's counts at checkpoint ``cp`` (the reject fields only when
    it has rejects). ``earlier``: ``cp`` is the final checkpoint of an earlier job, found done: its records
    written are ``already_written``, none by this job."""
    counts: dict[str, Any] = {
        "records": cp.next_record,
        "records_written": 0 if earlier else cp.records_written,
        "rejected": cp.rejected,
        "dropped": cp.dropped,
        "chunks": cp.chunk,
    }
    if earlier:
        counts["already_written"] = cp.records_written
    if cp.rejected:
        counts["reject_ratio"] = ratio(cp.rejected, cp.next_record)
        counts["reject_reasons"] = [{"reason": str(r), "count": int(c)} for r, c in cp.reject_reasons]
    return counts


def too_many(
    where: str, limit: str, counts: dict[str, Any], tally: Sequence[Sequence[Any]], output: str,
    job_id: str | None = None,
) -> TooManyRejects:
    """The failure of a file over ``limit`` (``counts``: :func:`file_counts` at its last commit) in job ``job_id``."""
    records, rejected, chunks = counts["records"], counts["rejected"], counts["chunks"]
    if limit == ALL_REJECTED:
        return TooManyRejects(
            f"{where}: all {records} records read were rejected, and no reject limit allows that (a file whose "
            f"every record is rejected fails unless the job sets one); most common reasons: "
            f"{describe_reasons(tally, rejected)}. {all_rejected_advice(output, job_id)}",
            counts,
        )
    return TooManyRejects(
        f"{where}: {rejected} of the {records} records read were rejected ({ratio(rejected, records):.1%}), "
        f"over {limit}; most common reasons: {describe_reasons(tally, rejected)}. The file stopped after "
        f"chunk {chunks - 1}: its {chunks} committed parts and rejects under {output} are kept (a redrive with "
        "a higher limit resumes after them). The rejects files give each rejected line and its full reason.",
        counts,
    )


def counts_of(detail: Any) -> dict[str, Any]:
    """The file counts a failure carried (``S3BatchError.file_counts``, in an activity failure's
    details), checked; empty when there are none or they do not read as counts."""
    if not isinstance(detail, dict):
        return {}
    known = {k: v for k, v in detail.items() if k in _COUNT_FIELDS}
    if not known:
        return {}
    try:
        return _Counts.model_validate(known).model_dump(exclude_unset=True)
    except ValidationError:
        return {}


class _Counts(BaseModel):
    records: int = 0
    records_written: int = 0
    rejected: int = 0
    dropped: int = 0
    chunks: int = 0
    reject_ratio: float | None = None
    reject_reasons: list[ReasonCount] | None = None


_COUNT_FIELDS = frozenset(_Counts.model_fields)


# ---------------------------------------------------------------------------------------- warnings


def warnings_of(rejected: int, records: int, tally: Sequence[Sequence[Any]], delimiter: str | None) -> list[str]:
    """What a person should see about a file: a reject ratio above :data:`WARN_RATIO`, a CSV that
    looks like it uses another delimiter (see :class:`DelimiterProbe`)."""
    found = []
    if records and rejected / records > WARN_RATIO:
        found.append(
            f"{ratio(rejected, records):.1%} of its records were rejected ({rejected} of {records}; "
            f"{describe_reasons(tally, rejected, 1)}): see its rejects files; set max_rejected_ratio or "
            "max_rejected_records to fail such files"
        )
    if delimiter is not None:
        found.append(delimiter_warning(delimiter))
    return found


def delimiter_warning(delimiter: str) -> str:
    option = json.dumps({"delimiter": delimiter})[1:-1]
    return (
        f"its CSV header is one column whose name contains {delimiter!r}, and its data lines split evenly on "
        f"it: the file looks {delimiter!r}-separated, read as ','-separated; set {option} in the job input"
    )


def with_job_warnings(kept: list[str] | None, result: FileResult) -> list[str] | None:
    """The job's warnings with ``result``'s (each with its key) added, up to :data:`MAX_JOB_WARNINGS`."""
    if not result.warnings:
        return kept
    found = [*(kept or ()), *(f"{result.key}: {warning}" for warning in result.warnings)]
    return found[:MAX_JOB_WARNINGS]


def total_crossed(totals: Totals, limit: int | None) -> str | None:
    """Why the job is over ``max_rejected_total`` (None: it is not, or there is no limit)."""
    if limit is None or totals.rejected <= limit:
        return None
    return (
        f"{totals.rejected} records were rejected over the job's files, over max_rejected_total={limit} "
        f"({totals.records} records read, {ratio(totals.rejected, totals.records):.1%} rejected; "
        f"{totals.files_succeeded + totals.files_failed} files done of {totals.files_listed} listed). The job "
        "stopped: files in flight stopped at a chunk boundary (cancelled), the others were not started; "
        "a redrive processes them."
    )


# ---------------------------------------------------------------------------------------- delimiter


class DelimiterProbe:
    """Looks at a CSV file's header and first data records for a delimiter other than ``,``: a header
    of one column whose name contains ``;``, a tab or ``|``, and data records whose one value splits
    on it into as many fields as the header name does.

    Args:
        active: False when the file is not CSV, or was resumed after its first chunk (the hint found
            then is in its checkpoint).
    """

    def __init__(self, active: bool) -> None:
        self.active = active
        self.hint: str | None = None
        """The delimiter the file seems to use (None: no sign of one)."""
        self._seen = 0
        self._candidates: list[tuple[str, int]] | None = None

    def see(self, header: Sequence[str] | None, values: Iterable[Any]) -> None:
        """Look at the next data records' values (``{column: text}``; rejects are None, skipped)."""
        if not self.active:
            return
        if self._candidates is None:
            name = header[0] if header and len(header) == 1 else ""
            self._candidates = [(d, name.count(d)) for d in DELIMITERS if d in name]
        for value in values:
            if self._seen >= _PROBE_RECORDS or not self._candidates:
                break
            if not isinstance(value, dict) or len(value) != 1:
                continue
            (text,) = value.values()
            self._candidates = [(d, n) for d, n in self._candidates if isinstance(text, str) and text.count(d) == n]
            self._seen += 1
        self.hint = self._candidates[0][0] if self._candidates and self._seen else None
        if self._seen >= _PROBE_RECORDS or not self._candidates:
            self.active = False

"""The checker: the books of every job from first principles, once the soak is over (and for a cancelled job,
before its redrive writes into its output).

What the soak knows (every version of every source file it wrote, and what each record must become) is set
against what the servers hold (the parts, rejects files and table rows, read by :mod:`scripts.soak.outputs`):

- every record of a file a job reports ``succeeded`` is in its output exactly once, with the values read (a
  JSONL or Parquet part, a table row; an upsert's row of a key is the last good record of that key), or in
  its rejects exactly once (by its line), with a reason: those the parser or the database must refuse and no
  other;
- a file reported ``failed`` or ``cancelled`` holds exactly what its report entry counts (written, rejected),
  never a record twice, never another file's; a ``not_started`` file holds nothing;
- each report's totals are the sums of its files, each listed file once; a job that succeeded listed every file
  it was given (and a manifest's missing key failed); the workflow's status is the report's;
- an incremental job's runs process each version of a file at most once, and the last version of every file
  once, by the time a run finds nothing new;
- nothing is written outside the jobs' output prefixes (or into the source bucket), no table row belongs to no
  job's file (:mod:`scripts.soak.bounds`).

Each finding is a :class:`Violation`; the first is the one the soak prints with the seed and the timeline.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from s3batch import layout
from scripts.soak.data import Rec, Version
from scripts.soak.kinds import JobPlan, RunRecord
from scripts.soak.outputs import FileOutputs, Tables, folders, list_keys, read_folder, read_report, read_tables

COUNTED = ("records", "records_written", "rejected", "dropped")
STATUS_TOTALS = {"succeeded": "files_succeeded", "failed": "files_failed", "cancelled": "files_cancelled",
                 "not_started": "files_not_started"}


@dataclass(frozen=True)
class Violation:
    job: str
    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.job}: {self.where}: {self.message}"


@dataclass
class Counts:
    """What the checker counted."""

    files: int = 0
    records_written: int = 0
    rejected: int = 0


def _etag(value: str) -> str:
    return value.strip('"')


def _tag(version: Version) -> str:
    return version.records[0].rid.rpartition(":")[0] if version.records else ""


class Checker:
    def __init__(self, s3: Any, pg: Any) -> None:
        self.s3 = s3
        self.pg = pg
        self.counts = Counts()
        self._keys: list[str] = []
        self._tables = Tables()

    # ------------------------------------------------------------------ entry points

    def check_all(self, plans: list[JobPlan]) -> list[Violation]:
        from scripts.soak.bounds import bounds
        from scripts.soak.outputs import all_keys

        self.counts = Counts()
        out_keys, src_keys = all_keys(self.s3)
        self._keys, self._tables = out_keys, read_tables(self.pg)
        found: list[Violation] = []
        for plan in plans:
            found += [Violation(plan.job_id, "while it ran", m) for m in plan.checked_early]
            found += self.check_incremental(plan) if plan.spec.get("incremental") is not None else self.check_job(plan)
        return found + bounds(plans, out_keys, src_keys, self._tables)

    def early(self, plan: JobPlan, rec: RunRecord) -> list[str]:
        """The books of a cancelled job as it left them (before its redrive): run by the generator."""
        self._keys = list_keys(self.s3, "soak-out", plan.prefix)
        self._tables = read_tables(self.pg) if plan.sink.startswith("pg") else Tables()
        report = read_report(self.s3, rec.output_prefix)
        found = self.check_run(plan, rec, report, {})
        return [f"before its redrive: {v.where}: {v.message}" for v in found]

    # ------------------------------------------------------------------ jobs

    def check_job(self, plan: JobPlan) -> list[Violation]:
        found: list[Violation] = []
        main, redrive = plan.records[0] if plan.records else None, None
        if len(plan.records) > 1:
            redrive = plan.records[1]
        if main is None:
            return [Violation(plan.job_id, "job", "never started")]
        if redrive is None:
            return self.check_run(plan, main, read_report(self.s3, main.output_prefix), {})
        original = read_report(self.s3, main.output_prefix, f"_report.before-redrive-{redrive.workflow_id}.json")
        if original is None:
            return [Violation(plan.job_id, "job", "redriven, but the report it redrove is gone")]
        found += self._report_books(plan, main, original)
        kept = {e["key"]: e for e in original["files"] if e["status"] == "succeeded"}
        return found + self.check_run(plan, redrive, read_report(self.s3, redrive.output_prefix), kept)

    def check_run(self, plan: JobPlan, rec: RunRecord, report: dict[str, Any] | None,
                  earlier: dict[str, dict[str, Any]]) -> list[Violation]:
        """One workflow's report against the outputs; ``earlier``: the files a job it redrives finished."""
        found: list[Violation] = []
        if rec.status in ("unfinished", "unknown"):
            return [Violation(plan.job_id, rec.workflow_id, f"did not end while the soak waited ({rec.status})")]
        if report is None:
            return [Violation(plan.job_id, rec.workflow_id, f"ended {rec.status} without a report")]
        found += self._report_books(plan, rec, report)
        entries = {**earlier, **{e["key"]: e for e in report["files"]}}
        if rec.status == "succeeded" and plan.spec.get("incremental") is None:
            expected = {*plan.files, *plan.missing}
            if set(entries) != expected:
                missing = sorted(expected - set(entries))[:3]
                found.append(Violation(plan.job_id, rec.workflow_id, f"succeeded without listing {missing}"))
        places = folders(self._keys, rec.output_prefix)
        for entry in entries.values():
            found += self._file(plan, rec, entry, places)
        return found

    def _report_books(self, plan: JobPlan, rec: RunRecord, report: dict[str, Any]) -> list[Violation]:
        found: list[Violation] = []
        where = f"{rec.workflow_id} report"
        files, totals = report["files"], report["totals"]
        keys = Counter(e["key"] for e in files)
        found += [Violation(plan.job_id, where, f"lists {k} {n} times") for k, n in keys.items() if n > 1]
        if totals["files_listed"] != len(files):
            found.append(Violation(plan.job_id, where, f"files_listed {totals['files_listed']}, {len(files)} files"))
        for status, name in STATUS_TOTALS.items():
            have = sum(1 for e in files if e["status"] == status)
            if totals.get(name, 0) != have:
                found.append(Violation(plan.job_id, where, f"{name} {totals.get(name)}, counted {have}"))
        for name in COUNTED:
            have = sum(int(e.get(name) or 0) for e in files)
            if int(totals.get(name) or 0) != have:
                found.append(Violation(plan.job_id, where, f"totals.{name} {totals.get(name)}, files sum to {have}"))
        if report.get("accounting_errors"):
            found.append(Violation(plan.job_id, where, f"accounting errors: {report['accounting_errors']}"))
        if rec.status != report["status"] and not (rec.status == "failed" and report["status"] == "cancelled"):
            found.append(Violation(plan.job_id, where, f"the workflow ended {rec.status}, its report says "
                                                         f"{report['status']}"))
        return found

    # ------------------------------------------------------------------ files

    def _file(self, plan: JobPlan, rec: RunRecord, entry: dict[str, Any],
              places: dict[str, list[str]]) -> list[Violation]:
        key, status = entry["key"], entry["status"]
        where = f"{key} ({status} in {rec.workflow_id})"
        found: list[Violation] = []

        def bad(message: str) -> None:
            found.append(Violation(plan.job_id, where, message))

        folder = layout.file_dir(rec.output_prefix, key)
        outs = read_folder(self.s3, folder, places.get(folder, [])) if folder in places else FileOutputs()
        source = plan.files.get(key)
        if source is None:
            if key not in plan.missing:
                bad("the report names a file the job was never given")
            elif outs.names or status not in (("failed", "cancelled", "not_started") if rec.status == "cancelled"
                                              else ("failed",)):
                # (a cancel may stop the job, or the group holding the key, before the key is tried)
                bad(f"a key the manifest names but S3 lacks should fail with nothing written; {outs.names[:3]}")
            return found
        version = source.version(_etag(entry.get("etag", "")))
        if version is None:
            bad(f"the report names version {entry.get('etag')!r}, never uploaded")
            return found
        self.counts.files += 1
        written = self._written(plan, version, outs, bad)
        rejected = self._rejected(plan, version, outs, bad)
        self._against_entry(plan, version, entry, written, rejected, bad)
        return found

    def _written(self, plan: JobPlan, version: Version, outs: FileOutputs, bad: Any) -> Counter[str]:
        by_rid = {r.rid: r for r in version.records}
        written: Counter[str] = Counter()
        if plan.sink in ("jsonl", "parquet"):
            found = [(part, record.get("rid"), record) for part, record in outs.records]
        else:
            table = self._tables.insert if plan.sink == "pg-insert" else self._tables.upsert
            found = [("the table", row[0], row) for row in table.get(_tag(version), [])]
        for where, rid, value in found:
            rec = by_rid.get(str(rid))
            if rec is None:
                bad(f"{where} holds a record of no line of this version: {str(value)[:200]}")
                continue
            expected = rec.value if plan.sink in ("jsonl", "parquet") else rec.row()
            if rec.fate(plan.sink) != "out":
                bad(f"record {rec.rid} (line {rec.line}) must be a reject, and is in {where}")
            elif _values(value) != expected:
                bad(f"record {rec.rid} (line {rec.line}) in {where} is {value!r}, the source says {expected!r}")
            written[rec.rid] += 1
        for rid, n in written.items():
            if n > 1:
                bad(f"record {rid} (line {by_rid[rid].line}) written {n} times")
        self.counts.records_written += sum(written.values())
        return written

    def _rejected(self, plan: JobPlan, version: Version, outs: FileOutputs, bad: Any) -> Counter[int]:
        by_line = {r.line: r for r in version.records}
        rejected: Counter[int] = Counter()
        for reject in outs.rejects:
            rec = by_line.get(reject.get("line"))  # type: ignore[arg-type]
            if rec is None:
                bad(f"a reject of no record's line: {str(reject)[:200]}")
                continue
            if rec.fate(plan.sink) != "reject":
                bad(f"record {rec.rid} (line {rec.line}) is good and was rejected: {str(reject.get('reason'))[:200]}")
            if not reject.get("reason"):
                bad(f"record {rec.rid} (line {rec.line}) rejected without a reason")
            rejected[rec.line] += 1
        for line, n in rejected.items():
            if n > 1:
                bad(f"record {by_line[line].rid} (line {line}) rejected {n} times")
        self.counts.rejected += sum(rejected.values())
        return rejected

    def _against_entry(self, plan: JobPlan, version: Version, entry: dict[str, Any], written: Counter[str],
                       rejected: Counter[int], bad: Any) -> None:
        status = entry["status"]
        out, rej = version.expected(plan.sink)
        n_written, n_rejected = sum(written.values()), sum(rejected.values())
        if status == "not_started":
            if n_written or n_rejected:
                bad(f"never started, yet {n_written} records written and {n_rejected} rejected")
            return
        parts = ("records_written", "already_written", "rejected", "dropped")  # already written: an earlier job's
        if int(entry.get("records") or 0) != sum(int(entry.get(name) or 0) for name in parts):
            bad(f"records {entry.get('records')} != written + already written + rejected + dropped in its own entry")
        if status == "succeeded":
            self._complete(plan, version, entry, written, rejected, out, rej, bad)
            return
        if plan.sink != "pg-upsert" and n_written != int(entry.get("records_written") or 0):
            first = _first_missing(out, written) if n_written < int(entry.get("records_written") or 0) else None
            bad(f"reports {entry.get('records_written')} records written, the output holds {n_written}"
                + (f" (the first not there: {first.rid}, line {first.line})" if first else ""))
        if n_rejected != int(entry.get("rejected") or 0):
            bad(f"reports {entry.get('rejected')} rejected, its rejects files hold {n_rejected}")

    def _complete(self, plan: JobPlan, version: Version, entry: dict[str, Any], written: Counter[str],
                  rejected: Counter[int], out: list[Rec], rej: list[Rec], bad: Any) -> None:
        if plan.sink == "pg-upsert":
            last: dict[str | None, Rec] = {}
            for r in out:
                last[r.row()[1]] = r
            have = {row[0] for row in self._tables.upsert.get(_tag(version), [])}
            for r in last.values():
                if r.rid not in have:
                    bad(f"record {r.rid} (line {r.line}), the last of its key {r.row()[1]}, is not the key's row")
                    break
        else:
            first = _first_missing(out, written)
            if first is not None:
                missing = sum(1 for r in out if not written[r.rid])
                bad(f"succeeded, but record {first.rid} (line {first.line}) is not in its output "
                    f"({missing} records missing)")
        missing_rejects = [r for r in rej if not rejected[r.line]]
        if missing_rejects:
            r = missing_rejects[0]
            bad(f"succeeded, but record {r.rid} (line {r.line}), which must be rejected, is not in its rejects "
                f"({len(missing_rejects)} missing)")
        if int(entry.get("records") or 0) != len(version.records):
            bad(f"reports {entry.get('records')} records read, the file holds {len(version.records)}")
        already = entry.get("already_written")
        expect_written = 0 if already is not None else len(out)
        if int(entry.get("records_written") or 0) != expect_written or (already is not None and already != len(out)):
            bad(f"reports {entry.get('records_written')} written (already written: {already}), "
                f"the file has {len(out)} records to write")
        if int(entry.get("rejected") or 0) != len(rej):
            bad(f"reports {entry.get('rejected')} rejected, the file has {len(rej)} records to reject")

    # ------------------------------------------------------------------ incremental jobs

    def check_incremental(self, plan: JobPlan) -> list[Violation]:
        found: list[Violation] = []
        done: Counter[tuple[str, str]] = Counter()
        for rec in plan.records:
            report = read_report(self.s3, rec.output_prefix)
            found += self.check_run(plan, rec, report, {})
            for entry in (report or {}).get("files", []):
                if entry["status"] == "succeeded":
                    done[(entry["key"], _etag(entry["etag"]))] += 1
        for (key, etag), n in done.items():
            if n > 1:
                found.append(Violation(plan.job_id, key, f"version {etag} processed by {n} runs of the ledger"))
        last = plan.records[-1] if plan.records else None
        quiet = last is not None and last.status == "succeeded" and len(plan.records) > plan.runs
        if quiet:
            for key, source in plan.files.items():
                if not done[(key, source.current.etag)]:
                    found.append(Violation(plan.job_id, key, f"its last version {source.current.etag} was never "
                                                             "processed, and the ledger's last run found nothing"))
        return found


def _first_missing(out: list[Rec], written: Counter[str]) -> Rec | None:
    return next((r for r in out if not written[r.rid]), None)


def _values(value: Any) -> Any:
    """A table row as :meth:`Rec.row` gives it (a list from JSON or a tuple from the database alike)."""
    return tuple(value) if isinstance(value, list | tuple) else value


@dataclass
class Reprocessed:
    """Records the ``soak_count`` handler handled, and those it handled more than once (from its count file)."""

    handled: int = 0
    again: int = 0
    chunks_again: int = 0
    jobs: set[str] = field(default_factory=set)


def reprocessed(lines: list[str]) -> Reprocessed:
    seen: dict[tuple[str, ...], int] = {}
    result = Reprocessed()
    for line in lines:
        parts = line.rstrip("\n").split("\t")
        if len(parts) != 6:
            continue
        n = int(parts[5])
        result.handled += n
        where = (parts[0].removesuffix("-redrive"), *parts[1:5])  # a redrive goes on with its job's chunks
        if where in seen:
            result.again += n
            result.chunks_again += 1
        else:
            seen[where] = n
        result.jobs.add(parts[0])
    return result

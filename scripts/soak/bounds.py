"""Nothing written where no job may write: every key of the output bucket lies under a job's output prefix, in
a place that job writes (a listed file's folder, its report and state, an incremental job's ledger and runs);
the source bucket holds only what the soak uploaded; every table row belongs to a file of a job writing that
table, and the database holds no table but the soak's and the checkpoint table."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from s3batch import layout
from scripts.soak.outputs import Tables

if TYPE_CHECKING:
    from scripts.soak.checker import Violation
    from scripts.soak.kinds import JobPlan

_JOB_FILES = re.compile(r"_report\.json|_report\.before-redrive-[^/]+\.json|_s3batch/.+")
_OUTPUT_NAME = re.compile(r"(part|rejects)-(\d{3}-)?\d{5,}\.(jsonl|parquet)")


def _in_run(plan: JobPlan, inner: str) -> bool:
    """Whether ``inner`` (a key below a run's output prefix) is one a run of ``plan`` writes."""
    if _JOB_FILES.fullmatch(inner):
        return True
    folder, _, name = inner.rpartition("/")
    if not _OUTPUT_NAME.fullmatch(name):
        return False
    return any(folder == layout.encode_key(key) for key in (*plan.files, *plan.missing))


def _allowed(plan: JobPlan, rest: str) -> bool:
    if plan.spec.get("incremental") is None:
        return _in_run(plan, rest)
    if rest.startswith("ledger/"):
        return True
    runs = {rec.workflow_id for rec in plan.records}
    parts = rest.split("/", 2)
    return len(parts) == 3 and parts[0] == "runs" and parts[1] in runs and _in_run(plan, parts[2])


def bounds(plans: list[JobPlan], out_keys: list[str], src_keys: list[str], tables: Tables) -> list[Violation]:
    from scripts.soak.checker import Violation

    found: list[Violation] = []
    by_prefix = {plan.prefix: plan for plan in plans}
    for key in out_keys:
        first, _, rest = key.partition("/")
        plan = by_prefix.get(first + "/")
        if plan is None or not _allowed(plan, rest):
            found.append(Violation(plan.job_id if plan else "-", "output bucket", f"{key!r}: written where no job "
                                                                                 "writes"))
    uploaded = {key for plan in plans for key in plan.files} | {p.manifest[0] for p in plans if p.manifest}
    found += [Violation("-", "source bucket", f"{key!r}: not uploaded by the soak") for key in src_keys
              if key not in uploaded]
    tags = {}
    for plan in plans:
        for source in plan.files.values():
            for version in source.versions:
                if version.records:
                    tags[version.records[0].rid.rpartition(":")[0]] = plan
    for sink, rows in (("pg-insert", tables.insert), ("pg-upsert", tables.upsert)):
        for tag, found_rows in rows.items():
            owner = tags.get(tag)
            if owner is None or owner.sink != sink:
                found.append(Violation(owner.job_id if owner else "-", f"table of {sink}",
                                       f"{len(found_rows)} rows of {tag!r}, no file of a job writing it"))
    found += [Violation("-", "database", f"table {name} created") for name in tables.others]
    return found

"""The report's books checked from outside (the tests' oracle): every listed key in the report once, the
per-status counts equal to the totals, the keys' digest equal to the listing's (``s3batch.accounting``).
The job checks the same of itself while it writes the report (``s3batch.report_store``), with bounded memory."""

from __future__ import annotations

from s3batch.accounting import key_digest


def report_problems(files: list[dict[str, object]], totals: dict[str, int], listed_digest: int | None) -> list[str]:
    """What is wrong with a job report's file list, given the job's totals (empty when the books agree).

    Every listed key must be in the report exactly once, and the per-status counts must be the totals.
    """
    problems: list[str] = []
    keys = [str(f.get("key")) for f in files]
    if len(keys) != totals.get("files_listed"):
        problems.append(f"the report lists {len(keys)} files, but the job listed {totals.get('files_listed')}")
    repeated = len(keys) - len(set(keys))
    if repeated:
        problems.append(f"{repeated} key(s) appear more than once in the report")
    for status in ("succeeded", "failed", "cancelled", "not_started"):
        counted = sum(1 for f in files if f.get("status") == status)
        if counted != totals.get(f"files_{status}"):
            problems.append(f"the report has {counted} {status} files, the totals say {totals.get(f'files_{status}')}")
    if listed_digest is not None and key_digest(keys) != listed_digest:
        problems.append("the report's keys are not the keys the job listed")
    return problems

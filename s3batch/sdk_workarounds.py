"""A defect of the Temporal Python SDK that breaks a running job, and what a worker does about it.

**Legacy queries apply history the workflow has not seen** (temporalio 1.35; its Rust core). A query that reaches a
worker which has not got the run in its cache (its own worker died: the query goes to any worker of the task queue)
is answered after the worker rebuilds the run from its history; when that history ends with events no workflow task
has handled yet (a file activity's completion, in the seconds of a takeover), the core applies them as a workflow
task of their own (``HistoryUpdate::take_next_wft_sequence``). The workflow reacts to them, and the commands it then
issues are sent with the next real workflow task, which holds the events that came meanwhile: the history records
``upsert, timer, upsert`` where its replay, handling both completions in one activation, gives ``upsert, upsert``.
The run goes on; the next time a worker replays it, its workflow task fails with a nondeterminism error and the job
stops until reset (docs/explanation/guarantees.md, "Queries while a worker takes over").

The work-around: once a worker has answered a legacy query, it evicts that run from its cache. The next workflow task
rebuilds the run from the history alone, so the commands come from the activations a replay gives, and what the
query's rebuild applied is dropped with it. A run is rebuilt once more per legacy query (they come only while a run
has no worker of its own); the queries sticky to a run's worker, the usual ones, are untouched.

It patches a private method of the SDK's workflow worker, so it checks what it patches and leaves the SDK as it is,
with a warning, when that is not there (another SDK version).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

LEGACY_QUERY_ID = "legacy_query"
"""The query ID the SDK's core gives the query of a legacy query task (``temporal_sdk_core``'s ``LEGACY_QUERY_ID``)."""

_PATCHED = "_s3batch_evicts_after_legacy_queries"


def is_legacy_query(activation: Any) -> bool:
    """The activation answers a legacy query (a query task on its own, not a query sent with a workflow task)."""
    return any(
        job.HasField("query_workflow") and job.query_workflow.query_id == LEGACY_QUERY_ID for job in activation.jobs
    )


def evict_after_legacy_queries() -> bool:
    """Make every workflow worker of this process evict a run once it has answered a legacy query of it; True once
    in place (idempotent), False when this SDK has not got what it patches (nothing is changed then)."""
    try:
        from temporalio.worker import _workflow
    except ImportError:  # pragma: no cover - the SDK always has it in the pinned versions
        return _not_patched("temporalio.worker._workflow")
    worker_class = getattr(_workflow, "_WorkflowWorker", None)
    original = getattr(worker_class, "_handle_activation", None)
    if worker_class is None or original is None:
        return _not_patched("_WorkflowWorker._handle_activation")
    if getattr(original, _PATCHED, False):
        return True

    async def handle_activation(self: Any, act: Any) -> None:
        legacy = is_legacy_query(act)
        await original(self, act)
        if legacy:
            bridge = getattr(self, "_bridge_worker", None)
            core = bridge() if bridge is not None else None
            evict: Callable[[str], None] | None = getattr(core, "request_workflow_eviction", None)
            if evict is not None:
                try:
                    evict(act.run_id)
                except RuntimeError as err:  # the bridge's errors: a failed eviction must not stop the worker
                    logger.warning("could not evict run %s after a legacy query: %s", act.run_id, err)

    setattr(handle_activation, _PATCHED, True)
    worker_class._handle_activation = handle_activation
    return True


def _not_patched(missing: str) -> bool:
    logger.warning(
        "this Temporal SDK has no %s: runs rebuilt to answer a legacy query stay cached (the query hazard of "
        "docs/explanation/guarantees.md is not worked around)",
        missing,
    )
    return False

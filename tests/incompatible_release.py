"""A stand-in for a new release whose workflow change is incompatible with running jobs and NOT behind
``workflow.patched``: its ``S3BatchWorkflow`` starts every run with a timer, a command no recorded history
of the current code has where it expects its first activity. A worker of this release that replayed a
run started by the current code would fail that run's workflow task (non-determinism); with Worker
Versioning it never gets one.

Loaded into a worker subprocess as a handler module (``S3BATCH_HANDLER_MODULES=...,tests.incompatible_release``):
the worker imports handler modules before it builds its plugin, and importing this one makes the plugin
register :class:`IncompatibleWorkflow` in place of ``S3BatchWorkflow`` (same workflow type name).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from s3batch.workflows.batch import S3BatchWorkflow

    from s3batch.messages import S3BatchResult

RELEASE_TIMER = timedelta(milliseconds=1)


@workflow.defn(name="S3BatchWorkflow")
class IncompatibleWorkflow(S3BatchWorkflow):
    @workflow.run
    async def run(self, job: Any = None, state: Any = None) -> S3BatchResult:
        await workflow.sleep(RELEASE_TIMER)  # the incompatible change: a new first command
        return await super().run(job, state)


def _install() -> None:
    import s3batch.plugin

    s3batch.plugin.S3BatchWorkflow = IncompatibleWorkflow  # type: ignore[misc]


if not workflow.unsafe.in_sandbox():
    _install()

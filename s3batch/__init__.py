"""s3batch: durable, resumable processing of files stored in S3, as a Temporal plugin.

Everything installs under this one namespace. The public API, importable from the top::

    from s3batch import S3BatchPlugin, S3BatchWorkflow, S3BatchInput

is re-exported lazily (importing ``s3batch`` imports none of it), so the modules can import
``s3batch`` constants without import cycles:

- :mod:`s3batch.models`: the data contracts shared by the workflow, activities and clients.
- :mod:`s3batch.handlers`: the handler registry (``passthrough``, ``customers``, your own).
- :mod:`s3batch.plugin`: :class:`~s3batch.plugin.S3BatchPlugin` for ``plugins=[...]``.
- :mod:`s3batch.workflows.batch`: ``S3BatchWorkflow``; :mod:`s3batch.activities.s3_activities`:
  its activities; :mod:`s3batch.worker`: the ``s3batch-worker`` program (a runner over the plugin).
- :mod:`s3batch.config`: ``Settings``, the one reader of the ``S3BATCH_*`` environment.
- :mod:`s3batch.dev`: developer tooling (the local stack, sample data); no runtime module imports it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

TASK_QUEUE = "s3-batch"
"""Default task queue of the s3batch workflow and activities."""

WORKFLOW_TYPE = "S3BatchWorkflow"
"""Workflow type name, the one to pass to ``temporal workflow start --type``."""

DEFAULT_DEPLOYMENT_NAME = "s3batch"
"""The Worker Deployment of a versioned worker given a build ID and no deployment name (:mod:`s3batch.versioning`)."""

_EXPORTS = {
    "S3BatchPlugin": "s3batch.plugin",
    "S3BatchWorkflow": "s3batch.workflows.batch",
    "S3Activities": "s3batch.activities.s3_activities",
    "S3BatchInput": "s3batch.models",
    "S3BatchResult": "s3batch.messages",
    "Progress": "s3batch.messages",
    "record_handler": "s3batch.handlers",
    "chunk_handler": "s3batch.handlers",
    "HandlerResult": "s3batch.handlers",
    "Reject": "s3batch.handlers",
    "Record": "s3batch.formats.common",
}

__all__ = [
    "TASK_QUEUE",
    "WORKFLOW_TYPE",
    "HandlerResult",
    "Progress",
    "Record",
    "Reject",
    "S3Activities",
    "S3BatchInput",
    "S3BatchPlugin",
    "S3BatchResult",
    "S3BatchWorkflow",
    "chunk_handler",
    "record_handler",
]

if TYPE_CHECKING:
    from s3batch.activities.s3_activities import S3Activities
    from s3batch.formats.common import Record
    from s3batch.handlers import HandlerResult, Reject, chunk_handler, record_handler
    from s3batch.messages import Progress, S3BatchResult
    from s3batch.models import S3BatchInput
    from s3batch.plugin import S3BatchPlugin
    from s3batch.workflows.batch import S3BatchWorkflow


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 's3batch' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value

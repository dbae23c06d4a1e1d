"""s3batch: durable, resumable processing of files stored in S3, as a Temporal plugin.

The public pieces live in their own modules so that importing one does not pull in the others:

- :mod:`s3batch.models`: the data contracts shared by the workflow, activities and clients.
- :mod:`s3batch.handlers`: the handler registry (``passthrough``, ``customers``, your own).
- :mod:`s3batch.plugin`: :class:`~s3batch.plugin.S3BatchPlugin` for ``plugins=[...]``.
"""

__version__ = "0.1.0"

TASK_QUEUE = "s3-batch"
"""Default task queue of the s3batch workflow and activities."""

WORKFLOW_TYPE = "S3BatchWorkflow"
"""Workflow type name, the one to pass to ``temporal workflow start --type``."""

"""``s3batch.workflows``: the workflow of s3batch (installed under the ``s3batch`` namespace)."""

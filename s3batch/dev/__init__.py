"""Developer tooling, not runtime code: the local stack (:mod:`s3batch.dev.stack`; its command
``s3batch-stack`` is :mod:`s3batch.dev.stack_cli`)
and the deterministic sample data (:mod:`s3batch.dev.sample_data`) used by the demo, the benchmark
and the tests. Nothing under ``s3batch`` outside this package imports it.
"""

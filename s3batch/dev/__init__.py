"""Developer tooling, not runtime code: the local stack (:mod:`s3batch.dev.stack`; its command
``s3batch-stack`` is :mod:`s3batch.dev.stack_cli`), the deterministic sample data
(:mod:`s3batch.dev.sample_data`) used by the demo, the benchmark and the tests, worker subprocesses
(:mod:`s3batch.dev.workers`), a throwaway PostgreSQL server (:mod:`s3batch.dev.postgres`) and the HTTP
fault proxy in front of the S3 server (:mod:`s3batch.dev.faultproxy`: the fault tests and the soak).
Nothing under ``s3batch`` outside this package imports it.
"""

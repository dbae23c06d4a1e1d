"""Run the s3batch worker from a checkout: ``python worker.py`` (installed: ``s3batch-worker``).

The worker itself is :mod:`s3batch.worker`; this file only keeps the repository's prescribed layout.
"""

from s3batch.worker import main

if __name__ == "__main__":
    main()

"""The s3batch worker: runs ``S3BatchWorkflow`` and its activities until SIGTERM/SIGINT.

Configuration comes from the environment, read once by :class:`~s3batch.config.Settings`; the
worker itself is :class:`~s3batch.plugin.S3BatchPlugin` on a ``temporalio`` worker. On SIGTERM (a deploy,
``docker stop``) the worker stops polling at once; files in flight stop at their next chunk boundary,
checkpoint, and continue on another worker about a second later.

With ``S3BATCH_WORKER_PROCESSES`` (default: the container's cores) above 1, ``main`` runs
:class:`~s3batch.supervisor.Supervisor` instead, which starts that many of these workers, one per core.

``--deployment-name`` and ``--build-id`` (also ``s3batch worker ...``) set ``S3BATCH_DEPLOYMENT_NAME``
and ``S3BATCH_BUILD_ID`` for this process and its worker processes: the worker polls as that version
of a Worker Deployment (Worker Versioning, :mod:`s3batch.versioning`); without either, unversioned.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from datetime import timedelta

from temporalio.worker import Worker

from s3batch import logs
from s3batch.cli.parser import add_version_flags
from s3batch.codec import KeyringError
from s3batch.config import Settings, connect, metrics_runtime
from s3batch.health import HealthReporter
from s3batch.plugin import S3BatchPlugin
from s3batch.supervisor import SUPERVISOR_PID_ENV, Supervisor, die_with_parent
from s3batch.versioning import describe

log = logging.getLogger("s3batch.worker")

SECRET_VARIABLES = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "TEMPORAL_API_KEY",
    "S3BATCH_ENCRYPTION_KEY",
    "S3BATCH_ENCRYPTION_KEYS",
    "S3BATCH_CODEC_TOKEN",
    "S3BATCH_CHECKPOINT_SECRET",
)
"""Variables holding secrets the worker (or a process sharing its environment) uses."""

PLACEHOLDER_MARKS = ("change-me", "changeme", "change_me", "replace-me", "replaceme", "example")
"""A secret containing one of these (any case) is an example value: ``.env.example`` ships
``change-me-...`` values, and AWS's documentation keys end in ``EXAMPLE`` / ``EXAMPLEKEY``."""


def placeholder_secrets(environ: Mapping[str, str] | None = None) -> list[str]:
    """The names (never the values) of the secret variables that still hold an example value."""
    env = os.environ if environ is None else environ
    return [
        name
        for name in SECRET_VARIABLES
        if any(mark in env.get(name, "").lower() for mark in PLACEHOLDER_MARKS)
    ]


async def run_worker(settings: Settings, stop: asyncio.Event) -> None:
    """Connect, run the worker until ``stop`` is set, then shut down gracefully.

    Everything s3batch needs on a worker (workflow, activities, data converter and codec, thread
    pool, heartbeat throttle, search attributes) comes from :class:`S3BatchPlugin`; this runner adds
    the process around it: settings, metrics, the health file and the drain on SIGTERM.
    """
    settings.import_handler_modules()
    plugin = S3BatchPlugin.from_settings(settings)
    log.info("worker version: %s", describe(plugin.deployment_version))
    runtime = metrics_runtime(settings.metrics_address) if settings.metrics_address else None
    client = await connect([plugin], runtime)
    worker = Worker(
        client,
        task_queue=settings.task_queue,
        max_concurrent_activities=settings.max_concurrent_files,
        graceful_shutdown_timeout=timedelta(seconds=settings.graceful_shutdown_seconds),
        # When a worker dies, its cached workflows move to another worker after this (default 10 s).
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=3),
    )
    # The health reporter exits first: the worker reports unhealthy as soon as it stops polling.
    async with worker, HealthReporter.from_env(client, worker, task_queue=settings.task_queue):
        version = plugin.deployment_version
        log.info(
            "worker polling task queue %r on %s (namespace %s), %d file slots, pid %d, %s",
            settings.task_queue,
            client.service_client.config.target_host,
            client.namespace,
            settings.max_concurrent_files,
            os.getpid(),
            f"version {version.deployment_name}:{version.build_id}" if version else "unversioned",
        )
        if settings.metrics_address:
            log.info("Prometheus metrics at http://%s/metrics", settings.metrics_address)
        await stop.wait()
        log.info("shutting down: in-flight files stop at their next chunk boundary and move on")
    log.info("worker stopped")


def set_version_flags(args: argparse.Namespace) -> None:
    """The flags as the variables they stand for, so the worker processes of a supervisor get them too."""
    if args.deployment_name is not None:
        os.environ["S3BATCH_DEPLOYMENT_NAME"] = args.deployment_name
    if args.build_id is not None:
        os.environ["S3BATCH_BUILD_ID"] = args.build_id


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="s3batch-worker",
        description="Run the s3batch worker (configuration: the environment, see docs/reference/environment.md).",
    )
    add_version_flags(parser)
    supervisor_pid = os.environ.get(SUPERVISOR_PID_ENV)
    if supervisor_pid:
        die_with_parent(int(supervisor_pid))  # first: no child may outlive a killed supervisor
    set_version_flags(parser.parse_args(argv))
    settings = Settings()
    placeholders = placeholder_secrets()
    if placeholders:
        # A deployment started from the example file as is would run with secrets anyone can read.
        sys.exit(
            f"s3batch-worker: {', '.join(placeholders)} still hold{'s' if len(placeholders) == 1 else ''} the "
            "example value (it contains 'change-me' or 'example'): set real secrets (for docker compose, in .env; "
            "see .env.example) and start again"
        )
    try:
        # Read the keyring before anything connects: a bad key stops the worker with one clear line.
        settings.keyring()
        settings.allow_plaintext()
    except KeyringError as err:
        sys.exit(f"s3batch-worker: the encryption settings are not usable: {err}")
    logs.configure(settings.log_level, settings.log_format)
    processes = 1 if supervisor_pid else settings.processes()
    if processes > 1:
        # No Temporal runtime exists in this process: it only starts, watches and stops the workers.
        sys.exit(Supervisor(settings, processes).run())
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        loop.run_until_complete(run_worker(settings, stop))
    finally:
        loop.close()
    # The Temporal core runtime's threads can abort interpreter finalisation (temporalio/sdk-python
    # issue 300, exit 134); the drain is complete here, so leave without finalising.
    logging.shutdown()
    os._exit(0)


if __name__ == "__main__":
    main()

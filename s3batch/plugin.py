"""``S3BatchPlugin``: add s3batch to your own Temporal client and worker with ``plugins=[...]``.

The plugin does all of s3batch's worker-side set-up, so a worker of yours gets exactly what the
``s3batch-worker`` program gets (that program is a thin runner over this plugin)::

    client = await Client.connect("localhost:7233")
    worker = Worker(client, task_queue="s3-batch", plugins=[S3BatchPlugin()])

On a worker it registers ``S3BatchWorkflow`` and the activities, gives the worker the s3batch data
converter (pydantic, and the encryption codec with a key) even when its client has another one,
gives the synchronous activities a thread pool when the worker has none, shortens the heartbeat
throttle (progress and cancellation reach a running file within seconds), and registers s3batch's
search attributes when the worker starts. On a client (``Client.connect(plugins=[...])``, which
also reaches every worker built from that client: give the plugin to one of the two) it installs
the data converter; on a ``Replayer``, the converter and the workflow.

With ``deployment_version`` (a ``WorkerDeploymentVersion``), every worker it configures polls as that
version of a Worker Deployment (Worker Versioning, see :mod:`s3batch.versioning`): each run of a job is
pinned to the version it started on. Without it, workers poll unversioned, as before.

It reads no environment variable: every setting is an argument. ``S3BatchPlugin.from_settings(
Settings())`` configures it from the ``S3BATCH_*`` variables, as ``s3batch-worker`` does.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from temporalio.client import Client
from temporalio.common import VersioningBehavior, WorkerDeploymentVersion
from temporalio.converter import DataConverter
from temporalio.plugin import SimplePlugin
from temporalio.worker import Worker, WorkerConfig, WorkerDeploymentConfig

from s3batch.config import Settings
from s3batch.converter import data_converter, encryption_codec
from s3batch.s3io import make_client
from s3batch.search_attributes import ensure_registered
from s3batch.versioning import check_version

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

    from s3batch.activities.s3_activities import S3Activities

DEFAULT_HEARTBEAT_THROTTLE = timedelta(seconds=2)
"""Longest gap between two heartbeats of a file reaching the server. The SDK's own default is 80 %
of the heartbeat timeout (24 s with s3batch's 30 s), and a cancellation or fresh progress reaches a
running file only with a heartbeat: at 2 s they land within a few seconds, for one small request
every 2 s per running file."""

_DEFAULT_ACTIVITY_SLOTS = 100  # the SDK's default max_concurrent_activities


def deployment_config(version: WorkerDeploymentVersion) -> WorkerDeploymentConfig:
    """A worker's ``deployment_config`` for ``version``: versioned polling, runs pinned by default.

    The behaviour is the worker's default rather than ``@workflow.defn(versioning_behavior=...)`` on
    ``S3BatchWorkflow``: an unversioned worker fails every workflow task of a workflow type that names
    one ("versioning behavior cannot be specified without deployment options"), and a plain ``python
    worker.py`` must go on working. A worker of yours given its own ``deployment_config`` must give
    ``default_versioning_behavior=PINNED`` (or its own choice) for ``S3BatchWorkflow`` too."""
    return WorkerDeploymentConfig(
        version=version, use_worker_versioning=True, default_versioning_behavior=VersioningBehavior.PINNED
    )


def _keyring(encryption_key: bytes | Sequence[bytes] | None) -> list[bytes]:
    if encryption_key is None:
        return []
    if isinstance(encryption_key, bytes):
        return [encryption_key] if encryption_key else []
    return list(encryption_key)


class S3BatchPlugin(SimplePlugin):
    """The s3batch workflow, activities, data converter and worker set-up as one Temporal plugin.

    Args:
        s3: The boto3 S3 client the activities use; by default one is built from boto3's own chain
            (``AWS_ENDPOINT_URL_S3``, ``AWS_REGION``, credentials) when a worker is configured, with a
            connection per activity slot and ``settings.expected_bucket_owner``.
        settings: The data-path settings of the activities (allow-lists, ceilings, output
            encryption, checkpoint secret); by default the defaults of :class:`~s3batch.config.Settings`,
            without reading the environment (``Settings.explicit(...)`` gives other values).
        encryption_key: 32-byte AES key, or a keyring (a list of keys, the first one current):
            every payload, and the message and stack trace of every failure, is encrypted before it
            reaches Temporal (see ``s3batch.codec`` and docs/explanation/security.md). None or ``b""``: off.
        allow_plaintext: With a key, accept payloads that are not encrypted instead of refusing
            them (only while jobs started before encryption was turned on still run).
        register_search_attributes: When a worker starts, register s3batch's search attributes in
            its namespace where the server allows it (jobs can then be filtered in the Web UI; the
            workflow upserts them only when they exist).
        heartbeat_throttle: Longest gap between two heartbeats reaching the server (default
            :data:`DEFAULT_HEARTBEAT_THROTTLE`, 2 s): how soon a cancellation and fresh progress reach
            a running file. A worker given a shorter throttle keeps its own; for a longer one (fewer
            heartbeat requests, slower cancellation), give it here.
        deployment_version: The Worker Deployment Version (deployment name and build ID) the workers
            poll as, with Worker Versioning, their runs pinned by default; None: unversioned. A worker
            given its own ``deployment_config`` keeps it (give it ``default_versioning_behavior``).
    """

    def __init__(
        self,
        s3: S3Client | None = None,
        *,
        settings: Settings | None = None,
        encryption_key: bytes | Sequence[bytes] | None = None,
        allow_plaintext: bool = False,
        register_search_attributes: bool = True,
        heartbeat_throttle: timedelta = DEFAULT_HEARTBEAT_THROTTLE,
        deployment_version: WorkerDeploymentVersion | None = None,
    ) -> None:
        if heartbeat_throttle <= timedelta(0):
            raise ValueError(f"heartbeat_throttle must be positive, got {heartbeat_throttle}")
        if deployment_version is not None:
            check_version(deployment_version)
        self.deployment_version = deployment_version
        """The Worker Deployment Version of the workers this plugin configures; None: unversioned."""
        self._s3 = s3
        self.settings = settings if settings is not None else Settings.explicit()
        """The activities' data-path settings."""
        self._activities: S3Activities | None = None
        self._pool_slots = _DEFAULT_ACTIVITY_SLOTS
        self._keys = _keyring(encryption_key)
        """The keyring (first = current), ``[]`` without encryption: the activities hash
        ``S3BatchSource`` with it."""
        self.codec = encryption_codec(self._keys, allow_plaintext=allow_plaintext)
        """The encryption codec, or None when encryption is off."""
        self.register_search_attributes = register_search_attributes
        self.heartbeat_throttle = heartbeat_throttle
        self._executors: set[Executor] = set()
        """Thread pools this plugin made for workers, shut down when their worker stops."""
        super().__init__(
            "s3batch",
            data_converter=self._data_converter,
            workflows=self._add_workflows,
            activities=self._add_activities,
        )

    @classmethod
    def from_settings(cls, settings: Settings, s3: S3Client | None = None) -> S3BatchPlugin:
        """The plugin as ``s3batch-worker`` configures it: keyring, strict mode, heartbeat throttle,
        worker version and data-path settings from ``settings`` (``Settings()`` reads the
        ``S3BATCH_*`` variables).

        Raises:
            KeyringError: The encryption settings are not usable (the message names the variable).
        """
        throttle = settings.heartbeat_throttle_seconds
        return cls(
            s3,
            settings=settings,
            encryption_key=settings.keyring(),
            allow_plaintext=settings.allow_plaintext(),
            heartbeat_throttle=DEFAULT_HEARTBEAT_THROTTLE if throttle is None else timedelta(seconds=throttle),
            deployment_version=settings.worker_version(),
        )

    @property
    def s3_activities(self) -> S3Activities:
        """The activities object (built on first use)."""
        if self._activities is None:
            s3 = self._s3
            if s3 is None:
                # One client for all activity threads, with a connection per slot and a few more.
                s3 = make_client(self._pool_slots + 4, expected_bucket_owner=self.settings.expected_bucket_owner)
            from s3batch.activities.s3_activities import S3Activities

            self._activities = S3Activities(s3, self.settings)
            self._activities.source_keys = self._keys
        return self._activities

    def _data_converter(self, existing: DataConverter | None) -> DataConverter:
        return data_converter(existing, self.codec)

    def _add_workflows(self, existing: Sequence[type] | None) -> list[type]:
        # Imported here, with the activities: a client given the plugin (s3batch status) needs only the data
        # converter, not the workflow's and activities' imports (pyarrow, psycopg, obstore: about 0.5 s).
        from s3batch.sdk_workarounds import evict_after_legacy_queries
        from s3batch.workflows.batch import S3BatchWorkflow

        evict_after_legacy_queries()  # a worker that runs the workflow: the SDK's query hazard, worked around
        return [*(existing or []), S3BatchWorkflow]

    def _add_activities(self, existing: Sequence[Callable[..., Any]] | None) -> list[Callable[..., Any]]:
        acts = self.s3_activities
        return [
            *(existing or []),
            acts.check_job,
            acts.list_objects,
            acts.process_file,
            acts.process_group,
            acts.after_success,
            acts.write_report_segment,
            acts.write_report,
            acts.list_incremental,
            acts.write_ledger,
        ]

    def configure_worker(self, config: WorkerConfig) -> WorkerConfig:
        slots = config.get("max_concurrent_activities") or _DEFAULT_ACTIVITY_SLOTS
        self._pool_slots = slots
        config = super().configure_worker(config)
        # A worker decodes with its client's converter: one of a client connected without this
        # plugin gets a copy of the client with s3batch's converter (same connection and namespace).
        client = config.get("client")
        if client is not None:
            config["client"] = self._worker_client(client)
        if config.get("activity_executor") is None:
            executor = ThreadPoolExecutor(max_workers=slots, thread_name_prefix="s3batch")
            self._executors.add(executor)
            config["activity_executor"] = executor
        # Progress and cancellation reach a running file only with a heartbeat (see the constant).
        config["max_heartbeat_throttle_interval"] = self._throttle(config.get("max_heartbeat_throttle_interval"))
        default = config.get("default_heartbeat_throttle_interval")
        config["default_heartbeat_throttle_interval"] = self._throttle(default)
        versioned = config.get("deployment_config") or config.get("build_id") or config.get("use_worker_versioning")
        if self.deployment_version is not None and not versioned:
            config["deployment_config"] = deployment_config(self.deployment_version)
        return config

    def _throttle(self, current: timedelta | None) -> timedelta:
        # The SDK's defaults (60 s, 30 s) are lowered; a worker asking for a shorter one keeps it.
        return self.heartbeat_throttle if current is None else min(current, self.heartbeat_throttle)

    def _worker_client(self, client: Client) -> Client:
        current = client.data_converter
        wanted = self._data_converter(current)
        if wanted is current:
            return client
        config = client.config(active_config=True)
        config["data_converter"] = wanted
        config["plugins"] = []  # the client's plugins have already shaped this configuration
        return Client(**config)

    async def run_worker(self, worker: Worker, next: Callable[[Worker], Awaitable[None]]) -> None:
        if self.register_search_attributes:
            # Before the worker polls: a job's check reports whether the attributes exist.
            self.s3_activities.search_attributes_registered = await ensure_registered(worker.client)
        try:
            await super().run_worker(worker, next)
        finally:
            executor = worker.config(active_config=True).get("activity_executor")
            if executor in self._executors:
                assert executor is not None
                self._executors.discard(executor)
                executor.shutdown(wait=False)
            if self._activities is not None:
                self._activities.close()  # the PostgreSQL pools (postgres sinks)

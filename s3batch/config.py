"""Settings of the worker and the client command, from the environment.

Temporal's own variables (``TEMPORAL_ADDRESS``, ``TEMPORAL_NAMESPACE``, ``TEMPORAL_API_KEY``,
``TEMPORAL_TLS_*``, ``TEMPORAL_PROFILE`` and the ``temporal.toml`` profiles) are read by
``temporalio.envconfig``, the same way the ``temporal`` CLI reads them; S3 settings come from
boto3's own chain. Only s3batch's own knobs are ``S3BATCH_*`` variables.
"""

from __future__ import annotations

import importlib
import math
import os
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict
from temporalio.client import Client
from temporalio.common import WorkerDeploymentVersion
from temporalio.envconfig import ClientConfig
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

from s3batch import TASK_QUEUE, versioning
from s3batch.fielddocs import Documented
from s3batch.incremental import DEFAULT_MAX_LEDGER_BYTES
from s3batch.sinks.spec import postgres_variable


class PostgresConnection(Documented, BaseModel):
    """The settings of a PostgreSQL connection besides its DSN (docs/explanation/security.md, "The PostgreSQL
    sink"). From the environment, for connection ``warehouse``: ``S3BATCH_POSTGRES_WAREHOUSE_LOCK_TIMEOUT_SECONDS``,
    ``..._STATEMENT_TIMEOUT_SECONDS``, ``..._IDLE_IN_TRANSACTION_TIMEOUT_SECONDS``, ``..._TABLES``. The timeouts
    are the sessions' ``lock_timeout``, ``statement_timeout`` and ``idle_in_transaction_session_timeout``: keep
    the first two below the jobs' ``heartbeat_timeout_seconds`` (30 s by default), so a file blocked in the
    database fails its attempt (retried, from the database's checkpoint) before it is taken for a dead worker."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    lock_timeout_seconds: float = Field(10.0, gt=0, le=86_400)
    """Longest wait of one statement for a lock (a ``LOCK TABLE`` or ``ALTER TABLE`` of another session, the
    file's checkpoint row held): then the chunk is not committed and the file is retried (``SinkError``)."""
    statement_timeout_seconds: float = Field(20.0, gt=0, le=86_400)
    """Longest run of one statement (a chunk's ``COPY`` included): then the chunk is not committed and the file
    is retried (``SinkError``)."""
    idle_in_transaction_timeout_seconds: float = Field(60.0, gt=0, le=86_400)
    """The server ends a session idle this long inside a transaction (a worker frozen or cut off while it holds
    a file's checkpoint row), so its locks do not outlive it."""
    tables: str = ""
    """Comma-separated globs of ``schema.table`` a job may write through this connection (``public.*``,
    ``staging.orders_*``); empty: any. The system schemas (``pg_catalog``, ``information_schema``, ``pg_*``) and
    the checkpoint table itself are always refused."""

    def table_globs(self) -> list[str]:
        """The globs of ``tables`` (empty: any table)."""
        return [g.strip() for g in self.tables.split(",") if g.strip()]


class Settings(Documented, BaseSettings):
    """s3batch settings; a bad value fails at start-up with the variable's name."""

    model_config = SettingsConfigDict(
        env_prefix="S3BATCH_", extra="ignore", validate_by_name=True
    )

    task_queue: str = TASK_QUEUE
    """The task queue the worker polls and ``s3batch start`` starts jobs on (``--task-queue`` overrides it)."""
    deployment_name: str = Field(
        "", validation_alias=AliasChoices("S3BATCH_DEPLOYMENT_NAME", "TEMPORAL_DEPLOYMENT_NAME")
    )
    """Worker Versioning: the Worker Deployment this worker belongs to (``S3BATCH_DEPLOYMENT_NAME``, else
    ``TEMPORAL_DEPLOYMENT_NAME``, as the Temporal Worker Controller sets it; no dot). Empty, and no build
    ID either: versioning off. See :mod:`s3batch.versioning`."""
    build_id: str = Field("", validation_alias=AliasChoices("S3BATCH_BUILD_ID", "TEMPORAL_WORKER_BUILD_ID"))
    """Worker Versioning: this worker's build ID (``S3BATCH_BUILD_ID``, else ``TEMPORAL_WORKER_BUILD_ID``);
    empty with a deployment name: the package version and the git commit baked into the image."""
    max_concurrent_files: int = Field(8, ge=1, le=1_000)
    """Activity slots of this worker (the whole container): files it processes at once. With several
    worker processes they are shared out between them."""
    worker_processes: int = Field(0, ge=0, le=256)
    """Worker processes this ``s3batch-worker`` runs, each on its own core; 0: the cores this
    process may use (CPU affinity, bounded by the container's cgroup CPU quota). Never more than
    ``max_concurrent_files``. 1: one process, no supervisor."""
    graceful_shutdown_seconds: float = Field(30.0, ge=0)
    """After SIGTERM, how long in-flight files get to reach a chunk boundary and hand over."""
    handler_modules: str = ""
    """Comma-separated modules to import at start-up; they register handlers with decorators."""
    log_level: str = "INFO"
    """The worker's log level: ``DEBUG``, ``INFO``, ``WARNING``, ``ERROR``."""
    log_format: Literal["text", "json"] = "text"
    """``json``: one JSON object per line, with the job ID, activity, attempt and file key."""
    metrics_address: str = ""
    """``host:port`` of the Prometheus ``/metrics`` endpoint (SDK and s3batch metrics); empty: off."""
    ui_url: str = ""
    """Base URL of the Temporal Web UI, for links (default: derived from TEMPORAL_ADDRESS)."""

    # The data path and the S3 side (docs/explanation/security.md): what a job input may make this worker do.
    expected_bucket_owner: str = Field("", pattern=r"^(\d{12})?$")
    """AWS account ID sent as ``ExpectedBucketOwner`` on every S3 request: a bucket of another
    account is refused by S3 (403) instead of read or written. Empty: not sent."""
    allowed_sources: str = ""
    """Comma-separated globs of ``bucket/prefix`` a job may read (``incoming/*``); empty: any."""
    allowed_outputs: str = ""
    """Comma-separated globs of ``bucket/prefix`` a job may write (``processed/runs/*``); empty: any."""
    output_sse: Literal["", "AES256", "aws:kms"] = ""
    """Server-side encryption asked for on every object the worker writes; empty: the bucket's default."""
    output_kms_key_id: str = ""
    """KMS key for ``output_sse=aws:kms`` (empty: the account's default ``aws/s3`` key)."""
    max_chunk_records: int = Field(1_000_000, ge=1)
    """Ceiling on a job's ``chunk_records``: a job asking for more fails with InvalidInput."""
    max_record_bytes: int = Field(64 * 1024 * 1024, ge=1_024)
    """Ceiling on a job's ``max_record_bytes``: a job asking for more fails with InvalidInput."""
    max_ledger_bytes: int = Field(DEFAULT_MAX_LEDGER_BYTES, ge=1_024)
    """The largest incremental ledger (``ledger.json``) a job may make this worker read: a bigger one
    fails the job with InvalidInput, unread (about 100 bytes per object uploaded within one window)."""
    max_chunk_bytes: int = Field(64 * 1024 * 1024, ge=1_024)
    """A chunk is closed early once its buffered output (parts and rejects) or its source bytes
    reach this: what one file holds in memory stays about this, whatever ``chunk_records`` is."""
    csv_fast_path: bool = True
    """Read UTF-8 CSV a block at a time with pyarrow where the block provably reads as the exact parser
    reads it (``s3batch.formats.fastcsv``); the same records, rejects and parts either way. False: the
    exact parser alone (``S3BATCH_CSV_FAST_PATH=false``)."""
    data_client: Literal["obstore", "boto3"] = "obstore"
    """The client of a file's data requests (its source's GETs, its parts' PUTs): obstore, about a tenth of
    boto3's CPU a request (``s3batch.objects``; boto3 where obstore is not installed), or boto3 for every
    request (``S3BATCH_DATA_CLIENT=boto3``). Listing, checkpoints, reports: boto3 either way."""
    checkpoint_secret: SecretStr = SecretStr("")
    """Key of the HMAC stored with each part's checkpoint; parts without a valid one are not trusted
    (reprocessed). Empty: checkpoints are trusted as read (anyone who can write the output prefix
    can forge them). The same on every worker."""

    heartbeat_throttle_seconds: float | None = Field(None, gt=0)
    """Longest gap between two heartbeats of a running file reaching the server: how soon a
    cancellation and fresh progress reach it (unset: ``S3BatchPlugin``'s default, 2 s)."""

    # Payload encryption (s3batch.codec): set at most one of the three key variables.
    encryption_key: SecretStr = SecretStr("")
    """One key: base64 of 32 random bytes (``python -m s3batch.codec new-key``)."""
    encryption_keys: SecretStr = SecretStr("")
    """A keyring: keys separated by commas or white space, the first one current."""
    encryption_key_file: str = ""
    """A file with one key per line (``#`` comments and blank lines ignored), e.g. a mounted secret."""
    encryption_allow_plaintext: str = ""
    """``true``: with a key, accept payloads that are not encrypted (while older jobs still run)."""

    codec_token: SecretStr = SecretStr("")
    """Bearer token every caller of the codec server (``python -m s3batch.codec serve``) must send."""

    postgres_dsns: dict[str, SecretStr] = Field(default_factory=dict)
    """DSNs of the PostgreSQL connections a job's ``sink`` may name, given in code
    (``Settings.explicit(postgres_dsns={"warehouse": "postgresql://..."})``). From the environment,
    connection ``warehouse`` is ``S3BATCH_POSTGRES_WAREHOUSE_DSN``, or the file that
    ``S3BATCH_POSTGRES_WAREHOUSE_DSN_FILE`` names (see :meth:`postgres_dsn`)."""
    postgres_connections: dict[str, PostgresConnection] = Field(default_factory=dict)
    """The other settings of PostgreSQL connections, given in code (``Settings.explicit(postgres_connections=
    {"warehouse": PostgresConnection(tables="public.*")})``); from the environment, see :meth:`postgres_connection`."""

    @classmethod
    def explicit(cls, **values: Any) -> Settings:
        """These values and the defaults, validated, without reading the environment."""
        return _ExplicitSettings(**values)

    def keyring(self) -> list[bytes]:
        """The encryption keyring (first = current key), ``[]`` without encryption.

        Raises:
            KeyringError: A key is malformed, the key file cannot be read, or more than one of the
                key variables is set; the message names the variable.
        """
        from s3batch.codec import KEY_ENV, KEY_FILE_ENV, KEYS_ENV, keys_from_env

        return keys_from_env(
            {
                KEY_ENV: self.encryption_key.get_secret_value(),
                KEYS_ENV: self.encryption_keys.get_secret_value(),
                KEY_FILE_ENV: self.encryption_key_file,
            }
        )

    def postgres_dsn(self, name: str) -> str | None:
        """The DSN of the PostgreSQL connection ``name`` (None: this worker has none of that name).

        From ``postgres_dsns``, else (settings read from the environment) ``S3BATCH_POSTGRES_<NAME>_DSN``,
        else the content of the file ``S3BATCH_POSTGRES_<NAME>_DSN_FILE`` names (stripped).

        Raises:
            OSError: The DSN file cannot be read.
        """
        given = self.postgres_dsns.get(name)
        if given is not None:
            return given.get_secret_value()
        if not self._reads_environment:
            return None
        variable = postgres_variable(name, "DSN")
        dsn = os.environ.get(variable)
        if dsn:
            return dsn
        path = os.environ.get(variable + "_FILE")
        return Path(path).read_text().strip() or None if path else None

    def postgres_connection(self, name: str) -> PostgresConnection:
        """The settings of the PostgreSQL connection ``name`` besides its DSN: from ``postgres_connections``, else
        (settings read from the environment) ``S3BATCH_POSTGRES_<NAME>_<SETTING>`` for each field of
        :class:`PostgresConnection` (``S3BATCH_POSTGRES_WAREHOUSE_TABLES``), else the defaults.

        Raises:
            ValueError: A variable's value is not valid (the message names the variable, not the value).
        """
        given = self.postgres_connections.get(name)
        if given is not None:
            return given
        prefix = postgres_variable(name, "")
        found = {
            field: os.environ[prefix + field.upper()]
            for field in PostgresConnection.model_fields
            if self._reads_environment and prefix + field.upper() in os.environ
        }
        try:
            return PostgresConnection.model_validate(found)
        except ValidationError as err:
            wrong = "; ".join(f"{prefix}{str(e['loc'][0]).upper()}: {e['msg']}" for e in err.errors())
            raise ValueError(wrong) from None

    _reads_environment: ClassVar[bool] = True
    """False for ``Settings.explicit``: DSNs come from ``postgres_dsns`` only."""

    def allow_plaintext(self) -> bool:
        """``S3BATCH_ENCRYPTION_ALLOW_PLAINTEXT`` as a boolean.

        Raises:
            KeyringError: The value is neither true nor false.
        """
        from s3batch.codec import ALLOW_PLAINTEXT_ENV, allow_plaintext_from_env

        return allow_plaintext_from_env({ALLOW_PLAINTEXT_ENV: self.encryption_allow_plaintext})

    @model_validator(mode="after")
    def _kms_key_needs_kms(self) -> Settings:
        if self.output_kms_key_id and self.output_sse != "aws:kms":
            raise ValueError("S3BATCH_OUTPUT_KMS_KEY_ID is set: it needs S3BATCH_OUTPUT_SSE=aws:kms")
        return self

    def allowed(self, kind: Literal["sources", "outputs"]) -> list[str]:
        """The globs of ``S3BATCH_ALLOWED_SOURCES`` / ``S3BATCH_ALLOWED_OUTPUTS``; empty: any."""
        raw = self.allowed_sources if kind == "sources" else self.allowed_outputs
        return [g.strip() for g in raw.split(",") if g.strip()]

    def worker_version(self) -> WorkerDeploymentVersion | None:
        """The Worker Deployment Version this worker declares, None when versioning is off
        (:func:`s3batch.versioning.worker_version`)."""
        return versioning.worker_version(self.deployment_name, self.build_id)

    @model_validator(mode="after")
    def _valid_version(self) -> Settings:
        try:
            versioning.worker_version(self.deployment_name, self.build_id or "given")  # no git call at validation
        except ValueError as err:
            raise ValueError(f"S3BATCH_DEPLOYMENT_NAME / S3BATCH_BUILD_ID: {err}") from None
        return self

    def processes(self) -> int:
        """The worker processes to run: ``worker_processes``, or the usable cores when it is 0,
        capped at ``max_concurrent_files`` (a process without a file slot would only poll)."""
        wanted = self.worker_processes or usable_cores()
        return max(1, min(wanted, self.max_concurrent_files))

    def import_handler_modules(self) -> None:
        for name in filter(None, (m.strip() for m in self.handler_modules.split(","))):
            importlib.import_module(name)


class _ExplicitSettings(Settings):
    """:class:`Settings` from the given values and the defaults only (``Settings.explicit``)."""

    _reads_environment: ClassVar[bool] = False

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)


CPU_MAX_FILE = Path("/sys/fs/cgroup/cpu.max")
"""cgroup v2's CPU quota of this process's cgroup (a container's ``--cpus``), ``"<quota|max> <period>"``."""


def cores_from(affinity: int, cpu_max: str | None) -> int:
    """The cores a process may use: ``affinity`` (CPUs it may run on), bounded by a cgroup v2
    ``cpu.max`` content (``"max 100000"``: no limit; ``"150000 100000"``: 1.5 cores, rounded up to 2;
    None, empty or unreadable: no limit). At least 1."""
    cores = max(1, affinity)
    quota, _, period = (cpu_max or "").strip().partition(" ")
    try:
        quota_us, period_us = int(quota), int(period)
    except ValueError:
        return cores  # "max" (no quota), a missing file, or a format this does not know
    if quota_us <= 0 or period_us <= 0:
        return cores
    return max(1, min(cores, math.ceil(quota_us / period_us)))


def usable_cores() -> int:
    """:func:`cores_from` for this process: its CPU affinity and its cgroup's ``cpu.max``."""
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        cpu_max: str | None = CPU_MAX_FILE.read_text()
    except OSError:
        cpu_max = None
    return cores_from(affinity, cpu_max)


def connect_config() -> dict[str, Any]:
    """Connection arguments for ``Client.connect`` from Temporal's environment conventions."""
    config = dict(ClientConfig.load_client_connect_config())
    config.setdefault("target_host", "localhost:7233")
    return config


async def connect(plugins: list[Any], runtime: Runtime | None = None, **options: Any) -> Client:
    """A client of the environment's Temporal (:func:`connect_config`); ``options``: more ``Client.connect``
    arguments (``data_converter``)."""
    config = connect_config()
    return await Client.connect(**config, plugins=plugins, runtime=runtime, **options)


def metrics_runtime(address: str) -> Runtime:
    """A Temporal runtime exporting Prometheus metrics at ``http://{address}/metrics``."""
    return Runtime(
        telemetry=TelemetryConfig(metrics=PrometheusConfig(bind_address=address, durations_as_seconds=True))
    )


def ui_base(settings: Settings) -> str:
    """The Web UI's base URL: ``S3BATCH_UI_URL``, else the frontend's host on port + 1000 (the dev
    server's convention)."""
    if settings.ui_url:
        return settings.ui_url.rstrip("/")
    target = connect_config()["target_host"]
    host, _, port = target.rpartition(":")
    try:
        return f"http://{host or 'localhost'}:{int(port) + 1000}"
    except ValueError:
        return f"http://{target}"

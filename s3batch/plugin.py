"""``S3BatchPlugin``: add s3batch to your own Temporal client and worker with ``plugins=[...]``.

On a client it installs the pydantic data converter (the job models are pydantic); on a worker it
also registers ``S3BatchWorkflow`` and the activities, and gives the (synchronous) activities a
thread pool when the worker has none::

    client = await Client.connect("localhost:7233", plugins=[S3BatchPlugin()])
    worker = Worker(client, task_queue="s3-batch")  # workflows and activities come from the plugin
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import (
    DataConverter,
    DefaultFailureConverter,
    DefaultFailureConverterWithEncodedAttributes,
)
from temporalio.plugin import SimplePlugin
from temporalio.worker import WorkerConfig

from s3batch.activities.s3_activities import S3Activities
from s3batch.codec import EncryptionCodec, allow_plaintext_from_env, keys_from_env
from s3batch.s3io import S3Client, make_client
from s3batch.workflows.batch import S3BatchWorkflow

_DEFAULT_ACTIVITY_SLOTS = 100  # the SDK's default max_concurrent_activities


def _converter(existing: DataConverter | None, codec: EncryptionCodec | None) -> DataConverter:
    # Swap in the pydantic payload converter and, when a key is given, the encryption codec and a
    # failure converter that moves each failure's message and stack trace into its (encrypted)
    # encoded attributes: they name buckets and keys. A failure converter the user configured is
    # kept without a key; with one, it must encode those attributes too, or the promise is broken.
    base = existing or pydantic_data_converter
    changes: dict[str, Any] = {"payload_converter_class": pydantic_data_converter.payload_converter_class}
    if codec is not None:
        changes["payload_codec"] = codec
        failures = base.failure_converter_class
        if failures is DefaultFailureConverter:
            changes["failure_converter_class"] = DefaultFailureConverterWithEncodedAttributes
        elif not getattr(base.failure_converter, "_encode_common_attributes", False):
            raise ValueError(
                f"encryption is on, but the data converter's failure converter {failures.__name__} leaves "
                "failure messages in plain text: use DefaultFailureConverterWithEncodedAttributes (or a "
                "subclass of DefaultFailureConverter created with encode_common_attributes=True)"
            )
    return dataclasses.replace(base, **changes)


class S3BatchPlugin(SimplePlugin):
    """The s3batch workflow, activities and data converter as one Temporal plugin.

    Args:
        s3: The boto3 S3 client the activities use; by default one is built from the environment
            (``AWS_ENDPOINT_URL_S3``, ``AWS_REGION``, credentials) when a worker is configured.
        encryption_key: 32-byte AES key, or a keyring (a list of keys, the first one current):
            every payload, and the message and stack trace of every failure, is encrypted before it
            reaches Temporal (see ``s3batch.codec`` and docs/SECURITY.md). Defaults to the keys the
            environment gives (``S3BATCH_ENCRYPTION_KEY``, ``S3BATCH_ENCRYPTION_KEYS`` or
            ``S3BATCH_ENCRYPTION_KEY_FILE``); ``b""`` turns encryption off whatever the environment
            says.
        allow_plaintext: With a key, accept payloads that are not encrypted instead of refusing
            them (only while jobs started before encryption was turned on still run). Defaults to
            ``S3BATCH_ENCRYPTION_ALLOW_PLAINTEXT``.
    """

    def __init__(
        self,
        s3: S3Client | None = None,
        *,
        encryption_key: bytes | Sequence[bytes] | None = None,
        allow_plaintext: bool | None = None,
    ) -> None:
        self._s3 = s3
        self._activities: S3Activities | None = None
        if encryption_key is None:
            keys = keys_from_env()
        elif isinstance(encryption_key, bytes):
            keys = [encryption_key] if encryption_key else []
        else:
            keys = list(encryption_key)
        self._keys = keys
        """The keyring (first = current), ``[]`` without encryption: the activities hash
        ``S3BatchSource`` with it."""
        codec: EncryptionCodec | None = None
        if keys:
            strict = not (allow_plaintext_from_env() if allow_plaintext is None else allow_plaintext)
            codec = EncryptionCodec(keys, strict=strict)
        self.codec = codec
        """The encryption codec, or None when encryption is off."""
        super().__init__(
            "s3batch",
            data_converter=lambda existing: _converter(existing, codec),
            workflows=[S3BatchWorkflow],
            activities=self._add_activities,
        )

    @property
    def s3_activities(self) -> S3Activities:
        """The activities object (built on first use)."""
        if self._activities is None:
            self._activities = S3Activities(self._s3 if self._s3 is not None else make_client())
            self._activities.source_keys = self._keys
        return self._activities

    def _add_activities(self, existing: Any) -> list[Any]:
        acts = self.s3_activities
        return [
            *(existing or []),
            acts.check_job,
            acts.list_objects,
            acts.process_file,
            acts.process_group,
            acts.write_report_segment,
            acts.write_report,
        ]

    def configure_worker(self, config: WorkerConfig) -> WorkerConfig:
        config = super().configure_worker(config)
        if config.get("activity_executor") is None:
            slots = config.get("max_concurrent_activities") or _DEFAULT_ACTIVITY_SLOTS
            config["activity_executor"] = ThreadPoolExecutor(max_workers=slots, thread_name_prefix="s3batch")
        return config

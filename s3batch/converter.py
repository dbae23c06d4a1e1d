"""s3batch's data converter: pydantic payloads and, with a key, the encryption codec and failure messages encoded.

One definition for everything that decodes s3batch's payloads: :class:`~s3batch.plugin.S3BatchPlugin` installs it
on the workers, replayers and clients it is given; the client API (:func:`s3batch.client.connect`, so every
``s3batch`` command) connects with it alone, without the plugin. A client needs only the converter, and the
plugin's module imports Temporal's worker (a tenth of a second of every command).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import (
    DataConverter,
    DefaultFailureConverter,
    DefaultFailureConverterWithEncodedAttributes,
)

from s3batch.codec import EncryptionCodec

if TYPE_CHECKING:
    from s3batch.config import Settings


def encryption_codec(keys: Sequence[bytes], *, allow_plaintext: bool = False) -> EncryptionCodec | None:
    """The codec of the keyring ``keys`` (first = current), or None without a key (encryption off).

    ``allow_plaintext``: accept payloads that are not encrypted instead of refusing them (see
    :class:`~s3batch.codec.EncryptionCodec`).
    """
    return EncryptionCodec(list(keys), strict=not allow_plaintext) if keys else None


def data_converter(existing: DataConverter | None, codec: EncryptionCodec | None) -> DataConverter:
    """``existing`` (default: the SDK's pydantic converter) with s3batch's payload converter and, with a ``codec``,
    the codec and a failure converter that encodes failures' messages.

    Raises:
        ValueError: With a codec, ``existing`` has a failure converter that leaves messages in plain text.
    """
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
    if all(getattr(base, name) is value for name, value in changes.items()):
        return base
    return dataclasses.replace(base, **changes)


def settings_converter(settings: Settings) -> DataConverter:
    """The converter of the ``S3BATCH_ENCRYPTION_*`` settings (keyring, strict mode), as ``s3batch-worker`` has it.

    Raises:
        KeyringError: The encryption settings are not usable (the message names the variable).
    """
    return data_converter(None, encryption_codec(settings.keyring(), allow_plaintext=settings.allow_plaintext()))

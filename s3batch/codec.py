"""Optional payload encryption: AES-256-GCM over every payload s3batch sends to Temporal.

Job inputs name buckets, prefixes and object keys; checkpoints carry ETags; failures carry error
messages that name them. None of that is record data or a secret, but some teams consider object
keys sensitive. With a key set (the same on every worker and client), the Temporal server only
stores ciphertext for payloads and for the message and stack trace of failures (see
docs/explanation/security.md for what it still sees). ``python -m s3batch.codec serve`` runs a codec server
(:mod:`s3batch.codec_server`) so the Temporal Web UI (``--ui-codec-endpoint`` or the UI's "Codec
Server" setting) can show the decrypted payloads.

    python -m s3batch.codec new-key          # prints a fresh key

Keys, the first one listed is the current key (it encrypts); every key listed decrypts:

- ``S3BATCH_ENCRYPTION_KEY``: one key (base64 of 32 random bytes);
- ``S3BATCH_ENCRYPTION_KEYS``: several keys separated by commas or white space;
- ``S3BATCH_ENCRYPTION_KEY_FILE``: a file with one key per line (``#`` comments and blank lines
  ignored), e.g. a mounted secret.

With a key set, a payload that is not encrypted is refused (strict mode), unless
``S3BATCH_ENCRYPTION_ALLOW_PLAINTEXT=true`` (only while jobs started before encryption was turned
on are still running).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import hmac
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from temporalio.api.common.v1 import Payload
from temporalio.converter import PayloadCodec
from temporalio.exceptions import ApplicationError

ENCODING = b"binary/encrypted"
KEY_ENV = "S3BATCH_ENCRYPTION_KEY"
KEYS_ENV = "S3BATCH_ENCRYPTION_KEYS"
KEY_FILE_ENV = "S3BATCH_ENCRYPTION_KEY_FILE"
ALLOW_PLAINTEXT_ENV = "S3BATCH_ENCRYPTION_ALLOW_PLAINTEXT"

FORMAT = b"2"
"""``encryption-format`` of the payloads this version writes: the encoding, format and key ID are
bound to the ciphertext as AES-GCM associated data. Payloads without the field were written by
s3batch before key rotation (no associated data, key ID = the first 16 hex digits of the key's
SHA-256) and still decrypt with the same key."""

UNKNOWN_KEY = "UnknownEncryptionKey"
DECRYPTION_FAILED = "PayloadDecryptionFailed"
PLAINTEXT_REFUSED = "PlaintextPayloadRefused"
_KEY_HELP = f"{KEY_ENV}, {KEYS_ENV} or {KEY_FILE_ENV}"


class KeyringError(ValueError):
    """The encryption keys configured are not usable (bad base64, wrong length, ambiguous)."""


def parse_key(text: str, where: str = KEY_ENV) -> bytes:
    """Decode a base64 key and check that it is 32 bytes (AES-256)."""
    try:
        key = base64.b64decode(text.strip(), validate=True)
    except ValueError:
        raise KeyringError(f"{where} is not valid base64; create one with `python -m s3batch.codec new-key`") from None
    if len(key) != 32:
        raise KeyringError(f"{where} must be 32 bytes (base64 of 32 random bytes), got {len(key)}")
    return key


def parse_keys(text: str, where: str) -> list[bytes]:
    """Keys separated by commas, white space or lines (``#`` starts a comment); first = current."""
    words = [w for line in text.splitlines() for w in line.split("#", 1)[0].replace(",", " ").split()]
    if not words:
        raise KeyringError(f"{where} holds no key; create one with `python -m s3batch.codec new-key`")
    keys = [parse_key(w, f"{where} (key {n} of {len(words)})") for n, w in enumerate(words, 1)]
    if len(set(keys)) != len(keys):
        raise KeyringError(f"{where} lists the same key twice")
    return keys


def keys_from_env(environ: Mapping[str, str] | None = None) -> list[bytes]:
    """The keyring configured in the environment (first = current key), or ``[]`` for none.

    Raises:
        KeyringError: a key is malformed, the key file cannot be read, or more than one of the
            variables is set (which one would win is not obvious: fail instead).
    """
    env = os.environ if environ is None else environ
    given = [name for name in (KEY_ENV, KEYS_ENV, KEY_FILE_ENV) if env.get(name, "").strip()]
    if len(given) > 1:
        raise KeyringError(f"set only one of {_KEY_HELP}; found {' and '.join(given)}")
    if not given:
        return []
    name = given[0]
    if name == KEY_ENV:
        return [parse_key(env[name])]
    if name == KEYS_ENV:
        return parse_keys(env[name], KEYS_ENV)
    path = Path(env[name].strip())
    try:
        text = path.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as err:
        raise KeyringError(f"{KEY_FILE_ENV}: cannot read the key file {path}: {type(err).__name__}") from None
    return parse_keys(text, f"{KEY_FILE_ENV} ({path})")


def key_from_env() -> bytes | None:
    """The current key configured in the environment, or None."""
    keys = keys_from_env()
    return keys[0] if keys else None


def allow_plaintext_from_env(environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    value = env.get(ALLOW_PLAINTEXT_ENV, "").strip().lower()
    if value in ("", "0", "false", "no"):
        return False
    if value in ("1", "true", "yes"):
        return True
    raise KeyringError(f"{ALLOW_PLAINTEXT_ENV} must be true or false, got {value!r}")


def key_id(key: bytes) -> bytes:
    """The ID written next to each payload: derived from the key (HMAC), never the key itself."""
    return hmac.new(key, b"s3batch encryption key id", hashlib.sha256).hexdigest()[:16].encode()


def _legacy_key_id(key: bytes) -> bytes:
    return hashlib.sha256(key).hexdigest()[:16].encode()


def _associated_data(kid: bytes) -> bytes:
    return b"\0".join((b"s3batch", ENCODING, FORMAT, kid))


class EncryptionCodec(PayloadCodec):
    """AES-256-GCM with a random 12-byte nonce per payload and a keyring.

    Args:
        keys: The current key, or the keyring (first = current). The current key encrypts; any of
            them decrypts a payload that names its ID.
        strict: Refuse payloads that are not encrypted (the default). Off, they pass through
            unchanged (jobs started before encryption was turned on).

    Decoding errors are non-retryable ``ApplicationError`` s naming the key ID (never the key): on a
    worker, the SDK turns one raised while decoding a workflow task into a failure of the workflow,
    instead of failing the task, which the server would retry forever.
    """

    def __init__(self, keys: bytes | Sequence[bytes], *, strict: bool = True) -> None:
        ring = [keys] if isinstance(keys, bytes) else list(keys)
        if not ring:
            raise KeyringError(f"no encryption key given ({_KEY_HELP})")
        for key in ring:
            if len(key) != 32:
                raise KeyringError(f"an encryption key must be 32 bytes, got {len(key)}")
        self.strict = strict
        self.key_ids = [key_id(k) for k in ring]
        """IDs of the keyring's keys, current first."""
        self.key_id = self.key_ids[0]
        """ID of the current key (the one that encrypts)."""
        self._current = AESGCM(ring[0])
        self._by_id = {kid: AESGCM(k) for kid, k in zip(self.key_ids, ring, strict=True)}
        self._by_legacy_id = {_legacy_key_id(k): AESGCM(k) for k in ring}

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [self.encrypt(p) for p in payloads]

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [self.decrypt(p) for p in payloads]

    def encrypt(self, payload: Payload) -> Payload:
        nonce = os.urandom(12)
        data = nonce + self._current.encrypt(nonce, payload.SerializeToString(), _associated_data(self.key_id))
        return Payload(
            metadata={"encoding": ENCODING, "encryption-format": FORMAT, "encryption-key-id": self.key_id}, data=data
        )

    def decrypt(self, payload: Payload) -> Payload:
        meta = payload.metadata
        if meta.get("encoding") != ENCODING:
            if self.strict:
                raise ApplicationError(
                    f"refused a payload that is not encrypted (encoding "
                    f"{_printable(meta.get('encoding', b''))}) while encryption is on: it was written by a "
                    f"client without the key (e.g. the temporal CLI without the codec server); start or "
                    f"signal the job with the key set, or set {ALLOW_PLAINTEXT_ENV}=true while unencrypted "
                    f"jobs are still running",
                    type=PLAINTEXT_REFUSED,
                    non_retryable=True,
                )
            return payload
        kid = meta.get("encryption-key-id", b"")
        fmt = meta.get("encryption-format")  # absent: written before key rotation (no associated data)
        ring = {FORMAT: self._by_id, None: self._by_legacy_id}.get(fmt, {})
        aead = ring.get(kid)
        if aead is None:
            raise ApplicationError(
                f"payload was encrypted with key ID {_printable(kid)} (format {_printable(fmt or b'1')}), which this "
                f"process does not have (its keys: {', '.join(k.decode() for k in self.key_ids)}): add that key to "
                f"{_KEY_HELP} on every worker and client (the first key encrypts, all of them decrypt)",
                type=UNKNOWN_KEY,
                non_retryable=True,
            )
        data = payload.data
        try:
            plain = aead.decrypt(data[:12], data[12:], _associated_data(kid) if fmt == FORMAT else None)
        except InvalidTag:
            raise ApplicationError(
                f"payload encrypted with key ID {kid.decode()} does not decrypt: it was altered, or its metadata "
                f"(encoding, format, key ID) does not match what was encrypted",
                type=DECRYPTION_FAILED,
                non_retryable=True,
            ) from None
        return Payload.FromString(plain)


def _printable(value: bytes) -> str:
    """Metadata bytes for an error message: short, ASCII, quoted."""
    return repr(value[:40].decode("ascii", "replace"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m s3batch.codec", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("new-key", help=f"print a new random key for {KEY_ENV} / {KEYS_ENV}")
    sub.add_parser("key-ids", help="print the ID of each configured key (current first), to check a rotation")
    from s3batch import codec_server

    codec_server.add_arguments(sub.add_parser("serve", help="run a codec server for the Temporal Web UI"))
    args = parser.parse_args(argv)
    if args.command == "new-key":
        print(base64.b64encode(os.urandom(32)).decode())  # noqa: T201
        return
    try:
        from s3batch.config import Settings  # the one reader of the environment's settings

        settings = Settings()
        keys = settings.keyring()
        codec = EncryptionCodec(keys, strict=not settings.allow_plaintext()) if keys else None
        if codec is None:
            parser.exit(2, f"set {_KEY_HELP}\n")
        if args.command == "key-ids":
            print("\n".join(k.decode() for k in codec.key_ids))  # noqa: T201
            return
    except KeyringError as err:
        parser.exit(2, f"{err}\n")
    codec_server.serve(parser, args, codec, settings.codec_token.get_secret_value())


if __name__ == "__main__":
    main()

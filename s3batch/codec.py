"""Optional payload encryption: AES-256-GCM over every payload s3batch sends to Temporal.

Job inputs name buckets, prefixes and object keys; checkpoints carry ETags; failures carry error
messages that name them. None of that is record data or a secret, but some teams consider object
keys sensitive. With a key set (the same on every worker and client), the Temporal server only
stores ciphertext for payloads and for the message and stack trace of failures (see
docs/SECURITY.md for what it still sees). ``python -m s3batch.codec serve`` runs a codec server so
the Temporal Web UI (``--ui-codec-endpoint`` or the UI's "Codec Server" setting) can show the
decrypted payloads.

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
import asyncio
import base64
import copy
import hashlib
import hmac
import ipaddress
import json
import os
import socket
import ssl
import sys
import threading
from collections.abc import Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from google.protobuf import json_format
from temporalio.api.common.v1 import Payload, Payloads
from temporalio.converter import PayloadCodec
from temporalio.exceptions import ApplicationError

ENCODING = b"binary/encrypted"
KEY_ENV = "S3BATCH_ENCRYPTION_KEY"
KEYS_ENV = "S3BATCH_ENCRYPTION_KEYS"
KEY_FILE_ENV = "S3BATCH_ENCRYPTION_KEY_FILE"
ALLOW_PLAINTEXT_ENV = "S3BATCH_ENCRYPTION_ALLOW_PLAINTEXT"
TOKEN_ENV = "S3BATCH_CODEC_TOKEN"

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


# ---------------------------------------------------------------------------------------- codec server


class ServerConfig:
    """What the codec server accepts.

    Args:
        token: Bearer token every POST must carry (``Authorization: Bearer <token>``); None only on
            loopback.
        namespace: The Temporal namespace (``X-Namespace`` header) the server decodes for.
        allow_origins: Browser origins (scheme://host:port, exact) allowed to call it.
        allow_hosts: ``Host`` header values (host:port, exact) it answers: a DNS-rebinding page
            sends its own host name.
        max_body_bytes: Larger requests are refused before they are read.
        timeout: Socket timeout of each connection, in seconds.
        max_connections: Connections served at once (a thread each); more are closed at once.
    """

    def __init__(
        self,
        *,
        token: str | None,
        namespace: str = "default",
        allow_origins: Sequence[str] = ("http://localhost:8233",),
        allow_hosts: Sequence[str] = (),
        max_body_bytes: int = 8 * 1024 * 1024,
        timeout: float = 10.0,
        max_connections: int = 64,
    ) -> None:
        self.token = token
        self.namespace = namespace
        self.allow_origins = frozenset(allow_origins)
        self.allow_hosts = frozenset(h.lower() for h in allow_hosts)
        self.max_body_bytes = max_body_bytes
        self.timeout = timeout
        self.max_connections = max_connections


def make_handler(codec: EncryptionCodec, config: ServerConfig) -> type[BaseHTTPRequestHandler]:
    """HTTP handler of the Temporal codec server protocol: POST /encode and /decode with
    ``{"payloads": [...]}`` in protobuf JSON, for authenticated callers only.

    Decoding passes payloads that are not encrypted through unchanged (the caller already has them);
    errors are generic: no key ID, no exception text."""
    expected = f"Bearer {config.token}".encode() if config.token else None
    # The UI shows what the server answers: plaintext payloads shown as they are, never refused.
    viewer = copy.copy(codec)
    viewer.strict = False

    class Handler(BaseHTTPRequestHandler):
        timeout = config.timeout  # socket timeout of the connection (StreamRequestHandler)
        protocol_version = "HTTP/1.1"
        server_version = "s3batch-codec"
        sys_version = ""

        def _origin_ok(self) -> bool:
            origin = self.headers.get("Origin")
            return origin is None or origin in config.allow_origins

        def _cors(self) -> None:
            origin = self.headers.get("Origin")
            if origin is not None and origin in config.allow_origins:
                self.send_header("Access-Control-Allow-Origin", origin)
                self.send_header("Access-Control-Allow-Credentials", "true")
                self.send_header("Access-Control-Allow-Methods", "POST, OPTIONS")
                self.send_header("Access-Control-Allow-Headers", "content-type, x-namespace, authorization")
                self.send_header("Access-Control-Max-Age", "600")
            self.send_header("Vary", "Origin")

        def _reply(self, status: int, body: dict[str, Any], extra: Mapping[str, str] | None = None) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self._cors()
            for name, value in (extra or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            self.send_header("X-Content-Type-Options", "nosniff")
            if status >= 400:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            self.wfile.write(data)

        def _refuse(self, status: int, reason: str, extra: Mapping[str, str] | None = None) -> None:
            self._reply(status, {"error": reason}, extra)

        def _host_ok(self) -> bool:
            return (self.headers.get("Host") or "").lower() in config.allow_hosts

        def do_OPTIONS(self) -> None:
            if not self._host_ok():
                self._refuse(421, "unknown host")
            elif not self._origin_ok():
                self._refuse(403, "origin not allowed")
            else:
                self.send_response(204)
                self._cors()
                self.send_header("Content-Length", "0")
                self.end_headers()

        def do_GET(self) -> None:
            self._refuse(405, "method not allowed", {"Allow": "POST, OPTIONS"})

        def do_POST(self) -> None:
            # Cheap checks first, and all of them before the body is read.
            if not self._host_ok():
                return self._refuse(421, "unknown host")
            if not self._origin_ok():
                return self._refuse(403, "origin not allowed")
            if expected is not None:
                given = (self.headers.get("Authorization") or "").encode("latin-1", "replace")
                if not hmac.compare_digest(given, expected):
                    return self._refuse(401, "unauthorized", {"WWW-Authenticate": 'Bearer realm="s3batch-codec"'})
            if self.headers.get("X-Namespace") != config.namespace:
                return self._refuse(403, "namespace not served")
            action = self.path.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
            if action not in ("encode", "decode"):
                return self._refuse(404, "not found")
            if self.headers.get("Transfer-Encoding"):
                return self._refuse(411, "a Content-Length is required")
            try:
                length = int(self.headers.get("Content-Length", ""))
            except ValueError:
                return self._refuse(411, "a Content-Length is required")
            if length < 0 or length > config.max_body_bytes:
                return self._refuse(413, "request too large")
            try:
                body = self.rfile.read(length)
                payloads = json_format.Parse(body, Payloads())
                fn = viewer.encode if action == "encode" else viewer.decode
                result = Payloads(payloads=asyncio.run(fn(list(payloads.payloads))))
            except Exception:  # noqa: BLE001 - the reason (key IDs, parser text) stays here
                return self._refuse(400, f"could not {action} the payloads")
            self._reply(200, json_format.MessageToDict(result))

        def log_message(self, format: str, *args: object) -> None:
            pass  # no payloads, tokens or paths in logs

    return Handler


class CodecServer(ThreadingHTTPServer):
    """The codec server, optionally over TLS (the handshake runs in the connection's own thread,
    under its socket timeout, so a slow client cannot stall ``accept``)."""

    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        codec: EncryptionCodec,
        config: ServerConfig,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.tls = tls
        self.config = config
        self._slots = threading.BoundedSemaphore(config.max_connections)
        super().__init__(address, make_handler(codec, config))
        if not config.allow_hosts:
            port = self.server_address[1]
            hosts = {f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"}
            config.allow_hosts = frozenset(hosts)

    def process_request(self, request: Any, client_address: Any) -> None:
        # Each connection holds a thread for up to the socket timeout: bound them.
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def finish_request(self, request: Any, client_address: Any) -> None:
        request.settimeout(self.config.timeout)
        if self.tls is not None:
            try:
                request = self.tls.wrap_socket(request, server_side=True)
            except (OSError, ssl.SSLError):
                return
        super().finish_request(request, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a dropped or timed-out connection: nothing of it belongs in a log


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def tls_context(cert: str, key: str) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    return ctx


def read_token(path: str | None) -> str | None:
    """The bearer token: from ``--token-file`` or ``S3BATCH_CODEC_TOKEN`` (never a command-line
    value, which other users of the machine could read in the process list)."""
    text = Path(path).read_text(encoding="utf-8").strip() if path else os.environ.get(TOKEN_ENV, "").strip()
    if not text:
        return None
    if len(text) < 16 or any(c.isspace() or not c.isprintable() for c in text):
        raise KeyringError("the codec server token must be at least 16 printable characters without spaces")
    return text


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m s3batch.codec", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("new-key", help=f"print a new random key for {KEY_ENV} / {KEYS_ENV}")
    sub.add_parser("key-ids", help="print the ID of each configured key (current first), to check a rotation")
    serve = sub.add_parser("serve", help="run a codec server for the Temporal Web UI")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (beyond loopback: TLS and a token)")
    serve.add_argument("--port", type=int, default=8081)
    serve.add_argument(
        "--allow-origin",
        action="append",
        help="a Web UI origin allowed to call the server, exactly (repeatable; default http://localhost:8233)",
    )
    serve.add_argument(
        "--allow-host",
        action="append",
        help="a Host header value (host:port) the server answers (repeatable; default the loopback names)",
    )
    serve.add_argument("--namespace", default="default", help="the namespace (X-Namespace header) it decodes for")
    serve.add_argument("--token-file", help=f"file holding the bearer token (default: {TOKEN_ENV})")
    serve.add_argument("--tls-cert", help="PEM certificate chain: serve HTTPS")
    serve.add_argument("--tls-key", help="PEM private key of --tls-cert")
    serve.add_argument("--max-body-bytes", type=int, default=8 * 1024 * 1024)
    serve.add_argument("--timeout", type=float, default=10.0, help="socket timeout per connection, seconds")
    serve.add_argument("--max-connections", type=int, default=64, help="connections served at once")
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
        token = read_token(args.token_file)
    except (KeyringError, OSError) as err:
        parser.exit(2, f"{err}\n")
    if bool(args.tls_cert) != bool(args.tls_key):
        parser.exit(2, "give both --tls-cert and --tls-key\n")
    if not is_loopback(args.host) and not (args.tls_cert and token):
        parser.exit(
            2,
            f"refusing to listen on {args.host} (not loopback) without TLS and a token: give --tls-cert, "
            f"--tls-key and {TOKEN_ENV} (or --token-file)\n",
        )
    if not is_loopback(args.host) and not args.allow_host:
        parser.exit(2, f"listening on {args.host}: give --allow-host with the name clients use (host:port)\n")
    config = ServerConfig(
        token=token,
        namespace=args.namespace,
        allow_origins=args.allow_origin or ["http://localhost:8233"],
        allow_hosts=args.allow_host or (),
        max_body_bytes=args.max_body_bytes,
        timeout=args.timeout,
        max_connections=args.max_connections,
    )
    tls = tls_context(args.tls_cert, args.tls_key) if args.tls_cert else None
    server = CodecServer((args.host, args.port), codec, config, tls)
    scheme = "https" if tls else "http"
    if token is None:
        print(f"warning: no {TOKEN_ENV}: any local process may use this server", file=sys.stderr)  # noqa: T201
    print(json.dumps({"codec_server": f"{scheme}://{args.host}:{server.server_port}"}), flush=True)  # noqa: T201
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()

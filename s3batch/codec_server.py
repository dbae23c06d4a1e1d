"""The codec server: lets the Temporal Web UI (``--ui-codec-endpoint`` or the UI's "Codec Server"
setting) show payloads that :class:`~s3batch.codec.EncryptionCodec` encrypted, for authenticated
callers only. Started by ``python -m s3batch.codec serve`` (see docs/explanation/security.md)."""

from __future__ import annotations

import argparse
import asyncio
import copy
import hmac
import ipaddress
import json
import socket
import ssl
import sys
import threading
from collections.abc import Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from temporalio.api.common.v1 import Payloads

from s3batch.codec import EncryptionCodec, KeyringError

TOKEN_ENV = "S3BATCH_CODEC_TOKEN"


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


class CodecRequestHandler(BaseHTTPRequestHandler):
    """HTTP handler of the Temporal codec server protocol: POST /encode and /decode with
    ``{"payloads": [...]}`` in protobuf JSON, for authenticated callers only.

    Decoding passes payloads that are not encrypted through unchanged (the caller already has them);
    errors are generic: no key ID, no exception text. :func:`make_handler` gives it its codec and
    configuration."""

    protocol_version = "HTTP/1.1"
    server_version = "s3batch-codec"
    sys_version = ""
    viewer: EncryptionCodec
    """The codec, not strict: the UI shows what the server answers, plaintext payloads as they are."""
    config: ServerConfig
    expected: bytes | None
    """The ``Authorization`` header every POST must carry, or None (loopback without a token)."""

    def _origin_ok(self) -> bool:
        origin = self.headers.get("Origin")
        return origin is None or origin in self.config.allow_origins

    def _cors(self) -> None:
        origin = self.headers.get("Origin")
        if origin is not None and origin in self.config.allow_origins:
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
        return (self.headers.get("Host") or "").lower() in self.config.allow_hosts

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
        if self.expected is not None:
            given = (self.headers.get("Authorization") or "").encode("latin-1", "replace")
            if not hmac.compare_digest(given, self.expected):
                return self._refuse(401, "unauthorized", {"WWW-Authenticate": 'Bearer realm="s3batch-codec"'})
        if self.headers.get("X-Namespace") != self.config.namespace:
            return self._refuse(403, "namespace not served")
        action = self.path.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
        if action not in ("encode", "decode"):
            return self._refuse(404, "not found")
        length = self._content_length()
        if length is not None:
            self._answer(action, length)

    def _content_length(self) -> int | None:
        """The request's body length, or None after refusing a request without a usable one."""
        if self.headers.get("Transfer-Encoding"):
            self._refuse(411, "a Content-Length is required")
            return None
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            self._refuse(411, "a Content-Length is required")
            return None
        if length < 0 or length > self.config.max_body_bytes:
            self._refuse(413, "request too large")
            return None
        return length

    def _answer(self, action: str, length: int) -> None:
        try:
            body = self.rfile.read(length)
            payloads = json_format.Parse(body, Payloads())
            fn = self.viewer.encode if action == "encode" else self.viewer.decode
            result = Payloads(payloads=asyncio.run(fn(list(payloads.payloads))))
        except Exception:  # noqa: BLE001 - the reason (key IDs, parser text) stays here
            return self._refuse(400, f"could not {action} the payloads")
        self._reply(200, json_format.MessageToDict(result))

    def log_message(self, format: str, *args: object) -> None:
        pass  # no payloads, tokens or paths in logs


def make_handler(codec: EncryptionCodec, config: ServerConfig) -> type[CodecRequestHandler]:
    """The request handler class of a codec server with this codec and configuration."""
    unstrict = copy.copy(codec)
    unstrict.strict = False  # the UI shows what the server answers: plaintext payloads as they are

    class Handler(CodecRequestHandler):
        timeout = config.timeout  # socket timeout of the connection (StreamRequestHandler)
        viewer = unstrict
        expected = f"Bearer {config.token}".encode() if config.token else None

    Handler.config = config
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


def read_token(path: str | None, given: str = "") -> str | None:
    """The bearer token: from ``--token-file``, else ``given`` (``S3BATCH_CODEC_TOKEN``, read by
    ``Settings``); never a command-line value, which other users of the machine could read in the
    process list."""
    text = Path(path).read_text(encoding="utf-8").strip() if path else given.strip()
    if not text:
        return None
    if len(text) < 16 or any(c.isspace() or not c.isprintable() for c in text):
        raise KeyringError("the codec server token must be at least 16 printable characters without spaces")
    return text


def add_arguments(serve: argparse.ArgumentParser) -> None:
    """The options of ``python -m s3batch.codec serve``."""
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


def serve(parser: argparse.ArgumentParser, args: argparse.Namespace, codec: EncryptionCodec, token_value: str) -> None:
    """Run the codec server the options describe until interrupted (exits 2 on unusable options).

    Args:
        token_value: ``S3BATCH_CODEC_TOKEN`` (used without ``--token-file``).
    """
    try:
        token = read_token(args.token_file, token_value)
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


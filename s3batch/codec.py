"""Optional payload encryption: AES-256-GCM over every payload s3batch sends to Temporal.

Job inputs name buckets, prefixes and object keys; checkpoints carry ETags. None of that is record
data or a secret, but some teams consider object keys sensitive. With ``S3BATCH_ENCRYPTION_KEY``
set (base64 of 32 random bytes, the same on every worker and client), the Temporal server only
ever stores ciphertext. ``python -m s3batch.codec serve`` runs a codec server so the Temporal Web
UI (``--ui-codec-endpoint`` or the UI's "Codec Server" setting) can show the decrypted payloads.

    python -m s3batch.codec new-key          # prints a fresh key
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import json
import os
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from google.protobuf import json_format
from temporalio.api.common.v1 import Payload, Payloads
from temporalio.converter import PayloadCodec

ENCODING = b"binary/encrypted"
KEY_ENV = "S3BATCH_ENCRYPTION_KEY"


def parse_key(text: str) -> bytes:
    """Decode a base64 key and check that it is 32 bytes (AES-256)."""
    try:
        key = base64.b64decode(text.strip(), validate=True)
    except ValueError:
        raise ValueError(f"{KEY_ENV} is not valid base64; create one with `python -m s3batch.codec new-key`") from None
    if len(key) != 32:
        raise ValueError(f"{KEY_ENV} must be 32 bytes (base64 of 32 random bytes), got {len(key)}")
    return key


def key_from_env() -> bytes | None:
    text = os.environ.get(KEY_ENV, "")
    return parse_key(text) if text.strip() else None


class EncryptionCodec(PayloadCodec):
    """AES-GCM with a random 12-byte nonce per payload; the key ID travels in the metadata so a
    payload encrypted with another key fails with a clear error instead of garbage."""

    def __init__(self, key: bytes) -> None:
        self._aead = AESGCM(key)
        self.key_id = hashlib.sha256(key).hexdigest()[:16].encode()

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [
            Payload(
                metadata={"encoding": ENCODING, "encryption-key-id": self.key_id},
                data=self._encrypt(p.SerializeToString()),
            )
            for p in payloads
        ]

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        out: list[Payload] = []
        for p in payloads:
            if p.metadata.get("encoding") != ENCODING:
                out.append(p)  # not ours (e.g. written before encryption was turned on)
                continue
            key_id = p.metadata.get("encryption-key-id", b"")
            if key_id != self.key_id:
                raise ValueError(
                    f"payload was encrypted with key {key_id.decode() or '?'}, this process has "
                    f"{self.key_id.decode()}: set the same {KEY_ENV} on every worker and client"
                )
            out.append(Payload.FromString(self._decrypt(p.data)))
        return out

    def _encrypt(self, data: bytes) -> bytes:
        nonce = os.urandom(12)
        return nonce + self._aead.encrypt(nonce, data, None)

    def _decrypt(self, data: bytes) -> bytes:
        return self._aead.decrypt(data[:12], data[12:], None)


def make_handler(codec: EncryptionCodec, allow_origin: str) -> type[BaseHTTPRequestHandler]:
    """HTTP handler of the Temporal codec server protocol: POST /encode and /decode with
    ``{"payloads": [...]}`` in protobuf JSON."""

    class Handler(BaseHTTPRequestHandler):
        def _cors(self) -> None:
            self.send_header("Access-Control-Allow-Origin", allow_origin)
            self.send_header("Access-Control-Allow-Methods", "POST, OPTIONS")
            self.send_header("Access-Control-Allow-Headers", "content-type, x-namespace, authorization")

        def do_OPTIONS(self) -> None:
            self.send_response(200)
            self._cors()
            self.end_headers()

        def do_POST(self) -> None:
            action = self.path.rstrip("/").rsplit("/", 1)[-1]
            if action not in ("encode", "decode"):
                self.send_error(404)
                return
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            try:
                payloads = json_format.Parse(body, Payloads())
                fn = codec.encode if action == "encode" else codec.decode
                result = Payloads(payloads=asyncio.run(fn(list(payloads.payloads))))
            except Exception as err:  # noqa: BLE001 - answer the UI with the reason
                self.send_response(400)
                self._cors()
                self.end_headers()
                self.wfile.write(str(err).encode())
                return
            data = json_format.MessageToJson(result).encode()
            self.send_response(200)
            self._cors()
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            pass  # no payloads in logs

    return Handler


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m s3batch.codec", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("new-key", help="print a new random key for S3BATCH_ENCRYPTION_KEY")
    serve = sub.add_parser("serve", help="run a codec server for the Temporal Web UI")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8081)
    serve.add_argument("--allow-origin", default="http://localhost:8233", help="the Web UI's origin (CORS)")
    args = parser.parse_args(argv)
    if args.command == "new-key":
        print(base64.b64encode(os.urandom(32)).decode())  # noqa: T201
        return
    key = key_from_env()
    if key is None:
        parser.exit(2, f"set {KEY_ENV} to serve\n")
    server = ThreadingHTTPServer((args.host, args.port), make_handler(EncryptionCodec(key), args.allow_origin))
    print(json.dumps({"codec_server": f"http://{args.host}:{args.port}"}))  # noqa: T201
    server.serve_forever()


if __name__ == "__main__":
    main()

"""Payload encryption: keys and keyrings, rotation, the payload format (today's and the one before
key rotation), strict mode, and the codec server over real HTTP (authentication, namespace, origin
and host allow-lists, body cap, socket timeout, TLS, generic errors). The end-to-end tests against
the Temporal server are in test_encryption.py."""

from __future__ import annotations

import base64
import datetime
import hashlib
import hmac
import http.client
import json
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from google.protobuf import json_format
from s3batch.workflows.batch import S3BatchWorkflow
from temporalio.api.common.v1 import Payload, Payloads
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker

from s3batch import codec_server as codec_mod
from s3batch.codec import (
    DECRYPTION_FAILED,
    PLAINTEXT_REFUSED,
    UNKNOWN_KEY,
    EncryptionCodec,
    KeyringError,
    key_id,
    keys_from_env,
    parse_key,
)
from s3batch.codec_server import CodecServer, ServerConfig
from s3batch.dev.stack import Stack
from s3batch.models import S3BatchInput
from s3batch.plugin import S3BatchPlugin
from s3batch.s3io import make_client

ROOT = Path(__file__).resolve().parent.parent
KEY = os.urandom(32)
OLD_KEY = os.urandom(32)
TOKEN = "t0ken-" + uuid.uuid4().hex
UI = "http://localhost:8233"

# A payload written by s3batch before key rotation (commit c8f4068: no encryption-format, no
# associated data, key ID = sha256(key)[:16]) with the key bytes(range(32)). Running jobs carry such
# payloads: the new codec must still read them.
LEGACY_KEY = bytes(range(32))
LEGACY_PAYLOAD = {
    "metadata": {"encoding": "YmluYXJ5L2VuY3J5cHRlZA==", "encryption-key-id": "NjMwZGNkMjk2NmM0MzM2Ng=="},
    "data": "O/K36TnSv07z22clcVivNUWgNqrKMO30PBEU64oDgib3EvlRGOnT7P8pX0CJPKxuks1ILi+/NYs9al/o3ZHnAhnc9f0U"
    "mZwAqkCBAyohWoE=",
}


def b64(key: bytes) -> str:
    return base64.b64encode(key).decode()


def plain(data: bytes = b'{"bucket":"secret-bucket"}') -> Payload:
    return Payload(metadata={"encoding": b"json/plain"}, data=data)


# ------------------------------------------------------------------------------------------- keys


def test_key_must_be_32_bytes_of_base64() -> None:
    assert parse_key(b64(KEY)) == KEY
    with pytest.raises(ValueError, match="32 bytes"):
        parse_key(base64.b64encode(b"short").decode())
    with pytest.raises(ValueError, match="not valid base64"):
        parse_key("not base64 at all!")


def test_keyring_from_the_environment(tmp_path: Path) -> None:
    assert keys_from_env({}) == []
    assert keys_from_env({"S3BATCH_ENCRYPTION_KEY": b64(KEY)}) == [KEY]
    assert keys_from_env({"S3BATCH_ENCRYPTION_KEYS": f"{b64(KEY)}, {b64(OLD_KEY)}"}) == [KEY, OLD_KEY]
    # A key file: one key per line, the first one current; comments and blank lines ignored.
    path = tmp_path / "keys"
    path.write_text(f"# current\n{b64(KEY)}\n\n{b64(OLD_KEY)}  # until every job of November is done\n")
    assert keys_from_env({"S3BATCH_ENCRYPTION_KEY_FILE": str(path)}) == [KEY, OLD_KEY]

    # Errors say which variable and which key, and never quote a key.
    bad = b64(os.urandom(31))
    path.write_text(f"{b64(KEY)}\n{bad}\n")
    with pytest.raises(KeyringError, match=r"S3BATCH_ENCRYPTION_KEY_FILE .*key 2 of 2.*32 bytes") as err:
        keys_from_env({"S3BATCH_ENCRYPTION_KEY_FILE": str(path)})
    assert bad not in str(err.value) and b64(KEY) not in str(err.value)
    with pytest.raises(KeyringError, match="cannot read the key file"):
        keys_from_env({"S3BATCH_ENCRYPTION_KEY_FILE": str(tmp_path / "missing")})
    with pytest.raises(KeyringError, match="holds no key"):
        keys_from_env({"S3BATCH_ENCRYPTION_KEYS": " , "})
    with pytest.raises(KeyringError, match="same key twice"):
        keys_from_env({"S3BATCH_ENCRYPTION_KEYS": f"{b64(KEY)} {b64(KEY)}"})
    # Two sources at once: which one wins would be a guess.
    with pytest.raises(KeyringError, match="only one of"):
        keys_from_env({"S3BATCH_ENCRYPTION_KEY": b64(KEY), "S3BATCH_ENCRYPTION_KEY_FILE": str(path)})


def test_the_key_id_is_derived_from_the_key_and_does_not_reveal_it() -> None:
    codec = EncryptionCodec(KEY)
    payload = codec.encrypt(plain())
    assert payload.metadata["encryption-key-id"] == key_id(KEY) == codec.key_id
    assert key_id(KEY) == hmac.new(KEY, b"s3batch encryption key id", hashlib.sha256).hexdigest()[:16].encode()
    assert key_id(KEY) != key_id(OLD_KEY)
    wire = payload.SerializeToString()
    for form in (KEY, b64(KEY).encode(), KEY.hex().encode(), b"secret-bucket"):
        assert form not in wire


# ------------------------------------------------------------------------------------ rotation


async def test_rotation_encrypts_with_the_current_key_and_decrypts_with_any() -> None:
    before = EncryptionCodec(OLD_KEY)
    during = EncryptionCodec([KEY, OLD_KEY])
    after = EncryptionCodec(KEY)
    [old_payload] = await before.encode([plain()])
    [new_payload] = await during.encode([plain()])
    assert new_payload.metadata["encryption-key-id"] == key_id(KEY)
    assert await during.decode([old_payload, new_payload]) == [plain(), plain()]
    assert await after.decode([new_payload]) == [plain()]

    # A key nobody configured: the error names the payload's key ID and the keys this process has.
    with pytest.raises(ApplicationError) as err:
        await after.decode([old_payload])
    assert err.value.type == UNKNOWN_KEY and err.value.non_retryable
    assert key_id(OLD_KEY).decode() in err.value.message and key_id(KEY).decode() in err.value.message
    assert "S3BATCH_ENCRYPTION_KEYS" in err.value.message


async def test_a_payload_written_before_key_rotation_still_decodes() -> None:
    legacy = json_format.ParseDict(LEGACY_PAYLOAD, Payload())
    assert "encryption-format" not in legacy.metadata
    assert await EncryptionCodec(LEGACY_KEY).decode([legacy]) == [plain(b'{"bucket":"legacy-bucket"}')]
    assert await EncryptionCodec([KEY, LEGACY_KEY]).decode([legacy]) == [plain(b'{"bucket":"legacy-bucket"}')]
    with pytest.raises(ApplicationError) as err:
        await EncryptionCodec(KEY).decode([legacy])
    assert err.value.type == UNKNOWN_KEY and "630dcd2966c43366" in err.value.message


async def test_encoding_and_key_id_are_bound_to_the_ciphertext() -> None:
    codec = EncryptionCodec([KEY, OLD_KEY])
    payload = codec.encrypt(plain())

    def altered(**metadata: bytes | None) -> Payload:
        p = Payload()
        p.CopyFrom(payload)
        for name, value in metadata.items():
            if value is None:
                del p.metadata[name.replace("_", "-")]
            else:
                p.metadata[name.replace("_", "-")] = value
        return p

    # Relabelled as another known key, or downgraded to the format without associated data (with
    # that format's ID of the same key): refused, clearly.
    legacy_id = hashlib.sha256(KEY).hexdigest()[:16].encode()
    relabelled = altered(encryption_key_id=key_id(OLD_KEY))
    downgraded = altered(encryption_format=None, encryption_key_id=legacy_id)
    for bad in (relabelled, downgraded):
        with pytest.raises(ApplicationError) as err:
            await codec.decode([bad])
        assert err.value.type == DECRYPTION_FAILED and err.value.non_retryable
    flipped = altered()
    flipped.data = flipped.data[:-1] + bytes([flipped.data[-1] ^ 1])
    with pytest.raises(ApplicationError, match="was altered") as err:
        await codec.decode([flipped])
    assert "InvalidTag" not in str(err.value)
    with pytest.raises(ApplicationError) as err:
        await codec.decode([altered(encryption_format=b"9")])
    assert err.value.type == UNKNOWN_KEY


async def test_strict_mode_refuses_plaintext_payloads() -> None:
    with pytest.raises(ApplicationError) as err:
        await EncryptionCodec(KEY).decode([plain()])
    assert err.value.type == PLAINTEXT_REFUSED and err.value.non_retryable
    assert "json/plain" in err.value.message and "secret-bucket" not in err.value.message
    assert await EncryptionCodec(KEY, strict=False).decode([plain()]) == [plain()]
    # The plugin is strict by default, lenient only when asked (or S3BATCH_ENCRYPTION_ALLOW_PLAINTEXT).
    assert S3BatchPlugin(encryption_key=KEY).codec.strict  # type: ignore[union-attr]
    assert not S3BatchPlugin(encryption_key=KEY, allow_plaintext=True).codec.strict  # type: ignore[union-attr]
    assert S3BatchPlugin(encryption_key=b"").codec is None


# ------------------------------------------------------------------------------------ codec server


class Served:
    """A codec server on a free loopback port, in a thread."""

    def __init__(self, config: ServerConfig, tls: ssl.SSLContext | None = None, keys: Any = KEY) -> None:
        self.server = CodecServer(("127.0.0.1", 0), EncryptionCodec(keys), config, tls)
        self.port = self.server.server_port
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)

    def post(self, path: str = "/decode", payloads: list[Payload] | None = None, **kwargs: Any) -> Reply:
        return post(self.port, path, payloads, **kwargs)


Reply = tuple[int, dict[str, str], bytes]


def post(
    port: int,
    path: str = "/decode",
    payloads: list[Payload] | None = None,
    *,
    body: bytes | None = None,
    token: str | None = TOKEN,
    namespace: str | None = "default",
    origin: str | None = None,
    host: str | None = None,
    headers: dict[str, str] | None = None,
    context: ssl.SSLContext | None = None,
) -> Reply:
    """One real HTTP request to the codec server on ``port``: status, headers, body."""
    if body is None:
        body = json_format.MessageToJson(Payloads(payloads=payloads or [])).encode()
    sent = {"Content-Type": "application/json", "Host": host or f"127.0.0.1:{port}"}
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    if namespace is not None:
        sent["X-Namespace"] = namespace
    if origin is not None:
        sent["Origin"] = origin
    sent.update(headers or {})
    conn = (
        http.client.HTTPSConnection("127.0.0.1", port, timeout=5, context=context)
        if context is not None
        else http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    )
    try:
        conn.putrequest("POST", path, skip_host=True, skip_accept_encoding=True)
        for name, value in sent.items():
            conn.putheader(name, value)
        if "Content-Length" not in sent:
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders()
        conn.send(body)
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


@pytest.fixture
def served() -> Iterator[Served]:
    s = Served(ServerConfig(token=TOKEN, namespace="default", allow_origins=[UI], timeout=1.0))
    yield s
    s.close()


def test_codec_server_decodes_only_for_an_authenticated_caller(served: Served) -> None:
    stored = EncryptionCodec(KEY).encrypt(plain())
    status, headers, body = served.post(payloads=[stored], origin=UI)
    assert status == 200, body
    assert headers["Access-Control-Allow-Origin"] == UI and headers["Cache-Control"] == "no-store"
    assert json_format.Parse(body, Payloads()).payloads[0] == plain()
    # Plaintext payloads are shown as they are (the caller already has them), not refused.
    status, _, body = served.post(payloads=[plain()])
    assert status == 200 and json_format.Parse(body, Payloads()).payloads[0] == plain()
    # Encode (the UI sends signal and update input through it) gives a payload the workers read.
    status, _, body = served.post("/encode", payloads=[plain()])
    assert status == 200
    [encoded] = json_format.Parse(body, Payloads()).payloads
    assert encoded.metadata["encoding"] == b"binary/encrypted"
    assert EncryptionCodec(KEY).decrypt(encoded) == plain()

    for token in (None, "", TOKEN[:-1], TOKEN + "x", TOKEN.upper()):
        status, headers, body = served.post(payloads=[stored], token=token)
        assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer"), token
        assert b"secret-bucket" not in body
    status, _, _ = served.post(payloads=[stored], token=None, headers={"Authorization": f"Basic {TOKEN}"})
    assert status == 401


def test_codec_server_checks_namespace_origin_and_host(served: Served) -> None:
    stored = EncryptionCodec(KEY).encrypt(plain())
    assert served.post(payloads=[stored], namespace=None)[0] == 403
    assert served.post(payloads=[stored], namespace="other")[0] == 403
    status, headers, _ = served.post(payloads=[stored], origin="http://evil.example")
    assert status == 403 and "Access-Control-Allow-Origin" not in headers
    assert served.post(payloads=[stored], origin=UI + ".evil.example")[0] == 403
    # DNS rebinding: a page of evil.example whose name now resolves to 127.0.0.1 sends its own Host.
    assert served.post(payloads=[stored], host=f"evil.example:{served.port}", origin=UI)[0] == 421
    assert served.post(payloads=[stored], host=f"localhost:{served.port}")[0] == 200
    assert served.post("/other", payloads=[stored])[0] == 404

    # A browser preflight (no credentials) is answered for the UI's origin only.
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=5)
    for origin, expected in ((UI, 204), ("http://evil.example", 403)):
        conn.request("OPTIONS", "/decode", headers={"Origin": origin, "Access-Control-Request-Method": "POST"})
        response = conn.getresponse()
        response.read()
        assert response.status == expected
        assert (response.getheader("Access-Control-Allow-Origin") == UI) == (expected == 204)
        conn.close()


def test_codec_server_errors_are_generic(served: Served) -> None:
    unknown = EncryptionCodec(OLD_KEY).encrypt(plain())
    status, _, body = served.post(payloads=[unknown])
    assert status == 400 and json.loads(body) == {"error": "could not decode the payloads"}
    assert key_id(OLD_KEY) not in body and key_id(KEY) not in body
    status, _, body = served.post(body=b'{"payloads": [{"data": 12')
    assert status == 400 and json.loads(body) == {"error": "could not decode the payloads"}


def test_codec_server_caps_the_body_and_times_out_idle_connections() -> None:
    s = Served(ServerConfig(token=TOKEN, max_body_bytes=1024, timeout=0.5))
    try:
        big = [plain(b"x" * 2048)]
        assert s.post("/encode", payloads=big)[0] == 413
        # Refused on the declared length, before reading: the server does not wait for 1 GiB.
        started = time.monotonic()
        status, _, _ = s.post("/encode", body=b"", headers={"Content-Length": str(1 << 30)})
        assert status == 413 and time.monotonic() - started < 2
        assert s.post("/encode", body=b"{}", headers={"Transfer-Encoding": "chunked"})[0] == 411
        assert s.post("/encode", body=b"{}", headers={"Content-Length": "x"})[0] == 411
        # Unauthenticated requests are refused before the body is read as well.
        assert s.post("/encode", body=b"", token=None, headers={"Content-Length": str(1 << 30)})[0] == 401

        # A client that connects and sends nothing is dropped after the socket timeout.
        with socket.create_connection(("127.0.0.1", s.port), timeout=5) as sock:
            started = time.monotonic()
            assert sock.recv(1) == b""
            assert 0.3 < time.monotonic() - started < 3
        # So is one that declares a body and stops sending it.
        with socket.create_connection(("127.0.0.1", s.port), timeout=5) as sock:
            started = time.monotonic()
            sock.sendall(
                f"POST /decode HTTP/1.1\r\nHost: 127.0.0.1:{s.port}\r\nAuthorization: Bearer {TOKEN}\r\n"
                "X-Namespace: default\r\nContent-Length: 100\r\n\r\n{".encode()
            )
            reply = sock.recv(4096)
            assert reply.startswith(b"HTTP/1.1 400") and time.monotonic() - started < 3
    finally:
        s.close()


def test_codec_server_bounds_the_connections_it_serves_at_once() -> None:
    s = Served(ServerConfig(token=TOKEN, timeout=2.0, max_connections=2))
    try:
        stored = EncryptionCodec(KEY).encrypt(plain())
        idle = [socket.create_connection(("127.0.0.1", s.port), timeout=5) for _ in range(2)]
        try:
            time.sleep(0.2)  # both accepted and holding their thread
            # A third connection is closed at once, before any request is read.
            with pytest.raises((ConnectionError, http.client.RemoteDisconnected, OSError)):
                s.post(payloads=[stored])
        finally:
            for sock in idle:
                sock.close()
        # Once the idle ones are gone, requests are served again.
        deadline = time.monotonic() + 5
        while True:
            try:
                assert s.post(payloads=[stored])[0] == 200
                break
            except (ConnectionError, http.client.RemoteDisconnected):
                assert time.monotonic() < deadline
                time.sleep(0.1)
    finally:
        s.close()


def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


def test_codec_server_over_tls(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    s = Served(ServerConfig(token=TOKEN, timeout=1.0), tls=codec_mod.tls_context(str(cert), str(key)))
    try:
        client_ctx = ssl.create_default_context(cafile=str(cert))
        client_ctx.check_hostname = False  # the certificate names localhost; the test dials 127.0.0.1
        stored = EncryptionCodec(KEY).encrypt(plain())
        status, _, body = s.post(payloads=[stored], context=client_ctx)
        assert status == 200 and json_format.Parse(body, Payloads()).payloads[0] == plain()
        # Plain HTTP to the TLS port gets no answer; a slow TLS client does not stall the others.
        with socket.create_connection(("127.0.0.1", s.port), timeout=5) as idle:
            assert s.post(payloads=[stored], context=client_ctx)[0] == 200
            idle.sendall(b"POST /decode HTTP/1.1\r\n\r\n")
            try:
                reply = idle.recv(100)
            except ConnectionResetError:
                reply = b""
            assert not reply.startswith(b"HTTP/")
    finally:
        s.close()


def serve(*args: str, **env: str) -> subprocess.Popen[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("S3BATCH_")}
    return subprocess.Popen(
        [sys.executable, "-m", "s3batch.codec", "serve", *args],
        cwd=ROOT,
        env={**clean, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_codec_server_refuses_to_listen_beyond_loopback_without_tls_and_a_token(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    key_env = {"S3BATCH_ENCRYPTION_KEY": b64(KEY)}
    for args, env in (
        (["--host", "0.0.0.0"], key_env),
        (["--host", "0.0.0.0"], {**key_env, "S3BATCH_CODEC_TOKEN": TOKEN}),
        (["--host", "0.0.0.0", "--tls-cert", str(cert), "--tls-key", str(key)], key_env),
        (["--host", "0.0.0.0", "--tls-cert", str(cert)], {**key_env, "S3BATCH_CODEC_TOKEN": TOKEN}),
        (["--port", "0"], {**key_env, "S3BATCH_CODEC_TOKEN": "short"}),
        (["--port", "0"], {}),
    ):
        proc = serve(*args, **env)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 2, (args, err)
        assert b64(KEY) not in err and TOKEN not in err


def test_codec_server_process_serves_with_the_token_from_the_environment() -> None:
    keys = f"{b64(KEY)},{b64(OLD_KEY)}"
    proc = serve("--port", "0", "--namespace", "jobs", S3BATCH_ENCRYPTION_KEYS=keys, S3BATCH_CODEC_TOKEN=TOKEN)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        port = int(json.loads(line)["codec_server"].rsplit(":", 1)[1])
        stored = EncryptionCodec(OLD_KEY).encrypt(plain())
        assert post(port, payloads=[stored], namespace="default")[0] == 403
        status, _, body = post(port, payloads=[stored], namespace="jobs")
        assert status == 200 and json_format.Parse(body, Payloads()).payloads[0] == plain()
        assert post(port, payloads=[stored], namespace="jobs", token="wrong-token-0123456789")[0] == 401
    finally:
        proc.terminate()
        proc.communicate(timeout=10)


# ------------------------------------------------------------------------------------ end to end


async def test_encrypted_job_and_codec_server(stack: Stack, s3: Any, buckets: tuple[str, str]) -> None:
    src, out = buckets
    key_name = f"secret-project-{uuid.uuid4().hex[:6]}/data.jsonl"
    s3.put_object(Bucket=src, Key=key_name, Body=b'{"a": 1}\n')
    client = await Client.connect(
        stack.config.temporal_address, plugins=[S3BatchPlugin(make_client(), encryption_key=KEY)]
    )
    task_queue = f"tq-{uuid.uuid4().hex[:8]}"
    job_id = f"enc-{uuid.uuid4().hex[:8]}"
    async with Worker(client, task_queue=task_queue, activity_executor=ThreadPoolExecutor(4)):
        result = await client.execute_workflow(
            S3BatchWorkflow.run,
            S3BatchInput(bucket=src, output_bucket=out, output_prefix="enc/"),
            id=job_id,
            task_queue=task_queue,
        )
    assert result.totals.records_written == 1

    # Without the key, the stored history is opaque: no bucket, no object key in clear.
    plain_client = await Client.connect(stack.config.temporal_address, plugins=[S3BatchPlugin(encryption_key=b"")])
    history = await plain_client.get_workflow_handle(job_id).fetch_history()
    raw = history.to_json()
    assert src not in raw and "secret-project" not in raw
    started = history.events[0].workflow_execution_started_event_attributes
    assert started.input.payloads[0].metadata["encoding"] == b"binary/encrypted"

    # The codec server turns the stored payload back into the job input, for the Web UI.
    s = Served(ServerConfig(token=TOKEN, allow_origins=[UI]))
    try:
        status, headers, body = s.post(payloads=[started.input.payloads[0]], origin=UI)
    finally:
        s.close()
    assert status == 200 and headers["Access-Control-Allow-Origin"] == UI
    decoded = json.loads(body)
    job = json.loads(base64.b64decode(decoded["payloads"][0]["data"]))
    assert job["bucket"] == src and job["output_prefix"] == "enc/"


def test_key_ids_command_prints_the_ids_current_first_and_never_a_key() -> None:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("S3BATCH_")}
    env = {**clean, "S3BATCH_ENCRYPTION_KEYS": f"{b64(KEY)}\n{b64(OLD_KEY)}"}
    command = [sys.executable, "-m", "s3batch.codec", "key-ids"]
    shown = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=30)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.split() == [key_id(KEY).decode(), key_id(OLD_KEY).decode()]
    assert b64(KEY) not in shown.stdout + shown.stderr

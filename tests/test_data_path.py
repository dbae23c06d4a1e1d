"""The cost of a file (issue 31): a small file's requests and heartbeats, and its data requests through obstore
(``s3batch.objects``) writing exactly what boto3 writes, with the same guarantees (pinned reads, errors)."""

from __future__ import annotations

import http.server
import itertools
import threading
from typing import Any

import pytest
from botocore.exceptions import ClientError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from s3batch.activities.s3_activities import S3Activities
from temporalio.testing import ActivityEnvironment

from s3batch import layout
from s3batch.errors import NotFound, SourceChanged
from s3batch.messages import FileResult, ObjectRef, ProcessFileInput, ProcessGroupInput
from s3batch.objects import addressable, data_stores
from s3batch.s3io import make_client, open_object


def put(s3: Any, bucket: str, key: str, body: bytes) -> ObjectRef:
    s3.put_object(Bucket=bucket, Key=key, Body=body)
    item = s3.list_objects_v2(Bucket=bucket, Prefix=key)["Contents"][0]
    return ObjectRef(key=key, etag=item["ETag"].strip('"'), size=item["Size"])


def group(buckets: tuple[str, str], objs: list[ObjectRef], out: str) -> ProcessGroupInput:
    src, dst = buckets
    first = ProcessFileInput(
        job_id="job-cost",
        bucket=src,
        obj=objs[0],
        output_bucket=dst,
        output_prefix=out,
        format="auto",
        handler="passthrough",
        chunk_records=1_000,
        max_record_bytes=1024 * 1024,
    )
    return ProcessGroupInput(file=first, more=objs[1:])


def run_group(client: Any, req: ProcessGroupInput) -> tuple[list[FileResult], list[tuple[Any, ...]]]:
    beats: list[tuple[Any, ...]] = []
    env = ActivityEnvironment()
    env.on_heartbeat = lambda *details: beats.append(details)
    return env.run(S3Activities(client).process_group, req), beats


def outputs(s3: Any, bucket: str, prefix: str) -> dict[str, tuple[bytes, str, dict[str, str]]]:
    """Every object under ``prefix``: (bytes, content type, user metadata), by key below ``prefix``."""
    found = {}
    for item in s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", []):
        got = s3.get_object(Bucket=bucket, Key=item["Key"])
        found[item["Key"][len(prefix) :]] = (got["Body"].read(), got["ContentType"], got["Metadata"])
    return found


def test_a_small_file_costs_one_get_one_put_and_no_heartbeat_of_its_own(
    s3: Any, buckets: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    src, out = buckets
    objs = [put(s3, src, f"small/f{i:02d}.csv", b"id,name\n%d,n%d\n%d,m\n" % (i, i, i + 100)) for i in range(12)]
    counted = make_client()
    calls: list[str] = []
    counted.meta.events.register("before-call.s3.*", lambda event_name, **_: calls.append(event_name.split(".")[-1]))
    results, beats = run_group(counted, group(buckets, objs, "obstore/"))
    assert [r.status for r in results] == ["succeeded"] * 12
    stores = data_stores(counted)
    assert stores is not None
    # The data requests through obstore, one GET and one PUT a file; boto3: the group's two LISTs.
    assert dict(stores.counts) == {"GetObject": 12, "PutObject": 12}
    assert sorted(calls) == ["ListObjectsV2"] * 2
    # The group's files share one heartbeat clock: not two heartbeats a file (24 before).
    assert 1 <= len(beats) <= 4, beats

    monkeypatch.setenv("S3BATCH_DATA_CLIENT", "boto3")
    plain = make_client()
    assert data_stores(plain) is None
    calls.clear()
    plain.meta.events.register("before-call.s3.*", lambda event_name, **_: calls.append(event_name.split(".")[-1]))
    results, _ = run_group(plain, group(buckets, objs, "boto3/"))
    assert [r.status for r in results] == ["succeeded"] * 12
    assert sorted(calls) == ["GetObject"] * 12 + ["ListObjectsV2"] * 2 + ["PutObject"] * 12
    # Byte for byte the same output: data, content type, the checkpoint and job mark in the user metadata.
    through_obstore, through_boto3 = outputs(s3, out, "obstore/"), outputs(s3, out, "boto3/")
    assert len(through_obstore) == 12
    assert through_obstore == through_boto3


def test_data_reads_are_pinned_to_the_listed_version(s3: Any, buckets: tuple[str, str]) -> None:
    src, _ = buckets
    obj = put(s3, src, "pinned.csv", b"id\n1\n2\n")
    client = make_client()
    assert data_stores(client) is not None
    with open_object(client, src, obj.key, etag=obj.etag, size=obj.size, start=3) as body:
        assert body.read() == b"1\n2\n"  # a ranged GET from a byte on
    s3.put_object(Bucket=src, Key=obj.key, Body=b"id\n3\n4\n")  # overwritten since it was listed
    with pytest.raises(SourceChanged), open_object(client, src, obj.key, etag=obj.etag, size=obj.size) as body:
        body.read()
    s3.delete_object(Bucket=src, Key=obj.key)
    with pytest.raises(NotFound), open_object(client, src, obj.key, etag=obj.etag, size=obj.size) as body:
        body.read()


def test_a_group_file_changed_since_listing_fails_alone_through_obstore(s3: Any, buckets: tuple[str, str]) -> None:
    src, out = buckets
    objs = [put(s3, src, f"g/f{i}.csv", b"id\n%d\n" % i) for i in range(3)]
    s3.put_object(Bucket=src, Key=objs[1].key, Body=b"id\n99\n")
    results, _ = run_group(make_client(), group(buckets, objs, "changed/"))
    assert [r.status for r in results] == ["succeeded", "failed", "succeeded"]
    assert (results[1].error or "").startswith("SourceChanged")
    written = sorted(outputs(s3, out, "changed/"))
    assert [k.split("/part-")[0] for k in written] == [layout.encode_key(objs[0].key), layout.encode_key(objs[2].key)]


def test_put_with_server_side_encryption_options_goes_through_boto3(
    s3: Any, buckets: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # obstore is given no SSE options: a worker asking for them writes its parts with boto3, as before.
    src, _ = buckets
    objs = [put(s3, src, "sse/f.csv", b"id\n1\n")]
    monkeypatch.setenv("S3BATCH_OUTPUT_SSE", "AES256")
    client = make_client()
    calls: list[str] = []
    client.meta.events.register("before-call.s3.*", lambda event_name, **_: calls.append(event_name.split(".")[-1]))
    try:
        results, _ = run_group(client, group(buckets, objs, "sse/"))
    except Exception as err:  # noqa: BLE001 - SeaweedFS may refuse SSE: then at least boto3 sent it
        assert "PutObject" in calls, err
        return
    assert [r.status for r in results] == ["succeeded"]
    assert "PutObject" in calls


def _recording_server(seen: list[dict[str, str]]) -> http.server.HTTPServer:
    """A server on loopback that answers 404 to every GET and keeps each request's headers."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append({k.lower(): v for k, v in self.headers.items()})
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *_: Any) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_data_requests_are_signed_with_the_clients_own_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    # A client made with keys of its own (a plugin given a user's client): obstore signs with those, not with
    # what the default chain finds in the environment (before: the environment's keys, another identity).
    seen: list[dict[str, str]] = []
    server = _recording_server(seen)
    try:
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAENVIRONMENTKEY00")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "environment-secret")
        import boto3

        own = boto3.session.Session().client(
            "s3",
            endpoint_url=f"http://127.0.0.1:{server.server_port}",
            region_name="us-east-1",
            aws_access_key_id="AKIACLIENTSOWNKEY000",
            aws_secret_access_key="client-secret",
        )
        stores = data_stores(own)
        assert stores is not None
        with pytest.raises(NotFound):
            stores.get("bucket", "a/key.csv", etag="abc", start=0, end=10)
    finally:
        server.shutdown()
    assert "Credential=AKIACLIENTSOWNKEY000/" in seen[0]["authorization"], seen[0]["authorization"]


def test_each_client_reads_the_credential_chain_afresh(monkeypatch: pytest.MonkeyPatch) -> None:
    # The clients share botocore's loader of service models (make_client: 0.2 s of CPU a client before), not a
    # session: keys rotated in the environment (or a profile changed) reach the next client made.
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAFIRSTKEY00000000")
    first = make_client()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIASECONDKEY0000000")
    second = make_client()
    keys = [c._request_signer._credentials.get_frozen_credentials().access_key for c in (first, second)]
    assert keys == ["AKIAFIRSTKEY00000000", "AKIASECONDKEY0000000"]
    assert first._loader is second._loader


def test_data_requests_carry_the_expected_bucket_owner_and_the_conditions(monkeypatch: pytest.MonkeyPatch) -> None:
    # What obstore sends, seen by a server that answers 404 to everything: the owner boto3's requests carry
    # (S3 then refuses a bucket of another account), the listed ETag and the range; a 404 is NotFound.
    seen: list[dict[str, str]] = []
    server = _recording_server(seen)
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://127.0.0.1:{server.server_port}")
        # Keys of its own: without them the test depended on another test's stack having set them (and failed in
        # make test-quick, which starts none).
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIATESTOWNERKEY0000")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test-owner-secret")
        stores = data_stores(make_client(expected_bucket_owner="123456789012"))
        assert stores is not None
        with pytest.raises(NotFound):
            stores.get("bucket", "a/key.csv", etag="abc", start=5, end=10)
    finally:
        server.shutdown()
    assert seen[0]["x-amz-expected-bucket-owner"] == "123456789012"
    assert (seen[0]["if-match"], seen[0]["range"]) == ('"abc"', "bytes=5-9")


# Keys as S3 takes them (any UTF-8, up to 1,024 bytes), with what obstore's paths treat otherwise: slashes at
# either end and doubled, '.' and '..' segments, control characters, escapes, non-ASCII. No backslash: SeaweedFS
# keeps it as '/', under another key than the one written (its directories), which is not what this compares.
KEY_TEXT = st.text(alphabet=st.sampled_from(list("ab/.%+ ~?#&=\t\x7f\x1b\x85üñ😀\u2028")), min_size=1, max_size=12)


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=KEY_TEXT)
def test_any_key_is_read_and_written_as_boto3_reads_and_writes_it(s3: Any, buckets: tuple[str, str], key: str) -> None:
    """Differential, against boto3 on the same server: the reader (through obstore where the key allows it)
    reads the object boto3 wrote at ``key``, not another; a PUT through obstore lands where boto3's lands.
    Before 'addressable', obstore read 'a' for '/a' and 'a/', and refused a key with a tab: the file failed."""
    src, _ = buckets
    n = next(_EXAMPLES)
    body = f"{n}:{key}".encode()
    try:
        etag = s3.put_object(Bucket=src, Key=key, Body=body)["ETag"].strip('"')
        stored = s3.get_object(Bucket=src, Key=key)["Body"].read()
    except ClientError:
        stored = None
    if stored != body:
        # A key this server refuses ('.' and '..' segments) or keeps as a folder (SeaweedFS: a key ending in
        # '/'), so boto3 does not read it back either: nothing to compare.
        return
    client = make_client()
    with open_object(client, src, key, etag=etag, size=len(body)) as reader:
        assert reader.read() == body
    stores = data_stores(client, key)
    assert (stores is not None) == addressable(key)
    if stores is None:
        return
    stores.put(src, f"o{n}/{key}", b"obstore", "text/plain", {"k": "v"})
    s3.put_object(Bucket=src, Key=f"b{n}/{key}", Body=b"boto3", ContentType="text/plain", Metadata={"k": "v"})
    landed = {
        side: [
            o["Key"].removeprefix(f"{side}{n}/")
            for o in s3.list_objects_v2(Bucket=src, Prefix=f"{side}{n}/")["Contents"]
        ]
        for side in "ob"
    }
    assert landed["o"] == landed["b"], landed


_EXAMPLES = itertools.count()


def test_keys_obstore_would_alter_are_not_given_to_it() -> None:
    assert all(addressable(k) for k in ["a", "a/b.csv", "a b%20+c", "ü/😀", "...", "a/...", "a\\b", "a\x85b"])
    assert not any(addressable(k) for k in ["", "/a", "a/", "a//b", "./a", "a/../b", "a/.", "a\tb", "a\x7fb", "a\x00"])


def test_temporary_keys_are_asked_again_before_they_expire() -> None:
    # obstore keeps an answer until its expires_at: never past the keys' own end (a role's keys refreshed by
    # botocore), at most five minutes for keys without one.
    from datetime import UTC, datetime, timedelta

    from botocore.credentials import Credentials, RefreshableCredentials

    from s3batch.objects import ClientCredentials

    ends = datetime.now(UTC) + timedelta(minutes=20)
    temporary = RefreshableCredentials(
        "AKIATEMPORARY0000000", "s", "token", ends, refresh_using=lambda: {}, method="assume-role"
    )
    for keys, latest in [(temporary, ends - timedelta(seconds=60)), (Credentials("AKIASTATIC", "s"), None)]:
        client = make_client()
        client._request_signer._credentials = keys
        answer = ClientCredentials(client)()
        assert answer["access_key_id"] == keys.access_key
        assert answer["expires_at"] <= (latest or datetime.now(UTC) + timedelta(minutes=5))


def _tls_files(tmp_path: Any) -> tuple[str, str, str]:
    """A private CA and a server certificate it signed for 127.0.0.1: (CA file, certificate, key)."""
    import datetime as dt
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = dt.datetime.now(dt.UTC)

    def cert(subject: str, key: Any, issuer: str, signer: Any, ca: bool) -> x509.Certificate:
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if not ca:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False
            )
        return builder.sign(signer, hashes.SHA256())

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = cert("test CA", ca_key, "test CA", ca_key, True)
    leaf = cert("127.0.0.1", key, "test CA", ca_key, False)
    paths = (tmp_path / "ca.pem", tmp_path / "server.pem", tmp_path / "server.key")
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return str(paths[0]), str(paths[1]), str(paths[2])


def test_an_endpoint_behind_a_private_ca_is_trusted_as_boto3_trusts_it(tmp_path: Any) -> None:
    # A self-hosted S3 with a certificate of a private CA, given to boto3 as verify= (or AWS_CA_BUNDLE): obstore
    # trusts that CA too (before: its requests failed the TLS handshake where boto3's succeeded, so every file
    # failed), and a client with verify=False checks nothing in either.
    import ssl

    import boto3

    ca, certificate, key = _tls_files(tmp_path)
    seen: list[dict[str, str]] = []
    server = _recording_server(seen)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certificate, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    endpoint = f"https://127.0.0.1:{server.server_port}"
    try:
        for verify in (ca, False):
            own = boto3.session.Session().client(
                "s3",
                endpoint_url=endpoint,
                region_name="us-east-1",
                verify=verify,
                aws_access_key_id="AKIAEXAMPLE",
                aws_secret_access_key="secret",
            )
            stores = data_stores(own)
            assert stores is not None
            with pytest.raises(NotFound):  # the server's 404: the handshake succeeded
                stores.get("bucket", "a/key.csv", etag=None, start=0, end=None)
        plain = boto3.session.Session().client(
            "s3",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id="AKIAEXAMPLE",
            aws_secret_access_key="secret",
        )
        stores = data_stores(plain)
        assert stores is not None
        with pytest.raises(Exception) as refused:  # the CA is not trusted: no answer at all
            stores.get("bucket", "a/key.csv", etag=None, start=0, end=None)
        assert not isinstance(refused.value, NotFound)
    finally:
        server.shutdown()
    assert len(seen) == 2

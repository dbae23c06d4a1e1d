"""Issue 33: the local S3 server checks credentials as S3 does. Before, SeaweedFS started without identities took
any key and secret, so a wrong-credentials error could not be tried locally; now it has one identity
(``s3batch.dev.stack.s3_identities``: the key ``s3batch-stack env`` exports) and refuses any other."""

from __future__ import annotations

from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from s3batch.cli.output import EXIT_ERROR
from s3batch.dev.stack import ACCESS_KEY, REGION, SECRET_KEY, Stack
from tests.helpers import run


def client_with(stack: Stack, key: str, secret: str) -> Any:
    return boto3.client(
        "s3", endpoint_url=stack.config.s3_endpoint, aws_access_key_id=key, aws_secret_access_key=secret,
        region_name=REGION, config=Config(retries={"max_attempts": 1}),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("key", "secret", "code"),
    [(ACCESS_KEY, "not-the-secret", "SignatureDoesNotMatch"), ("AKIANOSUCHKEY", SECRET_KEY, "InvalidAccessKeyId")],
)
def test_a_wrong_key_or_secret_is_refused_as_s3_does(
    stack: Stack, buckets: tuple[str, str], key: str, secret: str, code: str
) -> None:
    src, _ = buckets
    right = client_with(stack, ACCESS_KEY, SECRET_KEY)
    right.put_object(Bucket=src, Key="a.csv", Body=b"id\n1\n")
    assert right.get_object(Bucket=src, Key="a.csv")["Body"].read() == b"id\n1\n"
    assert src in [b["Name"] for b in right.list_buckets()["Buckets"]]
    wrong = client_with(stack, key, secret)
    for call in (lambda: wrong.get_object(Bucket=src, Key="a.csv"), lambda: wrong.list_objects_v2(Bucket=src)):
        with pytest.raises(ClientError) as refused:
            call()
        assert refused.value.response["Error"]["Code"] == code


async def test_a_wrong_secret_is_a_clear_s3batch_error(stack: Stack, buckets: tuple[str, str]) -> None:
    src, out = buckets
    r = await run(
        "s3batch", "start", "--bucket", src, "--output-bucket", out, "--dry-run",
        env={"AWS_SECRET_ACCESS_KEY": "not-the-secret"},
    )  # fmt: skip
    assert r.code == EXIT_ERROR and "Traceback" not in r.stderr, r
    [line] = r.stderr.strip().splitlines()
    assert f"s3://{src}" in line and "the S3 server refused the credentials (SignatureDoesNotMatch" in line, line
    assert "AWS_SECRET_ACCESS_KEY" in line and "not-the-secret" not in line, line

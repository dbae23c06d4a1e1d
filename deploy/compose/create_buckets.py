"""One-shot: create the S3 buckets named in ``S3BATCH_BUCKETS`` (comma-separated), idempotently.

Runs in the worker image (docker-compose.yml, service ``create-buckets``) with boto3's usual
environment (``AWS_ENDPOINT_URL_S3``, ``AWS_ACCESS_KEY_ID``, ...). Against AWS, create buckets with
your infrastructure tooling instead: the workers' IAM policy (deploy/iam/) cannot create buckets.
"""

from __future__ import annotations

import os
import sys
import time

import boto3
from botocore.exceptions import BotoCoreError, ClientError


def main() -> int:
    names = [n.strip() for n in os.environ.get("S3BATCH_BUCKETS", "").split(",") if n.strip()]
    if not names:
        sys.stderr.write("S3BATCH_BUCKETS is empty: nothing to create\n")
        return 2
    s3 = boto3.client("s3")
    for attempt in range(30):  # the store may still be starting
        try:
            s3.list_buckets()
            break
        except (BotoCoreError, ClientError) as err:
            sys.stderr.write(f"waiting for S3 ({err})\n")
            time.sleep(1 + attempt * 0.2)
    for name in names:
        try:
            s3.create_bucket(Bucket=name)
            sys.stdout.write(f"bucket {name}: created\n")
        except ClientError as err:
            code = err.response.get("Error", {}).get("Code", "")
            if code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                raise
            sys.stdout.write(f"bucket {name}: exists\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

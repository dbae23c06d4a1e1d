"""A manifest that starts with a UTF-8 byte order mark, as spreadsheet tools write a CSV ("CSV UTF-8" of
Excel, LibreOffice) and some tools a JSONL (issue 29): read as the same manifest without it, on real S3. Only
the file's first bytes are a mark; a key further on that starts with U+FEFF is a key as it is."""

from __future__ import annotations

import gzip
import json
from typing import Any

import pytest
from s3batch.activities.manifest_rows import ManifestPositions
from s3batch.activities.manifests import check_manifest, list_manifest_page
from temporalio.client import Client
from temporalio.worker import Worker

from s3batch.config import Settings
from s3batch.messages import ListObjectsInput
from s3batch.models import S3BatchInput
from tests.helpers.data import csv_rows, make_csv, put_files
from tests.helpers.jobs import execute
from tests.helpers.output import read_jsonl, report

BOM = "\ufeff".encode()


def _body(src: str, keys: list[str], fmt: str) -> bytes:
    if fmt.startswith("jsonl"):
        text = "".join(json.dumps({"bucket": src, "key": k}) + "\n" for k in keys)
    else:
        end = "\r\n" if "crlf" in fmt else "\n"
        lines = (["bucket,key"] if "header" in fmt else []) + [f"{src},{k}" for k in keys]
        text = "".join(line + end for line in lines)
    return BOM + text.encode()


def _listed(s3: Any, uri: str, size: int) -> list[tuple[str | None, str]]:
    """Every object the manifest's pages of ``size`` rows hand out, each page on a worker process of its own."""
    found: list[tuple[str | None, str]] = []
    token: str | None = None
    while True:
        req = ListObjectsInput(bucket="", prefix="", manifest=uri, continuation_token=token, page_size=size)
        page = list_manifest_page(s3, req, ManifestPositions(), Settings.explicit())
        found += [(o.bucket, o.key) for o in page.objects]
        token = page.next_token
        if token is None:
            return found


@pytest.mark.parametrize("fmt", ["csv-header", "csv", "csv-header-crlf", "csv-header.gz", "jsonl", "jsonl.gz"])
def test_a_manifest_starting_with_a_bom_is_read_as_without_it(s3: Any, buckets: tuple[str, str], fmt: str) -> None:
    src, out = buckets
    keys = ["a.csv", "b c.csv", "\ufeffodd.csv", "d.csv"]
    put_files(s3, src, {k: b"x\n1\n" for k in keys})
    body = _body(src, keys, fmt)
    name = f"lists/m.{fmt.split('-')[0].removesuffix('.gz')}" + (".gz" if fmt.endswith(".gz") else "")
    s3.put_object(Bucket=out, Key=name, Body=gzip.compress(body) if name.endswith(".gz") else body)
    uri = f"s3://{out}/{name}"
    check_manifest(s3, uri, Settings.explicit())  # one bucket, each key once: the job may start
    for size in (1, 2, 10):  # a page of a plain manifest after the first is entered at a byte offset
        assert _listed(s3, uri, size) == [(src, k) for k in keys], size


async def test_a_job_over_a_spreadsheets_manifest_processes_its_files(
    client: Client, worker: Worker, s3: Any, buckets: tuple[str, str], task_queue: str
) -> None:
    """A manifest saved by a spreadsheet: BOM, header, CRLF line ends."""
    src, out = buckets
    put_files(s3, src, {"data/a.csv": make_csv(3), "data/b.csv": make_csv(5)})
    s3.put_object(Bucket=out, Key="lists/today.csv", Body=_body(src, ["data/a.csv", "data/b.csv"], "csv-header-crlf"))
    spec = S3BatchInput(manifest=f"s3://{out}/lists/today.csv", output_bucket=out, output_prefix="o/")
    result = await execute(client, task_queue, spec, "manifest-bom")
    assert result.status == "succeeded"
    assert (result.totals.files_listed, result.totals.records_written) == (2, 8)
    assert sorted(f["key"] for f in report(s3, out)["files"]) == ["data/a.csv", "data/b.csv"]
    assert read_jsonl(s3, out, "o/data/b.csv/") == csv_rows(5)

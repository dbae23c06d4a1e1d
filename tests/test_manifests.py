"""Manifests instead of listings, and filters on what a listing takes (issue 14 points 5 and 6):
real jobs on the real stack; the manifest's pages read from real S3."""

from __future__ import annotations

import datetime
import gzip
import io
import json
import time
import urllib.parse
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError
from s3batch.activities.manifest_rows import ManifestPositions
from s3batch.activities.manifests import list_manifest_page
from temporalio.client import Client
from temporalio.worker import Worker

from s3batch.config import Settings
from s3batch.messages import ListObjectsInput, S3BatchResult
from s3batch.models import S3BatchInput
from s3batch.selection import KeyFilter
from tests.helpers import run
from tests.helpers.data import csv_rows, make_csv, put_files
from tests.helpers.jobs import execute
from tests.helpers.output import read_jsonl, report


def _files(s3: Any, out: str) -> dict[str, dict[str, Any]]:
    return {f["key"]: f for f in report(s3, out)["files"]}


def _books(rep: dict[str, Any]) -> None:
    """The report's own books add up over the files taken."""
    t = rep["totals"]
    assert t["files_listed"] == len(rep["files"]) == t["files_succeeded"] + t["files_failed"], t


# ------------------------------------------------------------------ filters


async def test_filters_take_only_the_matching_keys_and_times(
    client: Client, worker: Worker, s3: Any, buckets: tuple[str, str], task_queue: str
) -> None:
    src, out = buckets
    put_files(s3, src, {"in/old.csv": make_csv(3)})
    time.sleep(1.2)  # S3 times are to the second
    cut = datetime.datetime.now(datetime.UTC).replace(microsecond=0).isoformat()
    time.sleep(1.2)
    put_files(
        s3,
        src,
        {
            "in/a.csv": make_csv(5),
            "in/deep/b.csv": make_csv(7),
            "in/skip/c.csv": make_csv(9),
            "in/notes.txt": b"not a data file",
            "in/d.jsonl": b'{"x": 1}\n',
        },
    )
    spec = S3BatchInput(
        bucket=src,
        prefix="in/",
        output_bucket=out,
        output_prefix="o/",
        include=["*.csv", "*.jsonl"],
        exclude=["in/skip/*"],
        modified_after=cut,
    )
    result = await execute(client, task_queue, spec, "filters")
    assert result.status == "succeeded"
    files = _files(s3, out)
    assert sorted(files) == ["in/a.csv", "in/d.jsonl", "in/deep/b.csv"]  # not old, skipped, nor .txt
    assert read_jsonl(s3, out, "o/in/deep/b.csv/") == csv_rows(7)
    rep = report(s3, out)
    _books(rep)
    assert rep["totals"]["files_listed"] == 3  # left out by a filter: not listed

    before = S3BatchInput(bucket=src, prefix="in/", output_bucket=out, output_prefix="p/", modified_before=cut)
    assert (await execute(client, task_queue, before, "filters-before")).status == "succeeded"
    assert [f["key"] for f in report(s3, out, "p/")["files"]] == ["in/old.csv"]


def test_filter_options_are_validated_naming_the_field() -> None:
    with pytest.raises(ValidationError, match="modified_after") as err:
        S3BatchInput(bucket="src", output_bucket="out", modified_after="last tuesday")
    assert "ISO 8601" in str(err.value)
    with pytest.raises(ValidationError, match="modified_after must be earlier"):
        S3BatchInput(bucket="src", output_bucket="out", modified_after="2026-12-01", modified_before="2026-11-01")
    with pytest.raises(ValidationError, match="include"):
        S3BatchInput(bucket="src", output_bucket="out", include="*.csv")  # a list, not a string
    with pytest.raises(ValidationError, match="bucket\n  Field required"):
        S3BatchInput(output_bucket="out")
    with pytest.raises(ValidationError, match="bucket is required"):
        S3BatchInput(bucket="", output_bucket="out")
    with pytest.raises(ValidationError, match="either manifest or bucket"):
        S3BatchInput(bucket="src", manifest="s3://m/list.csv", output_bucket="out")
    # A job without the new options is written as before (no new keys).
    assert not {"manifest", "include", "exclude", "modified_after"} & set(
        S3BatchInput(bucket="src", output_bucket="out").model_dump()
    )
    f = KeyFilter(("*.csv",), ("tmp/*",), "2026-11-30", "2026-12-01T00:00:00+01:00")
    day = datetime.datetime(2026, 11, 30, 12, tzinfo=datetime.UTC)
    assert f.takes("a/b.csv", day) and not f.takes("tmp/b.csv", day) and not f.takes("b.json", day)
    assert not f.takes("b.csv", datetime.datetime(2026, 11, 30, 23, 0, tzinfo=datetime.UTC))  # 00:00+01:00
    assert not f.takes("b.csv", datetime.datetime(2026, 11, 29, 23, 59, tzinfo=datetime.UTC))


# ------------------------------------------------------------------ manifests


async def test_plain_csv_manifest_pins_versions_and_reports_a_missing_key_as_failed(
    client: Client, worker: Worker, s3: Any, buckets: tuple[str, str], task_queue: str
) -> None:
    src, out = buckets
    s3.put_bucket_versioning(Bucket=src, VersioningConfiguration={"Status": "Enabled"})
    first = s3.put_object(Bucket=src, Key="data/v.csv", Body=make_csv(4))["VersionId"]
    s3.put_object(Bucket=src, Key="data/v.csv", Body=make_csv(40))  # the current version: not the one named
    put_files(s3, src, {"data/a b.csv": make_csv(6), "data/never.csv": make_csv(2)})
    manifest = f"bucket,key,version_id\n{src},data/v.csv,{first}\n{src},data/a b.csv,\n{src},data/gone.csv,\n"
    s3.put_object(Bucket=out, Key="lists/today.csv", Body=manifest.encode())
    spec = S3BatchInput(manifest=f"s3://{out}/lists/today.csv", output_bucket=out, output_prefix="o/",
                        max_failed_files=1)
    result = await execute(client, task_queue, spec, "manifest-csv")
    assert result.status == "succeeded"
    files = _files(s3, out)
    assert sorted(files) == ["data/a b.csv", "data/gone.csv", "data/v.csv"]  # never.csv is not in the list
    assert files["data/v.csv"]["records"] == 4  # the version named, not the current 40 rows
    assert read_jsonl(s3, out, "o/data/v.csv/") == csv_rows(4)
    assert read_jsonl(s3, out, "o/data/a b.csv/") == csv_rows(6)
    gone = files["data/gone.csv"]
    assert gone["status"] == "failed", gone
    assert "does not exist" in gone["error"] and f"s3://{src}/data/gone.csv" in gone["error"]
    _books(report(s3, out))


def _inventory_csv(src: str, keys: list[str]) -> bytes:
    lines = [f'"{src}","{urllib.parse.quote_plus(k, safe="/")}","","true","false","{i}"' for i, k in enumerate(keys)]
    return gzip.compress(("\n".join(lines) + "\n").encode())


async def test_s3_inventory_manifest_csv_and_parquet_data_files(
    client: Client, worker: Worker, s3: Any, buckets: tuple[str, str], task_queue: str
) -> None:
    src, out = buckets
    keys = [f"inv/f{i} x+y.csv" for i in range(5)]
    put_files(s3, src, {k: make_csv(i + 1) for i, k in enumerate(keys)})
    s3.put_object(Bucket=out, Key="inventory/data/1.csv.gz", Body=_inventory_csv(src, keys[:3]))
    s3.put_object(Bucket=out, Key="inventory/data/2.csv.gz", Body=_inventory_csv(src, [*keys[3:], "inv/gone.csv"]))
    manifest = {
        "sourceBucket": src,
        "destinationBucket": f"arn:aws:s3:::{out}",
        "version": "2016-11-30",
        "fileFormat": "CSV",
        "fileSchema": "Bucket, Key, VersionId, IsLatest, IsDeleteMarker, Size",
        "files": [{"key": "inventory/data/1.csv.gz"}, {"key": "inventory/data/2.csv.gz"}],
    }
    s3.put_object(Bucket=out, Key="inventory/manifest.json", Body=json.dumps(manifest).encode())
    spec = S3BatchInput(manifest=f"s3://{out}/inventory/manifest.json", output_bucket=out, output_prefix="o/",
                        max_failed_files=1, exclude=["*f4*"])
    assert (await execute(client, task_queue, spec, "inventory")).status == "succeeded"
    files = _files(s3, out)
    assert sorted(files) == sorted([*keys[:4], "inv/gone.csv"])  # URL-decoded keys; f4 excluded
    assert [files[k]["records"] for k in keys[:4]] == [1, 2, 3, 4]
    assert files["inv/gone.csv"]["status"] == "failed"
    _books(report(s3, out))

    # The same inventory as Parquet, with a delete marker and an old version that are skipped.
    table = pa.table(
        {
            "bucket": [src] * 4,
            "key": [keys[0], keys[1], keys[2], keys[2]],
            "version_id": [None, None, None, "old"],
            "is_latest": [True, True, True, False],
            "is_delete_marker": [False, True, False, False],
        }
    )
    buf = io.BytesIO()
    pq.write_table(table, buf)
    s3.put_object(Bucket=out, Key="inventory-pq/data/1.parquet", Body=buf.getvalue())
    manifest.update(fileFormat="Parquet", files=[{"key": "inventory-pq/data/1.parquet"}])
    s3.put_object(Bucket=out, Key="inventory-pq/manifest.json", Body=json.dumps(manifest).encode())
    spec = S3BatchInput(manifest=f"s3://{out}/inventory-pq/manifest.json", output_bucket=out, output_prefix="q/")
    assert (await execute(client, task_queue, spec, "inventory-pq")).status == "succeeded"
    assert sorted(f["key"] for f in report(s3, out, "q/")["files"]) == [keys[0], keys[2]]


def test_manifest_pages_hand_out_every_row_once_across_data_files(s3: Any, buckets: tuple[str, str]) -> None:
    src, out = buckets
    keys = [f"k{i:02d}.csv" for i in range(11)]
    put_files(s3, src, {k: b"a\n1\n" for k in keys})
    s3.put_object(Bucket=out, Key="i/1.csv.gz", Body=_inventory_csv(src, keys[:4]))
    s3.put_object(Bucket=out, Key="i/2.csv.gz", Body=_inventory_csv(src, keys[4:]))
    doc = {"sourceBucket": src, "destinationBucket": f"arn:aws:s3:::{out}", "fileFormat": "CSV",
           "fileSchema": "Bucket, Key", "files": [{"key": "i/1.csv.gz"}, {"key": "i/2.csv.gz"}]}
    s3.put_object(Bucket=out, Key="i/manifest.json", Body=json.dumps(doc).encode())
    for size in (1, 3, 4, 11, 50):
        seen, token, pages = [], None, 0
        while True:
            page = list_manifest_page(
                s3, ListObjectsInput(bucket="", prefix="", manifest=f"s3://{out}/i/manifest.json",
                                     continuation_token=token, page_size=size),
                ManifestPositions(),
                Settings.explicit(),
            )
            pages += 1
            assert len(page.objects) <= size
            seen += [(o.bucket, o.key) for o in page.objects]
            token = page.next_token
            if token is None:
                break
        assert seen == [(src, k) for k in keys], size
        assert pages == -(-len(keys) // size), size  # no empty page at the end


def test_a_manifest_naming_two_buckets_is_refused_naming_the_row(s3: Any, buckets: tuple[str, str]) -> None:
    src, out = buckets
    put_files(s3, src, {"a.csv": b"a\n"})
    s3.put_object(Bucket=out, Key="two.csv", Body=f"{src},a.csv\n{out},two.csv\n".encode())
    req = ListObjectsInput(bucket="", prefix="", manifest=f"s3://{out}/two.csv")
    with pytest.raises(Exception, match="names objects of two buckets") as err:
        list_manifest_page(s3, req, ManifestPositions(), Settings.explicit())
    assert "row 2" in str(err.value)


async def test_a_manifest_over_three_pages_and_runs_processes_each_named_key_once(
    client: Client, worker: Worker, s3: Any, buckets: tuple[str, str], task_queue: str
) -> None:
    src, out = buckets
    n = 1_100  # pages of 500, 500 and 100 rows; runs of 500 files (continue-as-new)
    keys = [f"many/{i:05d}.jsonl" for i in range(n)]
    put_files(s3, src, {k: b'{"i": %d}\n' % i for i, k in enumerate(keys) if i % 400 != 7})  # 3 never uploaded
    lines = [json.dumps({"bucket": src, "key": k}) for k in keys]
    s3.put_object(Bucket=out, Key="lists/many.jsonl", Body=("\n".join(lines) + "\n").encode())
    spec = S3BatchInput(manifest=f"s3://{out}/lists/many.jsonl", output_bucket=out, output_prefix="o/",
                        max_failed_files=3)
    result = await execute(client, task_queue, spec, "manifest-pages")
    assert result.status == "succeeded"
    t = result.totals
    assert (t.files_listed, t.files_succeeded, t.files_failed) == (n, n - 3, 3)
    rep = report(s3, out)
    assert sorted(f["key"] for f in rep["files"]) == keys  # each named key exactly once
    assert sorted(f["key"] for f in rep["files"] if f["status"] == "failed") == [keys[7], keys[407], keys[807]]
    assert t.records_written == n - 3


async def test_temporal_cli_starts_manifest_filter_and_parquet_jobs_with_plain_json(
    client: Client, worker: Worker, s3: Any, buckets: tuple[str, str], task_queue: str, stack: Any
) -> None:
    """The ``temporal workflow start`` examples of docs/how-to/manifests.md, as written there (buckets renamed)."""
    src, out = buckets
    put_files(s3, src, {"exports/2026/a.csv": make_csv(3), "exports/2026/tmp/b.csv": make_csv(2)})
    table = pa.table({"id": [1, 2], "at": pa.array([0, 1_000], pa.timestamp("ms", tz="UTC"))})
    buf = io.BytesIO()
    pq.write_table(table, buf)
    s3.put_object(Bucket=src, Key="events/e.parquet", Body=buf.getvalue())
    s3.put_object(Bucket=out, Key="lists/today.csv", Body=f"{src},exports/2026/a.csv\n".encode())
    jobs = {
        "manifest": {"manifest": f"s3://{out}/lists/today.csv", "output_bucket": out, "output_prefix": "m/"},
        "filters": {"bucket": src, "prefix": "exports/", "include": ["*.csv"], "exclude": ["*/tmp/*"],
                    "modified_after": "2026-01-01T00:00:00Z", "output_bucket": out, "output_prefix": "f/"},
        "parquet": {"bucket": src, "prefix": "events/", "output_bucket": out, "output_prefix": "p/"},
    }
    for name, job in jobs.items():
        wid = f"cli-{name}-{task_queue}"
        r = await run(
            "temporal", "workflow", "start", "--address", stack.config.temporal_address, "--namespace", "default",
            "--task-queue", task_queue, "--type", "S3BatchWorkflow", "--workflow-id", wid, "--input", json.dumps(job),
        )
        assert r.code == 0, r
        result = await client.get_workflow_handle(wid, result_type=S3BatchResult).result()
        assert result.status == "succeeded", (name, result)
    assert [f["key"] for f in report(s3, out, "m/")["files"]] == ["exports/2026/a.csv"]
    assert [f["key"] for f in report(s3, out, "f/")["files"]] == ["exports/2026/a.csv"]
    assert read_jsonl(s3, out, "p/events/e.parquet/") == [
        {"id": 1, "at": "1970-01-01T00:00:00.000Z"},
        {"id": 2, "at": "1970-01-01T00:00:01.000Z"},
    ]

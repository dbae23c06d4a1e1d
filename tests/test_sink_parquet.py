"""Parquet parts (``{"type": "s3", "format": "parquet"}``) through real jobs: read back by pyarrow as the
source's records, deterministic bytes, the checkpoint on every part, rejects beside them; and the
default sink's JSONL parts unchanged."""

from __future__ import annotations

import io
import json
from typing import Any

import pyarrow.parquet as pq
from temporalio.client import Client
from temporalio.worker import Worker

from s3batch.checkpoint import CHECKPOINT_METADATA, Checkpoint, fingerprint
from s3batch.cli.render import report_destination
from s3batch.messages import ObjectRef, ProcessFileInput
from s3batch.models import S3BatchInput
from s3batch.report import JobReport
from s3batch.sinks.spec import S3Sink, destination
from tests.helpers.assertions import assert_exactly_once
from tests.helpers.data import csv_rows, make_csv
from tests.helpers.jobs import execute
from tests.helpers.output import list_keys, report


def _job(src: str, out: str, prefix: str, **kw: Any) -> S3BatchInput:
    options: dict[str, Any] = {"prefix": "in/", "output_bucket": out, "output_prefix": prefix, "chunk_records": 100}
    return S3BatchInput.model_validate({"bucket": src, **options, **kw})


def _parts(s3: Any, bucket: str, folder: str) -> list[tuple[str, bytes, Checkpoint]]:
    found = []
    for key in list_keys(s3, bucket, folder):
        if key.rsplit("/", 1)[-1].startswith("part-"):
            obj = s3.get_object(Bucket=bucket, Key=key)
            cp = Checkpoint.model_validate_json(obj["Metadata"][CHECKPOINT_METADATA])
            found.append((key, obj["Body"].read(), cp))
    return found


async def test_parquet_parts_read_back_as_the_records_with_deterministic_bytes(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, worker: Worker
) -> None:
    src, out = buckets
    s3.put_object(Bucket=src, Key="in/a.csv", Body=make_csv(250))
    spec = _job(src, out, "p1/", sink={"type": "s3", "format": "parquet"})
    assert (await execute(client, task_queue, spec)).status == "succeeded"
    parts = _parts(s3, out, "p1/in/a.csv/")
    assert [k.rsplit("/", 1)[-1] for k, _, _ in parts] == [f"part-{i:05d}.parquet" for i in range(3)]
    assert [cp.next_record for _, _, cp in parts] == [100, 200, 250] and parts[-1][2].done
    rows = [row for _, body, _ in parts for row in pq.read_table(io.BytesIO(body)).to_pylist()]
    assert rows == csv_rows(250)
    head = s3.head_object(Bucket=out, Key=parts[0][0])
    assert head["ContentType"] == "application/vnd.apache.parquet"
    # The same job again into another prefix: the same bytes.
    again = _job(src, out, "p2/", sink={"type": "s3", "format": "parquet"})
    assert (await execute(client, task_queue, again)).status == "succeeded"
    assert [b for _, b, _ in _parts(s3, out, "p2/in/a.csv/")] == [b for _, b, _ in parts]
    assert report(s3, out, "p2/")["files"][0]["records_written"] == 250


async def test_parquet_parts_with_typed_values_and_rejects(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, worker: Worker
) -> None:
    src, out = buckets
    lines = [
        {"id": 1, "price": 1.5, "tags": ["a"], "big": 123456789012345678901234567890},
        {"id": 2, "price": 2.25, "tags": [], "big": "x"},
    ]
    body = "\n".join(json.dumps(v) for v in lines) + "\nnot json\n"
    s3.put_object(Bucket=src, Key="in/t.jsonl", Body=body.encode())
    spec = _job(src, out, "t/", sink={"type": "s3", "format": "parquet"})
    assert (await execute(client, task_queue, spec)).status == "succeeded"
    [(_, data, cp)] = _parts(s3, out, "t/in/t.jsonl/")
    table = pq.read_table(io.BytesIO(data))
    assert str(table.schema.field("id").type) == "int64" and str(table.schema.field("price").type) == "double"
    # A column of mixed types (a big integer and a string) is kept as text, exactly.
    assert table.column("big").to_pylist() == ["123456789012345678901234567890", "x"]
    assert table.column("tags").to_pylist() == [["a"], []]
    assert cp.rejected == 1 and cp.records_written == 2
    assert any(k.endswith("rejects-00000.jsonl") for k in list_keys(s3, out, "t/in/t.jsonl/"))


async def test_default_and_explicit_s3_sink_write_the_same_jsonl_parts(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, worker: Worker
) -> None:
    src, out = buckets
    s3.put_object(Bucket=src, Key="in/a.csv", Body=make_csv(150))
    assert (await execute(client, task_queue, _job(src, out, "d/"))).status == "succeeded"
    assert (await execute(client, task_queue, _job(src, out, "e/", sink={"type": "s3"}))).status == "succeeded"
    default, explicit = _parts(s3, out, "d/in/a.csv/"), _parts(s3, out, "e/in/a.csv/")
    assert [k.rsplit("/", 1)[-1] for k, _, _ in default] == ["part-00000.jsonl", "part-00001.jsonl"]
    assert [(b, cp) for _, b, cp in default] == [(b, cp) for _, b, cp in explicit]  # same bytes, same fingerprint
    assert_exactly_once(s3, out, "d/in/a.csv/", 150)


def test_default_sink_keeps_the_fingerprint_and_inputs_of_earlier_releases() -> None:
    # The value earlier releases computed for these options (parts of running jobs are reused by it).
    shape = {"fmt": "csv", "compression": None, "handler": "passthrough", "chunk_records": 10_000}
    assert fingerprint(**shape, max_record_bytes=8_388_608) == "35a6c95f5813eaea"
    assert S3Sink().shape() is None
    assert fingerprint(**shape, max_record_bytes=8_388_608, sink=S3Sink(format="parquet").shape()) != "35a6c95f5813eaea"
    # No sink: left out of the job input and of the activity input as written (same payloads as before).
    job = S3BatchInput(bucket="src-x", output_bucket="out-x")
    assert "sink" not in job.model_dump_json()
    obj = ObjectRef(key="k", etag="e", size=1)
    req = ProcessFileInput(
        job_id="j", bucket="b", obj=obj, output_bucket="o", output_prefix="", format="auto", handler="h",
        chunk_records=1, max_record_bytes=1024,
    )
    assert "sink" not in req.model_dump_json()
    with_sink = req.model_copy(update={"sink": S3Sink(format="parquet")})
    assert ProcessFileInput.model_validate_json(with_sink.model_dump_json()).sink == S3Sink(format="parquet")


def test_the_destination_names_the_folder_and_the_parts_format() -> None:
    """What ``s3batch status`` and ``report`` print for where the records go (the table's: test_sink_postgres)."""
    assert destination(None, "out", "runs/1/") == "s3://out/runs/1/ (JSONL parts)"
    assert destination(S3Sink(), "out", "") == "s3://out/ (JSONL parts)"
    assert destination(S3Sink(format="parquet"), "out", "p/") == "s3://out/p/ (Parquet parts)"
    # ``s3batch report`` reads it from the report's input as given (JSON: a time as a string); a report whose
    # input does not parse here (written by a newer version) shows its output folder alone.
    parquet = {"type": "s3", "format": "parquet"}
    given = {"bucket": "src-x", "output_bucket": "out-x", "output_prefix": "p/", "sink": parquet}
    stamped = JobReport(files=[], output="s3://out-x/p/", input={**given, "modified_after": "2026-01-01T00:00:00Z"})
    assert report_destination(stamped) == "s3://out-x/p/ (Parquet parts)"
    newer = JobReport(files=[], output="s3://out-x/p/", input={**given, "a_field_of_a_newer_version": 1})
    assert report_destination(newer) == "s3://out-x/p/"

"""Crash and resume in the middle of the new inputs (issue 14): a real worker process SIGKILLed
mid-file, the file finished by another worker from its last committed part. A UTF-16 CSV with a
custom dialect and a JSON document resume by byte offset (a ranged GET at the next record's first
byte); a ``.csv.zst`` resumes by skipping the committed records. The output must be the source's
records exactly once, in order, equal to the reference reader's."""

from __future__ import annotations

import csv
import io
import json
import time
from pathlib import Path
from typing import Any

import pytest
import zstandard
from temporalio.client import Client

from s3batch.dev.workers import WorkerProcess
from s3batch.models import S3BatchInput
from tests.helpers import wait_for
from tests.helpers.jobs import start
from tests.helpers.output import committed_parts, read_jsonl, report
from tests.helpers.workers import worker_process

pytestmark = pytest.mark.slow

ROWS, CHUNK = 12_000, 500


def utf16_csv() -> tuple[bytes, dict[str, Any], list[Any]]:
    out = io.StringIO()
    writer = csv.writer(out, delimiter=";", quotechar="'", lineterminator="\r\n")
    writer.writerow(["id", "text"])
    writer.writerows([i, f"ü;{i}\n😀'q"] for i in range(ROWS))
    text = out.getvalue()
    expected = [{"id": str(i), "text": f"ü;{i}\n😀'q"} for i in range(ROWS)]
    return text.encode("utf-16"), {"encoding": "utf-16", "delimiter": ";", "quotechar": "'"}, expected


def json_document() -> tuple[bytes, dict[str, Any], list[Any]]:
    records = [{"id": i, "big": 10**25 + i, "tags": ["a]", {"b": "}"}]} for i in range(ROWS)]
    return json.dumps(records, indent=2).encode(), {}, records


def zstd_csv() -> tuple[bytes, dict[str, Any], list[Any]]:
    text = "id,name\n" + "".join(f'{i},"n, {i}"\n' for i in range(ROWS))
    expected = [{"id": str(i), "name": f"n, {i}"} for i in range(ROWS)]
    return zstandard.ZstdCompressor().compress(text.encode()), {}, expected


FILES = {"in/data.csv": utf16_csv, "in/data.json": json_document, "in/data.csv.zst": zstd_csv}


@pytest.mark.parametrize("key", sorted(FILES))
async def test_sigkill_mid_file_resumes_exactly_in_the_new_formats(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, tmp_path: Path, key: str
) -> None:
    src, out = buckets
    body, options, expected = FILES[key]()
    s3.put_object(Bucket=src, Key=key, Body=body)
    first = worker_process(task_queue, tmp_path, "a", S3BATCH_TEST_HANDLER_DELAY="0.15")
    second: WorkerProcess | None = None
    folder = f"o/{key}/"
    try:
        first.wait_ready()
        spec = S3BatchInput(
            bucket=src,
            output_bucket=out,
            output_prefix="o/",
            chunk_records=CHUNK,
            handler="slow_passthrough",
            heartbeat_timeout_seconds=5,
            **options,
        )
        handle = await start(client, task_queue, spec, "resume-new")
        await wait_for(lambda: len(committed_parts(s3, out, folder)) >= 3, 90, "3 committed parts", alive=[first])
        first.kill()
        at_kill = committed_parts(s3, out, folder)
        committed = at_kill[-1].next_record
        assert 0 < committed < ROWS, "the kill must land mid-file"
        if not key.endswith(".zst"):
            assert at_kill[-1].byte_offset is not None and 0 < at_kill[-1].byte_offset < len(body)
        second = worker_process(task_queue, tmp_path, "b", S3BATCH_TEST_HANDLER_DELAY="0")
        second.wait_ready()
        began = time.monotonic()
        result = await handle.result()
        assert result.status == "succeeded", result
        assert time.monotonic() - began < 90
    finally:
        first.stop()
        if second is not None:
            second.stop()
    entry = report(s3, out, "o/")["files"][0]
    assert entry["attempts"] >= 2
    # Resumed from a committed part (at or after the one seen at the kill), never from the start.
    assert entry["resumed_from_record"] >= committed
    assert entry["records"] == ROWS and entry["rejected"] == 0
    assert read_jsonl(s3, out, folder) == expected  # exactly once, in order, the reference's values
    parts = committed_parts(s3, out, folder)
    assert [p.next_record for p in parts] == list(range(CHUNK, ROWS + 1, CHUNK))

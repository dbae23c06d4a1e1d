"""Hostile input, end to end through a job: malformed records, odd keys and objects, a 50 MB line,
handlers that raise. Every bad record becomes a reject with its line number and reason; no record is
lost or doubled; no file or job fails that should not; output keys stay under ``output_prefix``."""

from __future__ import annotations

import asyncio
import re
import uuid
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError
from s3batch.workflows.batch import S3BatchWorkflow
from temporalio.client import Client, WorkflowFailureError
from temporalio.worker import Worker

import tests.fault_handlers  # noqa: F401 - registers the test handlers for the in-process worker
from s3batch import layout
from s3batch.dev.workers import memory_kib
from s3batch.models import S3BatchInput
from tests.helpers.assertions import assert_invalid_input
from tests.helpers.output import list_keys, read_jsonl, report
from tests.helpers.workers import worker_process

pytestmark = pytest.mark.slow


async def run(client: Client, task_queue: str, spec: S3BatchInput) -> dict[str, Any]:
    return await client.execute_workflow(
        "S3BatchWorkflow", spec, id=f"hostile-{uuid.uuid4().hex[:8]}", task_queue=task_queue, result_type=dict
    )


UNICODE_KEY = "h/dir with space/données é 日本 ü.csv"

# key -> (body, records in the file, expected rejects as (line, reason prefix))
HOSTILE: dict[str, tuple[bytes, int, list[tuple[int, str]]]] = {
    "h/wrong_width.csv": (
        b"id,name,note\n0,a,x\n1,b\n2,c,x,extra\n3,d,x\n",
        4,
        [(3, "expected 3 fields (as in the header), got 2"), (4, "expected 3 fields (as in the header), got 4")],
    ),
    "h/unterminated.csv": (
        b'id,name,note\n0,a,x\n1,b,"never closed\nand still open',
        2,
        [(3, "malformed CSV (unexpected end of data) in lines 3-4")],
    ),
    "h/bad_utf8.csv": (
        b"id,name,note\n0,a,x\n1,\xff\xfe,x\n2,c,x\n",
        3,
        [(3, "invalid UTF-8 at byte 2 of the line")],
    ),
    "h/nul.csv": (b"id,name,note\n0,a\x00b,x\n1,c,x\n", 2, []),
    "h/nul.jsonl": (
        b'{"id": 0}\n{"id": 1, "v": "a\x00b"}\n{"id": 2}\n',
        3,
        [(2, "invalid JSON: unexpected control character in string")],
    ),
    "h/bad.jsonl": (
        b'{"id": 0}\n{not json}\n\n{"id": 1}\n[1, 2\n{"id": 2}\n{"trunc": ',
        6,
        [(2, "invalid JSON"), (5, "invalid JSON"), (7, "invalid JSON: unexpected end of data")],
    ),
    "h/empty.csv": (b"", 0, []),
    "h/empty.jsonl": (b"", 0, []),
    "h/header_only.csv": (b"id,name,note\r\n", 0, []),
    UNICODE_KEY: ("id,name,note\n0,é,日本\n1,ü,x\n".encode(), 2, []),
}


async def test_hostile_records_and_keys_end_to_end(
    client: Client, worker: Worker, s3: Any, buckets: tuple[str, str], task_queue: str, reliability
) -> None:
    src, out = buckets
    for key, (body, _, _) in HOSTILE.items():
        s3.put_object(Bucket=src, Key=key, Body=body)
    s3.put_object(Bucket=src, Key="h/folder/", Body=b"")  # a "folder" marker: skipped
    s3.put_object(Bucket=src, Key="h/folder/inside.jsonl", Body=b'{"id": 0}\n')

    result = await run(
        client, task_queue, S3BatchInput(bucket=src, prefix="h/", output_bucket=out, output_prefix="run/")
    )
    assert result["status"] == "succeeded"
    totals = result["totals"]
    assert totals["files_listed"] == len(HOSTILE) + 1, "the folder marker is not a file"
    assert totals["files_failed"] == 0

    files = {f["key"]: f for f in report(s3, out, "run/")["files"]}
    assert "h/folder/" not in files
    records_in = records_out = 0
    for key, (_, count, rejects) in HOSTILE.items():
        entry = files[key]
        assert entry["status"] == "succeeded", key
        assert entry["records"] == count, key
        assert entry["rejected"] == len(rejects), key
        got = read_jsonl(s3, out, f"run/{key}/", "rejects")
        assert [r["line"] for r in got] == [line for line, _ in rejects], key
        for reject, (_, reason) in zip(got, rejects, strict=True):
            assert reject["reason"].startswith(reason), (key, reject)
        written = read_jsonl(s3, out, f"run/{key}/")
        assert len(written) == entry["records_written"] == count - len(rejects), key
        records_in += count
        records_out += len(written) + len(got)

    # Records survive byte for byte: a NUL inside a CSV field, and unicode in a unicode-named key.
    assert read_jsonl(s3, out, "run/h/nul.csv/")[0]["name"] == "a\x00b"
    assert read_jsonl(s3, out, f"run/{UNICODE_KEY}/")[1] == {"id": "1", "name": "ü", "note": "x"}
    assert [int(r["id"]) for r in read_jsonl(s3, out, "run/h/wrong_width.csv/")] == [0, 3]
    # An empty file, a header-only file: one empty final part, nothing else.
    assert [k for k in list_keys(s3, out) if k.startswith("run/h/empty.csv/")] == ["run/h/empty.csv/part-00000.jsonl"]
    assert all(k.startswith("run/") for k in list_keys(s3, out)), "an output key outside output_prefix"
    reliability(
        "Hostile records: wrong width, unterminated quote, invalid UTF-8, NUL, invalid JSON, empty and "
        "header-only files, unicode key, folder marker",
        records_in=records_in,
        records_out=records_out,
        duplicates=0,
        lost=records_in - records_out,
        reprocessed=0,
        recover_seconds=None,
        notes=f"{len(HOSTILE)} files, {totals['rejected']} rejects with line and reason; job succeeded",
    )


def test_key_with_dot_dot_segments_maps_to_an_output_key_without_them(s3: Any, buckets: tuple[str, str]) -> None:
    # SeaweedFS refuses such source keys (AWS S3 accepts them), so the mapping is checked directly;
    # the job below runs it on the keys this server accepts.
    with pytest.raises(ClientError):
        s3.put_object(Bucket=buckets[0], Key="h/../../escape.csv", Body=b"id\n1\n")
    key = "h/../../escape.csv"
    out = layout.part_key("run/", key, 0)
    assert out == "run/h/%2E%2E/%2E%2E/escape.csv/part-00000.jsonl"
    assert layout.decode_key(out.removeprefix("run/").removesuffix("/part-00000.jsonl")) == key
    assert layout.file_dir("run/", "a/./b.csv") == "run/a/%2E/b.csv/"


# Source keys this server accepts whose output keys need the encoding (a control character, an
# escape-like "%"), and one that does not ("%" alone).
ENCODED_KEYS = {
    "h/ctl\x01name.csv": "run/h/ctl%01name.csv/",
    "h/tab\tname.csv": "run/h/tab%09name.csv/",
    "h/url%41.csv": "run/h/url%2541.csv/",
    "h/100%.csv": "run/h/100%.csv/",
}


async def test_keys_needing_encoding_end_to_end(
    client: Client, worker: Worker, s3: Any, buckets: tuple[str, str], task_queue: str
) -> None:
    src, out = buckets
    for i, key in enumerate(ENCODED_KEYS):
        s3.put_object(Bucket=src, Key=key, Body=f"id,name\n{i},x\n".encode())
    result = await run(
        client, task_queue, S3BatchInput(bucket=src, prefix="h/", output_bucket=out, output_prefix="run/")
    )
    assert result["status"] == "succeeded"
    files = {f["key"]: f for f in report(s3, out, "run/")["files"]}
    assert sorted(files) == sorted(ENCODED_KEYS), "the report names the source keys, not the encoded ones"
    written = [k for k in list_keys(s3, out) if k.endswith(".jsonl") and "/_s3batch/" not in k]
    assert sorted(written) == sorted(d + "part-00000.jsonl" for d in ENCODED_KEYS.values())
    for i, (key, folder) in enumerate(ENCODED_KEYS.items()):
        assert files[key]["status"] == "succeeded"
        assert read_jsonl(s3, out, folder) == [{"id": str(i), "name": "x"}]
        assert layout.decode_key(folder.removeprefix("run/").removesuffix("/")) == key
    assert not any(re.search(r"[\x00-\x1f\x7f]", k) for k in list_keys(s3, out)), "a control character in an output key"


async def test_output_prefix_with_dot_dot_segments_is_refused(
    client: Client, worker: Worker, buckets: tuple[str, str], task_queue: str
) -> None:
    src, out = buckets
    handle = await client.start_workflow(
        "S3BatchWorkflow",
        {"bucket": src, "output_bucket": out, "output_prefix": "runs/../../elsewhere/"},
        id=f"dotdot-{uuid.uuid4().hex[:8]}",
        task_queue=task_queue,
    )
    try:
        await assert_invalid_input(client, handle.id, ["output_prefix"], timeout=5)
    finally:
        desc = await handle.describe()
        if desc.status == 1:  # RUNNING
            await handle.terminate("test cleanup")


# ------------------------------------------------------------------------------------ a 50 MB line


async def test_50_mb_single_line_is_a_reject_and_memory_stays_bounded(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, tmp_path: Path, reliability
) -> None:
    src, out = buckets
    size = 50 * 1024 * 1024
    limit = 1024 * 1024
    blob = b"x" * size
    s3.put_object(Bucket=src, Key="long.jsonl", Body=b'{"id": 0}\n{"blob": "' + blob + b'"}\n{"id": 2}\n')
    # In CSV, inside a quoted field holding commas and a newline: the next rows must still parse.
    s3.put_object(
        Bucket=src,
        Key="long.csv",
        Body=b'id,note\n0,a\n1,"' + blob[: size // 2] + b",\n" + blob[: size // 2] + b'"\n2,c\n',
    )
    del blob
    proc = worker_process(task_queue, tmp_path, "mem")
    try:
        proc.wait_ready()
        # A small file first: what any first file costs once (the S3 clients' set-up, obstore's runtime,
        # about 15 MiB) is not the long lines' memory.
        s3.put_object(Bucket=src, Key="warm/a.csv", Body=b"id\n1\n")
        await client.execute_workflow(
            S3BatchWorkflow.run,
            S3BatchInput(bucket=src, prefix="warm/", output_bucket=out, output_prefix="warm/"),
            id=f"warm-{uuid.uuid4().hex[:8]}",
            task_queue=task_queue,
        )
        before = memory_kib(proc.proc.pid)
        result = await client.execute_workflow(
            S3BatchWorkflow.run,
            S3BatchInput(
                bucket=src, exclude=["warm/*"], output_bucket=out, output_prefix="o/", max_record_bytes=limit
            ),
            id=f"longline-{uuid.uuid4().hex[:8]}",
            task_queue=task_queue,
        )
        after = memory_kib(proc.proc.pid)
    finally:
        proc.stop()
    assert result.status == "succeeded"
    assert result.totals.rejected == 2
    rejects = read_jsonl(s3, out, "o/long.jsonl/", "rejects")
    assert [(r["line"], r["reason"]) for r in rejects] == [(2, f"line is longer than max_record_bytes ({limit} bytes)")]
    assert [r["id"] for r in read_jsonl(s3, out, "o/long.jsonl/")] == [0, 2]
    csv_rejects = read_jsonl(s3, out, "o/long.csv/", "rejects")
    assert [r["line"] for r in csv_rejects] == [3]
    assert [r["id"] for r in read_jsonl(s3, out, "o/long.csv/")] == ["0", "2"]
    growth_mib = (after["VmHWM"] - before["VmHWM"]) / 1024
    reliability(
        "A 50 MB single line (max_record_bytes 1 MiB), JSONL and inside a quoted CSV field",
        records_in=6,
        records_out=6,
        duplicates=0,
        lost=0,
        reprocessed=0,
        recover_seconds=None,
        notes=f"2 rejects; worker peak RSS {before['VmHWM'] // 1024} -> {after['VmHWM'] // 1024} MiB "
        f"(+{growth_mib:.0f} MiB for two 50 MB lines)",
    )
    assert growth_mib < 25, f"peak RSS of the worker grew by {growth_mib:.0f} MiB"


# ------------------------------------------------------------------------------------ handlers that raise


async def test_poison_records_become_rejects_with_the_error(
    client: Client, worker: Worker, s3: Any, buckets: tuple[str, str], task_queue: str, reliability
) -> None:
    src, out = buckets
    rows = 3_000
    poisoned = set(range(7, rows, 250))
    lines = ["id,note"] + [f"{i},{'POISON' if i in poisoned else 'fine'}" for i in range(rows)]
    s3.put_object(Bucket=src, Key="p.csv", Body=("\n".join(lines) + "\n").encode())
    result = await run(
        client, task_queue, S3BatchInput(bucket=src, output_bucket=out, handler="poison_some", chunk_records=1_000)
    )
    assert result["status"] == "succeeded"
    rejects = read_jsonl(s3, out, "p.csv/", "rejects")
    assert [r["line"] for r in rejects] == [i + 2 for i in sorted(poisoned)]
    assert all(r["reason"] == f"ValueError: poison record {r['record']['id']}" for r in rejects)
    written = [int(r["id"]) for r in read_jsonl(s3, out, "p.csv/")]
    assert written == [i for i in range(rows) if i not in poisoned]
    reliability(
        "Handler raising on some records (poison records)",
        records_in=rows,
        records_out=len(written) + len(rejects),
        duplicates=0,
        lost=rows - len(written) - len(rejects),
        reprocessed=0,
        recover_seconds=None,
        notes=f"{len(rejects)} poison records became rejects carrying the error; the file succeeded",
    )


async def test_handler_raising_on_everything_fails_the_file_not_the_job(
    client: Client, worker: Worker, s3: Any, buckets: tuple[str, str], task_queue: str, reliability
) -> None:
    src, out = buckets
    s3.put_object(Bucket=src, Key="good.jsonl", Body=b"".join(b'{"id": %d}\n' % i for i in range(100)))
    s3.put_object(Bucket=src, Key="boom.jsonl", Body=b"".join(b'{"id": %d, "v": "BOOM"}\n' % i for i in range(100)))

    def spec(prefix: str, max_failed: int) -> S3BatchInput:
        return S3BatchInput(
            bucket=src,
            output_bucket=out,
            output_prefix=prefix,
            handler="explode_on_marker",
            max_attempts=2,
            max_failed_files=max_failed,
        )

    tolerant, strict = await asyncio.gather(
        run(client, task_queue, spec("tolerant/", 1)),
        run(client, task_queue, spec("strict/", 0)),
        return_exceptions=True,
    )
    assert isinstance(tolerant, dict) and tolerant["status"] == "succeeded", tolerant
    assert tolerant["totals"]["files_failed"] == 1 and tolerant["totals"]["records_written"] == 100
    assert isinstance(strict, WorkflowFailureError), strict
    assert strict.cause.type == "JobFailed"
    assert "1 of 2 files failed (max_failed_files=0)" in strict.cause.message
    for prefix in ("tolerant/", "strict/"):
        files = {f["key"]: f for f in report(s3, out, prefix)["files"]}
        assert files["good.jsonl"]["status"] == "succeeded"
        boom = files["boom.jsonl"]
        assert boom["status"] == "failed"
        assert boom["attempts"] == 2
        assert boom["error"].startswith("HandlerError: handler 'explode_on_marker' raised RuntimeError on s3://")
        assert not read_jsonl(s3, out, f"{prefix}boom.jsonl/"), "a failed file left committed records"
    reliability(
        "Handler raising on every record of a file",
        records_in=200,
        records_out=100,
        duplicates=0,
        lost=0,
        reprocessed=None,
        recover_seconds=None,
        notes="the failing file is reported failed after max_attempts=2 (HandlerError), none of its records "
        "written; the job succeeds with max_failed_files=1, fails (JobFailed) with 0; the other file is processed",
    )

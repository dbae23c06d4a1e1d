"""The per-file activity, run through ``ActivityEnvironment`` against the real SeaweedFS S3 server.

Retries are simulated the way the worker delivers them: a fresh ``activity.info()`` with
``attempt`` > 1 and the last heartbeat details as plain JSON. A crash is simulated by raising from
``on_heartbeat``, i.e. right after the activity heartbeated a checkpoint.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from s3batch.activities import file_setup, files
from s3batch.activities.s3_activities import S3Activities
from temporalio.activity import ActivityCancellationDetails
from temporalio.exceptions import ApplicationError, CancelledError
from temporalio.testing import ActivityEnvironment

from s3batch import checkpoint, file_output, layout
from s3batch.checkpoint import CHECKPOINT_METADATA, Checkpoint
from s3batch.formats.common import Record
from s3batch.handlers import HandlerResult, record_handler, register
from s3batch.messages import FileResult, ListObjectsInput, ObjectRef, ProcessFileInput, ProcessGroupInput
from s3batch.objects import data_stores
from s3batch.s3io import make_client

OUT_PREFIX = "out/"


@pytest.fixture(autouse=True)
def parts_written_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    """These files are small: write their parts one chunk behind anyway (as a big file's are), so the
    crash, cancel and resume tests here cover activities/write_behind.py."""
    monkeypatch.setattr(file_setup, "BEHIND_MIN_BYTES", 0)


class Crash(Exception):
    """Stands for the worker dying right after a heartbeat."""


# ------------------------------------------------------------------------------------------ helpers


def upload(s3: Any, bucket: str, key: str, body: bytes) -> ObjectRef:
    """Put an object and return it as the listing would: ETag without quotes."""
    s3.put_object(Bucket=bucket, Key=key, Body=body)
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=key)["Contents"]
    item = next(o for o in listed if o["Key"] == key)
    assert item["Size"] == len(body)
    return ObjectRef(key=key, etag=item["ETag"].strip('"'), size=item["Size"])


def file_input(
    buckets: tuple[str, str],
    obj: ObjectRef,
    *,
    handler: str = "passthrough",
    chunk_records: int = 500,
    fmt: str = "auto",
    max_record_bytes: int = 1024 * 1024,
) -> ProcessFileInput:
    src, out = buckets
    return ProcessFileInput(
        job_id="job-test",
        bucket=src,
        obj=obj,
        output_bucket=out,
        output_prefix=OUT_PREFIX,
        format=fmt,  # type: ignore[arg-type]
        handler=handler,
        chunk_records=chunk_records,
        max_record_bytes=max_record_bytes,
    )


class Attempt:
    """One attempt of ``process_file`` in an ``ActivityEnvironment``, recording its heartbeats."""

    def __init__(
        self,
        s3: Any,
        *,
        attempt: int = 1,
        details: Sequence[Any] = (),
        crash_at_chunk: int | None = None,
        check: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.s3 = s3
        self.heartbeats: list[dict[str, Any]] = []
        self.env = ActivityEnvironment()
        self.env.info = dataclasses.replace(self.env.info, attempt=attempt, heartbeat_details=list(details))
        self.crash_at_chunk = crash_at_chunk
        self.check = check
        self.env.on_heartbeat = self._on_heartbeat

    def _on_heartbeat(self, *details: Any) -> None:
        assert len(details) == 1 and isinstance(details[0], Checkpoint)
        # What the server would hand back to the next attempt: plain JSON.
        cp = json.loads(details[0].model_dump_json())
        self.heartbeats.append(cp)
        if self.check is not None:
            self.check(cp)
        if self.crash_at_chunk is not None and cp["chunk"] == self.crash_at_chunk:
            raise Crash(f"worker killed after heartbeating chunk {cp['chunk']}")

    def run(self, req: ProcessFileInput) -> FileResult:
        return self.env.run(S3Activities(self.s3).process_file, req)

    def crash(self, req: ProcessFileInput) -> None:
        with pytest.raises(ApplicationError) as info:
            self.run(req)
        assert info.value.type == "Crash", info.value


def output_keys(s3: Any, out: str, key: str) -> list[str]:
    prefix = layout.file_dir(OUT_PREFIX, key)
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=out, Prefix=prefix)
    return sorted(o["Key"][len(prefix) :] for page in pages for o in page.get("Contents", []))


def read_lines(s3: Any, out: str, key: str) -> list[Any]:
    body = s3.get_object(Bucket=out, Key=key)["Body"].read()
    return [json.loads(line) for line in body.splitlines() if line]


def part_rows(s3: Any, out: str, key: str) -> list[Any]:
    rows: list[Any] = []
    for name in output_keys(s3, out, key):
        if name.startswith("part-"):
            rows.extend(read_lines(s3, out, layout.file_dir(OUT_PREFIX, key) + name))
    return rows


def stored_checkpoint(s3: Any, out: str, key: str, chunk: int) -> dict[str, Any] | None:
    try:
        head = s3.head_object(Bucket=out, Key=layout.part_key(OUT_PREFIX, key, chunk))
    except s3.exceptions.ClientError as err:
        if err.response["Error"]["Code"] in {"404", "NoSuchKey", "NotFound"}:
            return None
        raise
    return json.loads(head["Metadata"][CHECKPOINT_METADATA])


class Counting:
    """A passthrough handler that records the line of every record it is given."""

    def __init__(self) -> None:
        self.name = f"counting-{uuid.uuid4().hex[:8]}"
        self.lines: list[int] = []
        register(self.name, self, replace=True)

    def __call__(self, records: Sequence[Record]) -> HandlerResult:
        self.lines.extend(r.line for r in records)
        return HandlerResult([r.value for r in records], [])


def make_csv(n: int) -> tuple[bytes, list[dict[str, str]], list[tuple[int, int]]]:
    """A CSV with quoted commas and newlines, CRLF and multi-byte text; its rows; and the
    ``(byte offset, line)`` where each record starts (plus the end)."""
    head = b"id,name,note\r\n"
    body = bytearray(head)
    rows: list[dict[str, str]] = []
    starts: list[tuple[int, int]] = []
    line = 2
    for i in range(n):
        starts.append((len(body), line))
        note = f"note {i}, with comma" if i % 3 else f"multi\nline {i} é€😀"
        row = f'{i},名前 {i},"{note}"\r\n'.encode()
        body += row
        line += row.count(b"\n")
        rows.append({"id": str(i), "name": f"名前 {i}", "note": note})
    starts.append((len(body), line))
    return bytes(body), rows, starts


def make_jsonl(n: int) -> tuple[bytes, list[dict[str, Any]]]:
    rows = [{"n": i, "s": f"é{i}😀"} for i in range(n)]
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode(), rows


# --------------------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("n", [2345, 2000])
def test_multi_chunk_csv_writes_each_record_once_with_checkpoints(s3: Any, buckets: tuple[str, str], n: int) -> None:
    src, out = buckets
    data, rows, starts = make_csv(n)
    obj = upload(s3, src, "in/data.csv", data)
    req = file_input(buckets, obj, chunk_records=500)
    fingerprint = checkpoint.fingerprint(
        fmt="csv", compression=None, handler="passthrough", chunk_records=500, max_record_bytes=1024 * 1024
    )
    checked: list[int] = []

    def part_exists_before_heartbeat(cp: dict[str, Any]) -> None:
        # Write-then-checkpoint: part chunk-1 already holds exactly this checkpoint, part chunk does
        # not exist yet.
        if cp["chunk"] > 0:
            assert stored_checkpoint(s3, out, obj.key, cp["chunk"] - 1) == cp
            checked.append(cp["chunk"])
        assert stored_checkpoint(s3, out, obj.key, cp["chunk"]) is None

    attempt = Attempt(s3, check=part_exists_before_heartbeat)
    result = attempt.run(req)

    chunks = -(-n // 500)
    assert output_keys(s3, out, obj.key) == [f"part-{i:05d}.jsonl" for i in range(chunks)]
    assert part_rows(s3, out, obj.key) == rows
    for i in range(chunks):
        assert len(read_lines(s3, out, layout.part_key(OUT_PREFIX, obj.key, i))) == min(500, n - 500 * i)
        next_record = min(500 * (i + 1), n)
        offset, line = starts[next_record]
        assert stored_checkpoint(s3, out, obj.key, i) == {
            "next_record": next_record,
            "byte_offset": offset,
            "line": line,
            "chunk": i + 1,
            "etag": obj.etag,
            "version_id": None,
            "fingerprint": fingerprint,
            "records_written": next_record,
            "rejected": 0,
            "dropped": 0,
            "done": i == chunks - 1,
        }
    assert sorted(set(checked)) == list(range(1, chunks + 1))
    assert attempt.heartbeats[-1] == stored_checkpoint(s3, out, obj.key, chunks - 1)
    assert result == FileResult(
        key=obj.key,
        etag=obj.etag,
        status="succeeded",
        records=n,
        records_written=n,
        rejected=0,
        bytes_read=len(data),
        chunks=chunks,
        attempts=1,
        resumed_from_record=0,
    )


def test_resume_from_heartbeat_skips_written_chunks(s3: Any, buckets: tuple[str, str]) -> None:
    src, out = buckets
    data, rows, starts = make_csv(2345)
    obj = upload(s3, src, "in/data.csv", data)
    counter = Counting()
    req = file_input(buckets, obj, handler=counter.name, chunk_records=400)

    first = Attempt(s3, crash_at_chunk=3)
    first.crash(req)
    # Parts are written one chunk behind (activities/write_behind.py): part 2's checkpoint is heartbeated
    # once chunk 3 is built, so the handler had seen chunk 3 when the worker died after that heartbeat.
    assert counter.lines == [line for _, line in starts[:1600]]
    assert output_keys(s3, out, obj.key) == ["part-00000.jsonl", "part-00001.jsonl", "part-00002.jsonl"]
    last = first.heartbeats[-1]
    assert (last["chunk"], last["next_record"], last["byte_offset"], last["line"]) == (3, 1200, *starts[1200])

    counter.lines.clear()
    result = Attempt(s3, attempt=2, details=[last]).run(req)
    assert counter.lines == [line for _, line in starts[1200:-1]]  # nothing processed twice
    assert part_rows(s3, out, obj.key) == rows
    assert (result.attempts, result.resumed_from_record, result.records, result.chunks) == (2, 1200, 2345, 6)


@pytest.mark.parametrize("heartbeat", ["none", "stale"])
def test_resume_after_lost_heartbeats_continues_after_last_committed_part(
    s3: Any, buckets: tuple[str, str], heartbeat: str
) -> None:
    # Heartbeats are throttled: the server may hold an older checkpoint than the parts written.
    src, out = buckets
    data, rows = make_jsonl(1700)
    obj = upload(s3, src, "in/events.jsonl", data)
    counter = Counting()
    req = file_input(buckets, obj, handler=counter.name, chunk_records=300)
    first = Attempt(s3, crash_at_chunk=4)
    first.crash(req)
    assert len(counter.lines) == 1500  # chunk 4 was built when part 3's checkpoint was heartbeated (write-behind)
    stale = [cp for cp in first.heartbeats if cp["chunk"] == 1][-1]
    details = [] if heartbeat == "none" else [stale]

    counter.lines.clear()
    result = Attempt(s3, attempt=2, details=details).run(req)
    assert counter.lines == list(range(1201, 1701))
    assert part_rows(s3, out, obj.key) == rows
    assert output_keys(s3, out, obj.key) == [f"part-{i:05d}.jsonl" for i in range(6)]
    assert (result.resumed_from_record, result.records_written, result.chunks) == (1200, 1700, 6)


def test_parts_of_another_source_version_are_removed(s3: Any, buckets: tuple[str, str]) -> None:
    src, out = buckets
    old, _ = make_jsonl(1000)
    old += b"{broken\n"  # leaves a rejects object too
    old_obj = upload(s3, src, "in/e.jsonl", old)
    Attempt(s3).run(file_input(buckets, old_obj, chunk_records=200))
    assert output_keys(s3, out, "in/e.jsonl") == [f"part-{i:05d}.jsonl" for i in range(6)] + ["rejects-00005.jsonl"]

    new = "".join(json.dumps({"v": 2, "n": i}) + "\n" for i in range(300)).encode()
    new_obj = upload(s3, src, "in/e.jsonl", new)
    assert new_obj.etag != old_obj.etag
    counter = Counting()
    req = file_input(buckets, new_obj, handler=counter.name, chunk_records=200)
    result = Attempt(s3).run(req)
    assert output_keys(s3, out, "in/e.jsonl") == ["part-00000.jsonl", "part-00001.jsonl"]
    assert part_rows(s3, out, "in/e.jsonl") == [{"v": 2, "n": i} for i in range(300)]
    assert len(counter.lines) == 300
    assert (result.records, result.rejected, result.resumed_from_record) == (300, 0, 0)


def test_parts_written_under_other_options_are_not_reused(s3: Any, buckets: tuple[str, str]) -> None:
    src, out = buckets
    data, rows = make_jsonl(1000)
    obj = upload(s3, src, "in/e.jsonl", data)
    first = Attempt(s3)
    first.run(file_input(buckets, obj, chunk_records=150))
    assert len(output_keys(s3, out, obj.key)) == 7

    # Same file, another chunk size: another fingerprint. Its heartbeat and its parts are ignored.
    counter = Counting()
    req = file_input(buckets, obj, handler=counter.name, chunk_records=400)
    result = Attempt(s3, attempt=2, details=[first.heartbeats[-1]]).run(req)
    assert len(counter.lines) == 1000
    assert output_keys(s3, out, obj.key) == ["part-00000.jsonl", "part-00001.jsonl", "part-00002.jsonl"]
    assert part_rows(s3, out, obj.key) == rows
    assert (result.resumed_from_record, result.chunks) == (0, 3)
    assert stored_checkpoint(s3, out, obj.key, 2)["fingerprint"] == checkpoint.fingerprint(  # type: ignore[index]
        fmt="jsonl", compression=None, handler=counter.name, chunk_records=400, max_record_bytes=1024 * 1024
    )


def test_gzip_file_resumes_by_skipping_records(s3: Any, buckets: tuple[str, str]) -> None:
    src, out = buckets
    data, rows = make_jsonl(1500)
    obj = upload(s3, src, "in/events.jsonl.gz", gzip.compress(data))
    counter = Counting()
    req = file_input(buckets, obj, handler=counter.name, chunk_records=400)
    first = Attempt(s3, crash_at_chunk=2)
    first.crash(req)
    last = first.heartbeats[-1]
    assert (last["next_record"], last["byte_offset"], last["line"]) == (800, None, 801)

    counter.lines.clear()
    result = Attempt(s3, attempt=2, details=[last]).run(req)
    assert counter.lines == list(range(801, 1501))
    assert part_rows(s3, out, obj.key) == rows
    assert stored_checkpoint(s3, out, obj.key, 3) == {
        **last,
        "next_record": 1500,
        "line": 1501,
        "chunk": 4,
        "records_written": 1500,
        "done": True,
    }
    assert (result.resumed_from_record, result.records, result.bytes_read) == (800, 1500, obj.size)


@pytest.mark.parametrize("resumed", [False, True])
def test_object_overwritten_after_listing_fails_as_source_changed(
    s3: Any, buckets: tuple[str, str], resumed: bool
) -> None:
    src, out = buckets
    data, _ = make_jsonl(1000)
    obj = upload(s3, src, "in/e.jsonl", data)
    req = file_input(buckets, obj, chunk_records=300)
    details: list[Any] = []
    if resumed:
        first = Attempt(s3, crash_at_chunk=1)
        first.crash(req)
        details = [first.heartbeats[-1]]
    upload(s3, src, "in/e.jsonl", data.replace(b'"n"', b'"m"'))

    with pytest.raises(ApplicationError) as info:
        Attempt(s3, attempt=2, details=details).run(req)
    err = info.value
    assert (err.type, err.non_retryable) == ("SourceChanged", True)
    assert f"s3://{src}/in/e.jsonl changed since it was listed" in err.message
    assert err.details == ({"attempt": 2},)
    assert output_keys(s3, out, obj.key) == (["part-00000.jsonl"] if resumed else [])


def test_missing_object_fails_as_not_found(s3: Any, buckets: tuple[str, str]) -> None:
    src, _ = buckets
    obj = ObjectRef(key="in/gone.csv", etag="0123456789abcdef0123456789abcdef", size=10)
    with pytest.raises(ApplicationError) as info:
        Attempt(s3).run(file_input(buckets, obj))
    assert (info.value.type, info.value.non_retryable) == ("NotFound", True)
    assert f"s3://{src}/in/gone.csv" in info.value.message
    assert info.value.details == ({"attempt": 1},)


def test_unknown_handler_fails_as_unknown_handler(s3: Any, buckets: tuple[str, str]) -> None:
    src, out = buckets
    obj = upload(s3, src, "in/a.csv", b"a\n1\n")
    with pytest.raises(ApplicationError) as info:
        Attempt(s3).run(file_input(buckets, obj, handler="no-such-handler"))
    assert (info.value.type, info.value.non_retryable) == ("UnknownHandler", True)
    assert "no handler named 'no-such-handler'" in info.value.message
    assert output_keys(s3, out, obj.key) == []


def test_rerun_of_a_completed_file_returns_from_the_final_part(s3: Any, buckets: tuple[str, str]) -> None:
    src, out = buckets
    data, _, _ = make_csv(1100)
    obj = upload(s3, src, "in/data.csv", data)
    counter = Counting()
    req = file_input(buckets, obj, handler=counter.name, chunk_records=500)
    first = Attempt(s3)
    done = first.run(req)
    assert len(counter.lines) == 1100
    modified = {
        k: s3.head_object(Bucket=out, Key=layout.file_dir(OUT_PREFIX, obj.key) + k)["ETag"]
        for k in output_keys(s3, out, obj.key)
    }

    for details in ([], [first.heartbeats[-1]]):
        counter.lines.clear()
        rerun = Attempt(s3, attempt=2, details=details)
        result = rerun.run(req)
        assert counter.lines == []
        assert rerun.heartbeats == []
        assert result.model_copy(update={"attempts": 1, "resumed_from_record": 0}) == done
        assert result.resumed_from_record == 1100
        assert {
            k: s3.head_object(Bucket=out, Key=layout.file_dir(OUT_PREFIX, obj.key) + k)["ETag"]
            for k in output_keys(s3, out, obj.key)
        } == modified


def test_customers_handler_writes_rejects_with_line_numbers(s3: Any, buckets: tuple[str, str]) -> None:
    src, out = buckets
    lines = [
        "customer_id,email,name,country,amount,created_at",
        "1,a@example.com,Ann,FR,10.50,2024-01-02T03:04:05Z",  # line 2
        '2,b@example.com,"Bob\nSmith",DE,0,2024-01-02T03:04:05Z',  # lines 3-4
        "3,not-an-email,Cid,FR,1,2024-01-02T03:04:05Z",  # line 5: reject
        "4,d@example.com,Dee,fr,1,2024-01-02T03:04:05Z",  # line 6: reject (country)
        "5,e@example.com,Eve,US,-1,2024-01-02T03:04:05Z",  # line 7: reject (amount), chunk 1
        "6,f@example.com,Fay,US",  # line 8: reject (fields)
        "7,g@example.com,Gus,GB,7.25,2024-05-06T07:08:09+00:00",  # line 9
    ]
    obj = upload(s3, src, "in/customers.csv", ("\r\n".join(lines) + "\r\n").encode())
    result = Attempt(s3).run(file_input(buckets, obj, handler="customers", chunk_records=4))

    assert output_keys(s3, out, obj.key) == [
        "part-00000.jsonl",
        "part-00001.jsonl",
        "rejects-00000.jsonl",
        "rejects-00001.jsonl",
    ]
    written = part_rows(s3, out, obj.key)
    assert [(r["customer_id"], r["name"], r["amount"]) for r in written] == [
        (1, "Ann", "10.50"),
        (2, "Bob\nSmith", "0"),
        (7, "Gus", "7.25"),
    ]
    first_chunk = read_lines(s3, out, layout.rejects_key(OUT_PREFIX, obj.key, 0))
    second_chunk = read_lines(s3, out, layout.rejects_key(OUT_PREFIX, obj.key, 1))
    assert [r["line"] for r in first_chunk] == [5, 6]
    # Parser rejects (line 8) and the handler's (line 7) of one chunk are written in line order.
    assert [r["line"] for r in second_chunk] == [7, 8]
    rejects = first_chunk + second_chunk
    assert rejects[0]["reason"].startswith("email: ") and rejects[0]["record"]["customer_id"] == "3"
    assert rejects[1]["reason"].startswith("country: ")
    assert rejects[2]["reason"].startswith("amount: ")
    assert rejects[3] == {"line": 8, "reason": "expected 6 fields (as in the header), got 4", "record": None}
    assert (result.records, result.records_written, result.rejected, result.chunks) == (7, 3, 4, 2)
    assert stored_checkpoint(s3, out, obj.key, 0)["rejected"] == 2  # type: ignore[index]


MIB = 1024 * 1024


def make_big_csv() -> tuple[bytes, list[str]]:
    """A CSV just over 16 MiB of multi-byte text, where a 4-byte character straddles byte 1 MiB
    (the read buffer) and byte 16 MiB (the ranged-GET window)."""
    body = bytearray(b"id,text\n")
    texts: list[str] = []

    def add(text: str) -> None:
        texts.append(text)
        body.extend(f'{len(texts) - 1},"{text}"\n'.encode())

    for boundary in (MIB, 16 * MIB):
        while len(body) < boundary - 5000:
            add("é€😀漢\n字" * 200)
        prefix = f'{len(texts)},"'.encode()
        add("a" * (boundary - 2 - len(body) - len(prefix)) + "😀" + "b")  # "😀" starts 2 bytes before
        assert body[boundary] & 0xC0 == 0x80 and body[boundary - 2 : boundary + 2] == "😀".encode()
    add("end 😀")
    return bytes(body), texts


def test_multibyte_utf8_straddling_read_windows_and_resume_points(s3: Any, buckets: tuple[str, str]) -> None:
    # The object is read in 16 MiB ranged GETs through a 1 MiB buffer, and resumed mid-file.
    src, out = buckets
    data, texts = make_big_csv()
    obj = upload(s3, src, "in/big.csv", data)
    req = file_input(buckets, obj, chunk_records=1000)

    first = Attempt(s3, crash_at_chunk=2)
    first.crash(req)
    last = first.heartbeats[-1]
    assert 0 < last["byte_offset"] < 16 * MIB
    result = Attempt(s3, attempt=2, details=[last]).run(req)

    rows = part_rows(s3, out, obj.key)
    assert [r["id"] for r in rows] == [str(i) for i in range(len(texts))]
    assert [r["text"] for r in rows] == texts
    assert (result.records_written, result.resumed_from_record) == (len(texts), 2000)


def test_object_overwritten_while_being_read_fails_at_the_next_window(s3: Any, buckets: tuple[str, str]) -> None:
    # An open GET keeps streaming the old bytes; the next 16 MiB window is pinned to the listed ETag.
    src, out = buckets
    data, texts = make_big_csv()
    obj = upload(s3, src, "in/big.csv", data)
    overwritten: list[bool] = []

    def overwrite_after_first_part(cp: dict[str, Any]) -> None:
        if cp["chunk"] == 1 and not overwritten:
            s3.put_object(Bucket=src, Key=obj.key, Body=b"id,text\n1,new\n")
            overwritten.append(True)

    with pytest.raises(ApplicationError) as info:
        Attempt(s3, check=overwrite_after_first_part).run(file_input(buckets, obj, chunk_records=1000))
    assert (info.value.type, info.value.non_retryable) == ("SourceChanged", True)
    assert overwritten == [True]
    # The parts committed before the failure hold the old version's records, and stop before the
    # window that noticed the change.
    chunks = -(-len(texts) // 1000)
    committed = output_keys(s3, out, obj.key)
    assert committed == [f"part-{i:05d}.jsonl" for i in range(len(committed))]
    assert 1 <= len(committed) < chunks
    last = stored_checkpoint(s3, out, obj.key, len(committed) - 1)
    assert last is not None and last["byte_offset"] < 16 * MIB and not last["done"]
    assert [r["text"] for r in part_rows(s3, out, obj.key)] == texts[: 1000 * len(committed)]


@pytest.mark.parametrize(("body", "header_only"), [(b"", False), (b"id,name\r\n", True)])
def test_empty_and_header_only_files_commit_one_empty_final_part(
    s3: Any, buckets: tuple[str, str], body: bytes, header_only: bool
) -> None:
    src, out = buckets
    obj = upload(s3, src, "in/empty.csv", body)
    result = Attempt(s3).run(file_input(buckets, obj))
    assert output_keys(s3, out, obj.key) == ["part-00000.jsonl"]
    assert read_lines(s3, out, layout.part_key(OUT_PREFIX, obj.key, 0)) == []
    cp = stored_checkpoint(s3, out, obj.key, 0)
    assert cp is not None and (cp["done"], cp["next_record"], cp["chunk"]) == (True, 0, 1)
    assert (result.records, result.chunks) == (0, 1)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b'"id"x,name\n1,2\n', "the header row (line 1) is not valid CSV"),
        (b"id,n\xffame\n1,2\n", "the header row (line 1) cannot be read: invalid UTF-8"),
    ],
)
def test_unreadable_csv_header_fails_as_bad_file(s3: Any, buckets: tuple[str, str], body: bytes, reason: str) -> None:
    src, out = buckets
    obj = upload(s3, src, "in/bad.csv", body)
    with pytest.raises(ApplicationError) as info:
        Attempt(s3).run(file_input(buckets, obj))
    assert (info.value.type, info.value.non_retryable) == ("BadFile", True)
    assert info.value.message.startswith(f"s3://{src}/in/bad.csv: {reason}")
    assert output_keys(s3, out, obj.key) == []


def test_rejects_left_without_their_part_by_another_version_are_removed(s3: Any, buckets: tuple[str, str]) -> None:
    # A crashed attempt on an older version of the object wrote rejects-00000 (written before its
    # part) and died before part-00000.
    src, out = buckets
    stale = {"line": 1, "reason": "from the old version", "record": None}
    s3.put_object(Bucket=out, Key=layout.rejects_key(OUT_PREFIX, "in/x.jsonl", 0), Body=json.dumps(stale).encode())
    obj = upload(s3, src, "in/x.jsonl", b"1\n2\n")
    result = Attempt(s3).run(file_input(buckets, obj))
    assert result.rejected == 0
    assert output_keys(s3, out, obj.key) == ["part-00000.jsonl"]


# ------------------------------------------------------------------ sources deleted or changed (issue 9.2)


def group_input(buckets: tuple[str, str], objs: list[ObjectRef], **options: Any) -> ProcessGroupInput:
    first = file_input(buckets, objs[0], **options)
    return ProcessGroupInput(file=first, more=objs[1:])


def etags(s3: Any, out: str, key: str) -> dict[str, str]:
    prefix = layout.file_dir(OUT_PREFIX, key)
    return {o["Key"]: o["ETag"] for o in s3.list_objects_v2(Bucket=out, Prefix=prefix).get("Contents", [])}


def redrive_ref(s3: Any, buckets: tuple[str, str], key: str) -> ObjectRef:
    """The object as a redrive lists it: from a report where ``key`` failed (``_list_failed``)."""
    src, out = buckets
    report = {"files": [{"key": key, "status": "failed"}]}
    s3.put_object(Bucket=out, Key="earlier/_report.json", Body=json.dumps(report).encode())
    page = ActivityEnvironment().run(
        S3Activities(s3).list_objects,
        ListObjectsInput(bucket=src, prefix="", report=f"s3://{out}/earlier/_report.json"),
    )
    assert [o.key for o in page.objects] == [key]
    return page.objects[0]


def test_redrive_of_a_deleted_source_fails_as_not_found_and_keeps_its_output(s3: Any, buckets: tuple[str, str]) -> None:
    # Before: the redrive reported the file succeeded (0 records) and deleted its committed parts.
    src, out = buckets
    data, _ = make_jsonl(700)
    obj = upload(s3, src, "in/e.jsonl", data)
    first = Attempt(s3, crash_at_chunk=2)
    first.crash(file_input(buckets, obj, chunk_records=300))
    before = etags(s3, out, obj.key)
    assert len(before) == 2
    s3.delete_object(Bucket=src, Key=obj.key)

    gone = redrive_ref(s3, buckets, obj.key)
    with pytest.raises(ApplicationError) as info:
        Attempt(s3).run(file_input(buckets, gone, chunk_records=300))
    assert (info.value.type, info.value.non_retryable) == ("NotFound", True)
    assert f"s3://{src}/in/e.jsonl" in info.value.message
    assert etags(s3, out, obj.key) == before, "committed output of a deleted source was changed"


@pytest.mark.parametrize("change", ["overwritten", "deleted"])
def test_zero_byte_source_is_read_pinned_to_its_listed_version(s3: Any, buckets: tuple[str, str], change: str) -> None:
    # Before: a 0-byte object was never requested, so a change after listing went unnoticed.
    src, out = buckets
    obj = upload(s3, src, "in/empty.csv", b"")
    if change == "overwritten":
        s3.put_object(Bucket=src, Key=obj.key, Body=b"id\n1\n")
    else:
        s3.delete_object(Bucket=src, Key=obj.key)
    with pytest.raises(ApplicationError) as info:
        Attempt(s3).run(file_input(buckets, obj))
    expected = "SourceChanged" if change == "overwritten" else "NotFound"
    assert (info.value.type, info.value.non_retryable) == (expected, True)
    assert output_keys(s3, out, obj.key) == []


def test_completed_file_of_a_deleted_source_is_not_reported_succeeded(s3: Any, buckets: tuple[str, str]) -> None:
    # Found complete from its parts: one pinned HEAD still confirms the listed version exists.
    src, out = buckets
    data, _ = make_jsonl(100)
    obj = upload(s3, src, "in/e.jsonl", data)
    req = file_input(buckets, obj)
    Attempt(s3).run(req)
    before = etags(s3, out, obj.key)
    s3.delete_object(Bucket=src, Key=obj.key)
    with pytest.raises(ApplicationError) as info:
        Attempt(s3, attempt=2).run(req)
    assert info.value.type == "NotFound"
    assert etags(s3, out, obj.key) == before


# ------------------------------------------------------------------ stale output (issue 9.4)


def put_foreign_output(s3: Any, out: str, key: str, chunks: list[int], rejects: list[int]) -> None:
    """Output objects as another source version of ``key`` writes them (checkpoint with its ETag)."""
    for chunk in chunks:
        cp = Checkpoint(etag="0" * 32, fingerprint="old-version", chunk=chunk + 1, next_record=chunk + 1)
        meta = {CHECKPOINT_METADATA: cp.model_dump_json()}
        s3.put_object(Bucket=out, Key=layout.part_key(OUT_PREFIX, key, chunk), Body=b'{"old": 1}\n', Metadata=meta)
        if chunk in rejects:
            s3.put_object(
                Bucket=out, Key=layout.rejects_key(OUT_PREFIX, key, chunk), Body=b'{"line": 1}\n', Metadata=meta
            )


@pytest.mark.parametrize(
    ("missing", "heartbeat"),
    [([0, 1], False), ([2], True)],
    ids=["cleanup-removed-parts-0-1", "part-2-missing-after-resume"],
)
def test_output_after_an_interrupted_cleanup_is_exactly_the_current_version(
    s3: Any, buckets: tuple[str, str], missing: list[int], heartbeat: bool
) -> None:
    # Before: the probe stopped at the first missing part, so parts 3-5 (and rejects) of the old
    # version survived next to the new version's 3 parts.
    src, out = buckets
    key = "in/e.jsonl"
    put_foreign_output(s3, out, key, [c for c in range(6) if c not in missing], rejects=[1, 4])
    data = b"".join(b'{"v": 2, "n": %d}\n' % i for i in range(550)) + b"{broken\n"
    obj = upload(s3, src, key, data)
    req = file_input(buckets, obj, chunk_records=200)
    details: list[Any] = []
    if heartbeat:
        # This version's attempt 1 committed parts 0-1 and was lost; old parts 3-5 are left (as an
        # interrupted cleanup of any release leaves them), part 2 is missing.
        first = Attempt(s3, crash_at_chunk=2)
        first.crash(req)
        s3.delete_object(Bucket=out, Key=layout.part_key(OUT_PREFIX, key, 2))
        put_foreign_output(s3, out, key, [3, 4, 5], rejects=[4])
        details = [first.heartbeats[-1]]
    result = Attempt(s3, attempt=2, details=details).run(req)

    parts = ["part-00000.jsonl", "part-00001.jsonl", "part-00002.jsonl"]
    assert output_keys(s3, out, key) == [*parts, "rejects-00002.jsonl"]
    assert part_rows(s3, out, key) == [{"v": 2, "n": i} for i in range(550)]
    assert [r["line"] for r in read_lines(s3, out, layout.rejects_key(OUT_PREFIX, key, 2))] == [551]
    assert (result.records, result.records_written, result.rejected, result.chunks) == (551, 550, 1, 3)


def test_more_than_1000_stale_output_objects_are_all_removed(s3: Any, buckets: tuple[str, str]) -> None:
    src, out = buckets
    key = "in/big-history.jsonl"
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda c: put_foreign_output(s3, out, key, [c], rejects=[]), range(1100)))
    obj = upload(s3, src, key, b'{"n": 1}\n')
    Attempt(s3).run(file_input(buckets, obj))
    assert output_keys(s3, out, key) == ["part-00000.jsonl"]
    assert part_rows(s3, out, key) == [{"n": 1}]


# ------------------------------------------------------------------ corrupt gzip (issue 9.8)

BAD_GZIP = {
    "not-gzip": (b'{"secret": "do-not-log"}\n', "is not gzip data"),
    "truncated": (gzip.compress(b'{"n": 1}\n' * 5000)[:-40], "is truncated"),
    "corrupt": (gzip.compress(b'{"n": 1}\n' * 5000)[:30] + b"\xff" * 200, "holds corrupt compressed data"),
}


@pytest.mark.parametrize("kind", sorted(BAD_GZIP))
def test_corrupt_gzip_fails_at_once_as_bad_file(s3: Any, buckets: tuple[str, str], kind: str) -> None:
    # Before: the raw gzip error was retried as transient (about 4 minutes of attempts).
    src, _ = buckets
    body, what = BAD_GZIP[kind]
    obj = upload(s3, src, f"in/{kind}.jsonl.gz", body)
    with pytest.raises(ApplicationError) as info:
        Attempt(s3).run(file_input(buckets, obj))
    err = info.value
    assert (err.type, err.non_retryable) == ("BadFile", True)
    assert err.message.startswith(f"s3://{src}/in/{kind}.jsonl.gz {what}")
    assert "Upload it again" in err.message
    assert "do-not-log" not in err.message and "secret" not in err.message


def test_corrupt_gzip_in_a_group_fails_alone(s3: Any, buckets: tuple[str, str]) -> None:
    # Before: the raw error escaped the group, which was retried whole, then file by file.
    src, out = buckets
    good = upload(s3, src, "g/a.jsonl", b'{"n": 1}\n{"n": 2}\n')
    bad = upload(s3, src, "g/b.jsonl.gz", BAD_GZIP["truncated"][0])
    other = upload(s3, src, "g/c.jsonl.gz", gzip.compress(b'{"n": 3}\n'))
    results = ActivityEnvironment().run(S3Activities(s3).process_group, group_input(buckets, [good, bad, other]))
    assert [(r.key, r.status, r.records) for r in results] == [
        ("g/a.jsonl", "succeeded", 2),
        ("g/b.jsonl.gz", "failed", 0),
        ("g/c.jsonl.gz", "succeeded", 1),
    ]
    assert str(results[1].error).startswith(f"BadFile: s3://{src}/g/b.jsonl.gz is truncated")
    assert part_rows(s3, out, "g/c.jsonl.gz") == [{"n": 3}]


# ------------------------------------------------------------------ output key length (issue 9.12)


def test_output_key_over_the_s3_limit_fails_before_anything_is_written(s3: Any, buckets: tuple[str, str]) -> None:
    # The part keys fit (4 + 1002 + 17 bytes) but a rejects key would not (4 + 1002 + 20). Before: the
    # file wrote parts 0-1 and failed at the rejects of chunk 2, depending on the data.
    src, out = buckets
    key = "kk/" + "/".join(["a" * 198] * 5) + ".json"
    assert len(key) == 1002
    body = b"".join(b'{"n": %d}\n' % i for i in range(25)) + b"{bad\n"
    obj = upload(s3, src, key, body)
    with pytest.raises(ApplicationError) as info:
        Attempt(s3).run(file_input(buckets, obj, chunk_records=10))
    err = info.value
    assert (err.type, err.non_retryable) == ("OutputKeyTooLong", True)
    assert "would be up to 1026 bytes, over S3's limit of 1024 bytes" in err.message
    assert "use a shorter output_prefix" in err.message
    assert output_keys(s3, out, key) == []


# ------------------------------------------------------------------ the file's own books (issue 9.B)

DROPPED = f"drop-odd-{uuid.uuid4().hex[:6]}"
SHORT = f"short-{uuid.uuid4().hex[:6]}"
FANOUT = f"fanout-{uuid.uuid4().hex[:6]}"


@record_handler(DROPPED)
def _drop_odd(value: Any) -> Any:
    if value["n"] == 13:
        raise ValueError("thirteen")
    return None if value["n"] % 2 else value


def _short(records: Sequence[Record]) -> HandlerResult:
    # Claims to account for every record, but loses the last one of each chunk.
    return HandlerResult([r.value for r in records[:-1]], [], dropped=0)


def _fanout(records: Sequence[Record]) -> HandlerResult:
    return HandlerResult([v for r in records for v in (r.value, r.value)], [])


register(SHORT, _short, replace=True)
register(FANOUT, _fanout, replace=True)


def test_dropped_records_are_counted_and_the_books_balance(s3: Any, buckets: tuple[str, str]) -> None:
    # Before: records = written + rejected, so dropped records vanished from the counts.
    src, out = buckets
    data, _ = make_jsonl(50)
    obj = upload(s3, src, "in/e.jsonl", data)
    result = Attempt(s3).run(file_input(buckets, obj, handler=DROPPED, chunk_records=20))
    assert (result.records, result.records_written, result.rejected, result.dropped) == (50, 25, 1, 24)
    assert stored_checkpoint(s3, out, obj.key, 2)["dropped"] == 24  # type: ignore[index]
    assert [r["n"] for r in part_rows(s3, out, obj.key)] == list(range(0, 50, 2))


def test_handler_losing_records_fails_with_accounting_error(s3: Any, buckets: tuple[str, str]) -> None:
    src, out = buckets
    data, _ = make_jsonl(30)
    obj = upload(s3, src, "in/e.jsonl", data)
    with pytest.raises(ApplicationError) as info:
        Attempt(s3).run(file_input(buckets, obj, handler=SHORT, chunk_records=10))
    err = info.value
    assert (err.type, err.non_retryable) == ("AccountingError", True)
    assert (
        "chunk 0 (lines from 1): the handler was given 10 records but returned 9 outputs + 0 rejects + 0 dropped"
    ) in err.message
    assert output_keys(s3, out, obj.key) == []


def test_fan_out_chunk_handler_may_write_more_records_than_it_read(s3: Any, buckets: tuple[str, str]) -> None:
    src, out = buckets
    data, rows = make_jsonl(30)
    obj = upload(s3, src, "in/e.jsonl", data)
    result = Attempt(s3).run(file_input(buckets, obj, handler=FANOUT, chunk_records=10))
    assert (result.records, result.records_written, result.rejected, result.dropped) == (30, 60, 0, 0)
    assert part_rows(s3, out, obj.key) == [r for row in rows for r in (row, row)]


def test_part_removed_while_the_file_runs_fails_the_file_with_accounting_error(
    s3: Any, buckets: tuple[str, str]
) -> None:
    # Before: the file reported success with part 0 gone.
    src, out = buckets
    data, _ = make_jsonl(900)
    obj = upload(s3, src, "in/e.jsonl", data)

    def remove_part_0(cp: dict[str, Any]) -> None:
        if cp["chunk"] == 2:
            s3.delete_object(Bucket=out, Key=layout.part_key(OUT_PREFIX, obj.key, 0))

    with pytest.raises(ApplicationError) as info:
        Attempt(s3, check=remove_part_0).run(file_input(buckets, obj, chunk_records=300))
    err = info.value
    assert (err.type, err.non_retryable) == ("AccountingError", True)
    assert "part-00000.jsonl is missing (expected parts 0-2 of this version)" in err.message


def test_part_overwritten_by_another_version_while_the_file_runs_fails_the_file(
    s3: Any, buckets: tuple[str, str]
) -> None:
    src, out = buckets
    data, _ = make_jsonl(900)
    obj = upload(s3, src, "in/e.jsonl", data)

    def overwrite_part_1(cp: dict[str, Any]) -> None:
        if cp["chunk"] == 3:
            put_foreign_output(s3, out, obj.key, [1], rejects=[])

    with pytest.raises(ApplicationError) as info:
        Attempt(s3, check=overwrite_part_1).run(file_input(buckets, obj, chunk_records=300))
    assert info.value.type == "AccountingError"
    assert "part-00001.jsonl is not of this version" in info.value.message


def test_fresh_small_files_cost_one_get_and_one_put_each(buckets: tuple[str, str], s3: Any) -> None:
    # The benchmark's case: a fresh group of small files. One LIST for committed output, per file one
    # GET and one PUT, one LIST to check the group's output.
    src, _ = buckets
    objs = [upload(s3, src, f"small/f{i}.jsonl", b'{"n": %d}\n' % i) for i in range(10)]
    counted = make_client()
    calls: list[str] = []
    counted.meta.events.register("before-call.s3.*", lambda event_name, **_: calls.append(event_name.split(".")[-1]))
    stores = data_stores(counted)  # the data requests' client (obstore), when not boto3's

    def requests() -> list[str]:
        return sorted(calls + (list(stores.counts.elements()) if stores is not None else []))

    results = ActivityEnvironment().run(S3Activities(counted).process_group, group_input(buckets, objs))
    assert [r.status for r in results] == ["succeeded"] * 10
    assert requests() == ["GetObject"] * 10 + ["ListObjectsV2"] * 2 + ["PutObject"] * 10

    calls.clear()
    if stores is not None:
        stores.counts.clear()
    one = upload(s3, src, "single/f.jsonl", b'{"n": 1}\n')
    Attempt(counted).run(file_input(buckets, one))
    # One LIST for committed output before, one GET, one PUT, one LIST to check the output after.
    assert requests() == ["GetObject", "ListObjectsV2", "ListObjectsV2", "PutObject"]


def test_group_output_is_checked_and_cleaned_whatever_the_servers_key_order(s3: Any, buckets: tuple[str, str]) -> None:
    # "g/a.csv/" sorts after "g/a.csv.gz/" in S3's byte order, before it in SeaweedFS's path order:
    # the group's one LIST may miss a folder, which is then listed on its own.
    src, out = buckets
    objs = [
        upload(s3, src, "g/a.csv", b"id\n1\n"),
        upload(s3, src, "g/a.csv.gz", gzip.compress(b"id\n2\n")),
        upload(s3, src, "g/a.csv-x.csv", b"id\n3\n"),
    ]
    for obj in objs:
        put_foreign_output(s3, out, obj.key, [0, 1], rejects=[1])  # an older version's output
    results = ActivityEnvironment().run(S3Activities(s3).process_group, group_input(buckets, objs))
    assert [(r.key, r.status, r.records) for r in results] == [
        ("g/a.csv", "succeeded", 1),
        ("g/a.csv.gz", "succeeded", 1),
        ("g/a.csv-x.csv", "succeeded", 1),
    ]
    for obj, n in zip(objs, "123", strict=True):
        assert output_keys(s3, out, obj.key) == ["part-00000.jsonl"], obj.key
        assert part_rows(s3, out, obj.key) == [{"id": n}]


# ------------------------------------------------------------------ a cancelled group (issue 9)


def test_cancelled_group_reports_its_finished_files_as_succeeded(
    s3: Any, buckets: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(files, "GROUP_THREADS", 1)  # one file after the other (at once: tests/test_groups.py)
    # Before: the group raised CancelledError, and the workflow reported all three files cancelled
    # with 0 records.
    src, out = buckets
    a = upload(s3, src, "g/a.jsonl", make_jsonl(5)[0])
    b = upload(s3, src, "g/b.jsonl", make_jsonl(50)[0])
    c = upload(s3, src, "g/c.jsonl", make_jsonl(5)[0])
    env = ActivityEnvironment()
    beats: list[Any] = []

    def cancel_in_b(*details: Any) -> None:
        beats.append(details)
        if details[1] == 1:  # (checkpoint, group index, bytes of the group's files finished): a is done
            assert details[2] == a.size
        if details[1] == 1 and details[0].chunk == 2:
            # Delivered at the end of the chunk being built when part 1 of b was heartbeated: its part 2,
            # written one chunk behind, is waited for and counted.
            env.cancel()

    env.on_heartbeat = cancel_in_b
    results = env.run(S3Activities(s3).process_group, group_input(buckets, [a, b, c], chunk_records=10))
    assert [(r.key, r.status, r.records, r.records_written, r.chunks) for r in results] == [
        ("g/a.jsonl", "succeeded", 5, 5, 1),
        ("g/b.jsonl", "cancelled", 30, 30, 3),
        ("g/c.jsonl", "cancelled", 0, 0, 0),
    ]
    assert output_keys(s3, out, "g/b.jsonl") == [f"part-{i:05d}.jsonl" for i in range(3)]
    assert output_keys(s3, out, "g/c.jsonl") == []


def test_cancel_after_a_files_final_part_reports_it_succeeded(
    s3: Any, buckets: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(files, "GROUP_THREADS", 1)  # one file after the other (at once: tests/test_groups.py)
    src, _ = buckets
    a = upload(s3, src, "g/a.jsonl", make_jsonl(5)[0])
    b = upload(s3, src, "g/b.jsonl", make_jsonl(5)[0])
    env = ActivityEnvironment()
    commit = file_output.FileOutput.commit

    def cancel_at_end_of_a(output: file_output.FileOutput, cp: Checkpoint, new: Checkpoint, *args: Any) -> Checkpoint:
        committed = commit(output, cp, new, *args)
        if output.key == a.key and new.done:  # a file's final checkpoint is not heartbeated in a group
            env.cancel()
        return committed

    monkeypatch.setattr(file_output.FileOutput, "commit", cancel_at_end_of_a)
    results = env.run(S3Activities(s3).process_group, group_input(buckets, [a, b]))
    assert [(r.key, r.status, r.records) for r in results] == [
        ("g/a.jsonl", "succeeded", 5),
        ("g/b.jsonl", "cancelled", 0),
    ]


def test_group_stopped_by_worker_shutdown_is_retried_not_reported(s3: Any, buckets: tuple[str, str]) -> None:
    # Only a cancellation of the job makes a partial result; any other cancellation is raised.
    src, _ = buckets
    a = upload(s3, src, "g/a.jsonl", make_jsonl(30)[0])
    env = ActivityEnvironment()

    def shutdown(*details: Any) -> None:
        if details[0].chunk == 1:
            env.cancel(ActivityCancellationDetails(worker_shutdown=True))

    env.on_heartbeat = shutdown
    with pytest.raises(CancelledError):
        env.run(S3Activities(s3).process_group, group_input(buckets, [a, a], chunk_records=10))


def test_cancelled_file_returns_its_checkpoint_counts(s3: Any, buckets: tuple[str, str]) -> None:
    src, out = buckets
    obj = upload(s3, src, "in/e.jsonl", make_jsonl(100)[0])
    attempt = Attempt(s3)

    def cancel_at_chunk_3(cp: dict[str, Any]) -> None:
        if cp["chunk"] == 3:
            attempt.env.cancel()

    attempt.check = cancel_at_chunk_3
    result = attempt.run(file_input(buckets, obj, chunk_records=10))
    # Cancelled while chunk 3 was built (part 2's checkpoint was just heartbeated): part 3, written one
    # chunk behind, is waited for and counted, so the counts are those of the parts there.
    assert (result.status, result.records, result.records_written, result.chunks) == ("cancelled", 40, 40, 4)
    assert output_keys(s3, out, obj.key) == [f"part-{i:05d}.jsonl" for i in range(4)]


def test_resume_without_heartbeat_finds_the_last_part_in_a_few_requests(
    s3: Any, buckets: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file handed over to the next run (or whose heartbeats were lost) finds its last committed part
    with about 2 log2(n) HEADs before it writes again, not one per part: 151 parts, <= 20 requests. (The
    check of the whole folder once the file is done still reads each earlier part once.)"""
    src, out = buckets
    data, rows = make_jsonl(2_000)
    obj = upload(s3, src, "in/long.jsonl", data)
    req = file_input(buckets, obj, chunk_records=10)
    Attempt(s3, crash_at_chunk=151).crash(req)  # dies at the heartbeat of part 150, written: parts 0-150
    monkeypatch.setenv("S3BATCH_DATA_CLIENT", "boto3")  # every request in order on one client's events
    s3 = make_client()
    calls: list[tuple[str, str]] = []

    def count(params: dict[str, Any], model: Any, **_: Any) -> None:
        calls.append((model.name, params.get("Key", "")))

    s3.meta.events.register("provide-client-params.s3.*", count)
    try:
        result = Attempt(s3, attempt=2).run(req)  # no heartbeat details
    finally:
        s3.meta.events.unregister("provide-client-params.s3.*", count)
    assert result.resumed_from_record == 1_510, result
    first_put = next(i for i, (op, _) in enumerate(calls) if op == "PutObject")
    probes = [key for op, key in calls[:first_put] if op == "HeadObject" and "/part-" in key]
    assert 0 < len(probes) <= 20, probes
    assert part_rows(s3, out, obj.key) == rows

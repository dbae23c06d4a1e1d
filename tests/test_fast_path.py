"""The fast CSV path (``s3batch.formats.fastcsv``) against the exact parser: the same records, lines,
offsets, rejects, chunk boundaries and output bytes, for canonical CSV (where the fast path reads
nearly everything) and for CSV with every kind of damage (where it must hand over to the exact parser
at the right record). The whole-suite properties of ``tests/test_records_properties.py`` also run
against both paths; here the inputs are mostly canonical, so the fast blocks are what is tested.

The file-level tests run the real file activity on the real S3 server twice, with the fast path on and
off, and compare every output object byte for byte (parts, rejects, checkpoint metadata).
"""

from __future__ import annotations

import io
import re
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from s3batch.workflows.batch import S3BatchWorkflow
from temporalio.client import Client

from s3batch.dev.faultproxy import FaultProxy, Rule
from s3batch.dev.stack import Stack
from s3batch.dev.workers import WorkerProcess
from s3batch.formats.csv import CsvParser
from s3batch.formats.fastcsv import FastCsvParser
from s3batch.handlers import passthrough
from s3batch.models import S3BatchInput
from tests.helpers import wait_for
from tests.helpers.assertions import assert_exactly_once
from tests.helpers.data import make_csv, messy_csv
from tests.helpers.fastcsv import bounded, csv_files, run_both_ways
from tests.helpers.output import committed_parts, report
from tests.helpers.records import chunked, walk
from tests.helpers.workers import worker_process


def _walk_both(data: bytes, block: int, limit: int, sizes: list[int] | None) -> None:
    exact = CsvParser(chunked(data, sizes), max_line_bytes=limit)
    fast = FastCsvParser(chunked(data, sizes), max_line_bytes=limit, block_bytes=block)
    try:
        expected = walk(exact)
    except ValueError as err:
        with pytest.raises(ValueError, match=str(err)[:20]):
            walk(fast)
        return
    assert walk(fast) == expected
    assert (fast.offset, fast.line, fast.header) == (exact.offset, exact.line, exact.header)


@bounded
@given(
    data=csv_files(),
    block=st.sampled_from([16, 100, 1000, 1 << 20]),
    limit=st.sampled_from([12, 1 << 20]),
    sizes=st.one_of(st.none(), st.lists(st.integers(1, 50), min_size=1, max_size=3)),
)
def test_fast_path_reads_every_record_line_and_offset_as_the_exact_parser(
    data: bytes, block: int, limit: int, sizes: list[int] | None
) -> None:
    _walk_both(data, block, limit, sizes)


@bounded
@given(data=csv_files(), block=st.sampled_from([16, 200, 1 << 20]), as_csv=st.booleans(), data_st=st.data())
def test_passthrough_at_once_is_the_passthrough_handler_taken_as_the_chunk_loop_takes_records(
    data: bytes, block: int, as_csv: bool, data_st: Any
) -> None:
    """``take_json`` (``want`` records, or fewer once ``until`` is reached) against the exact parser's
    records through the ``passthrough`` handler, with the same stop rule (``_take`` in the chunk loop).
    ``as_csv`` (rows kept as the file's CSV, for a table's ``COPY``): the same records and sizes (counted
    from the values' lengths, not documents), the file's own bytes of those rows and their lines."""
    try:
        reference = walk(CsvParser(io.BytesIO(data)))
    except ValueError:
        return
    records, bounds = reference
    fast = FastCsvParser(io.BytesIO(data), block_bytes=block)
    it = iter(fast)
    at = 0
    while at < len(records):
        want = data_st.draw(st.integers(1, 30))
        until = fast.offset + data_st.draw(st.integers(1, 400))
        start = fast.offset
        lines: list[int] | None = [] if as_csv else None
        n, pieces, reached, size = fast.take_json(want, until, lines)
        if n == 0:
            record = next(it)
            assert record == records[at]
            at += 1
            continue
        taken = records[at : at + n]
        assert all(r.error is None for r in taken)
        documents = passthrough(taken).output
        if lines is None:
            assert b"\n".join(pieces) == b"\n".join(documents)
        else:
            assert b"".join(pieces) == data[start : bounds[at + n - 1][0]]
            assert lines == [r.line for r in taken]
        assert size == sum(len(d) for d in documents)
        # _take's rule: stop after `want` records, or after the first record whose end reaches `until`.
        ends = [offset for offset, _ in bounds[at : at + n]]
        assert all(end < until for end in ends[:-1])
        assert reached == (ends[-1] >= until)
        assert n == want or reached or (fast.offset, fast.line) == bounds[at + n - 1]
        assert (fast.offset, fast.line) == bounds[at + n - 1]
        at += n
    assert next(it, None) is None


# ------------------------------------------------------------------------------- the file activity


@pytest.mark.parametrize(
    ("rows", "chunk_records", "budget"),
    [(30_000, 1_000, 64 << 20), (30_000, 7_000, 64 << 20), (8_000, 10_000, 16_384)],
    ids=["chunks-1000", "chunks-7000", "byte-budget"],
)
def test_file_output_is_byte_identical_with_and_without_the_fast_path(
    s3: Any, buckets: tuple[str, str], rows: int, chunk_records: int, budget: int
) -> None:
    """The same parts, rejects and checkpoints (hence the same resume points) whichever path reads, with
    quoted fields, line breaks inside fields, a malformed quote, blank lines, bad UTF-8, a short row, and
    a chunk ended by the worker's byte budget."""
    src, _ = buckets
    s3.put_object(Bucket=src, Key="in/messy.csv", Body=messy_csv(rows))
    job = {"chunk_records": chunk_records, "budget": budget}
    exact = run_both_ways(s3, buckets, "in/messy.csv", fast=False, prefix="exact/", **dict(job))
    fast = run_both_ways(s3, buckets, "in/messy.csv", fast=True, prefix="fast/", **dict(job))
    assert fast["result"] == exact["result"]
    assert exact["result"]["rejected"] >= 3
    assert sorted(fast["objects"]) == sorted(exact["objects"])
    for name, (body, metadata) in exact["objects"].items():
        assert fast["objects"][name][0] == body, name
        assert fast["objects"][name][1] == metadata, name


# ------------------------------------------------------------------- a real SIGKILL on the fast path


@pytest.mark.slow
async def test_sigkill_of_the_fast_passthrough_resumes_at_the_last_committed_part_exactly_once(
    client: Client, stack: Stack, s3: Any, buckets: tuple[str, str], task_queue: str, tmp_path: Path
) -> None:
    """The built-in ``passthrough`` on a CSV of quoted fields takes the packed path (rows encoded a block
    at a time). Its part PUTs are slowed by a proxy so the kill lands mid-file; the second worker resumes
    at the last committed part and every row is written once."""
    src, out = buckets
    rows, chunk = 60_000, 1_000
    s3.put_object(Bucket=src, Key="big.csv", Body=make_csv(rows))
    with FaultProxy(stack.config.s3_port) as proxy:
        proxy.add(Rule("delay", method="PUT", path=r"/o/big\.csv/part-", delay=0.15))
        first = worker_process(task_queue, tmp_path, "a", AWS_ENDPOINT_URL_S3=proxy.url)
        second: WorkerProcess | None = None
        try:
            first.wait_ready()
            spec = S3BatchInput(
                bucket=src, output_bucket=out, output_prefix="o/", chunk_records=chunk, heartbeat_timeout_seconds=5
            )
            handle = await client.start_workflow(
                S3BatchWorkflow.run, spec, id=f"fast-kill-{uuid.uuid4().hex[:8]}", task_queue=task_queue
            )
            await wait_for(lambda: len(committed_parts(s3, out, "o/big.csv/")) >= 8, 60, "8 committed parts")
            first.kill()
            committed = committed_parts(s3, out, "o/big.csv/")[-1].next_record
            assert 0 < committed < rows, "the kill must land mid-file"
            second = worker_process(task_queue, tmp_path, "b")
            second.wait_ready()
            result = await handle.result()
            assert result.status == "succeeded"
            fast = [int(n) for n in re.findall(r"\((\d+) records read by the fast path\)", second.log())]
            assert fast and 0 < fast[0] <= rows - committed, second.log()[-2000:]
        finally:
            first.stop()
            if second:
                second.stop()
    entry = report(s3, out, "o/")["files"][0]
    assert entry["attempts"] >= 2
    assert entry["resumed_from_record"] >= committed  # parts committed between the look and the kill count
    assert entry["records"] == rows
    assert_exactly_once(s3, out, "o/big.csv/", rows)

"""Parquet input (issue 14): rows exactly as pyarrow reads them (mapped to JSON as documented in
``s3batch.formats.parquet``), through real jobs; a truncated file; resume after a SIGKILL that skips
the row groups already committed (measured by the bytes the new worker fetched)."""

from __future__ import annotations

import base64
import datetime
import decimal
import io
import json
import math
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from temporalio.client import Client
from temporalio.worker import Worker

from s3batch.dev.faultproxy import FaultProxy
from s3batch.dev.workers import WorkerProcess
from s3batch.formats.keys import resolve_format
from s3batch.formats.parquet import json_values
from s3batch.jsonvalues import encode_json
from s3batch.models import S3BatchInput
from tests.helpers import wait_for
from tests.helpers.jobs import execute, start
from tests.helpers.output import committed_parts, read_jsonl, report
from tests.helpers.workers import worker_process

# ------------------------------------------------------------------ the reference: pyarrow's own reading


def _reference(value: Any, t: pa.DataType) -> Any:
    """What the documented mapping makes of ``value``, one value as pyarrow's ``to_pylist`` gives it."""
    if value is None:
        return None
    if pa.types.is_dictionary(t):
        return _reference(value, t.value_type)
    if pa.types.is_struct(t):
        return {t.field(i).name: _reference(value[t.field(i).name], t.field(i).type) for i in range(t.num_fields)}
    if pa.types.is_map(t):
        return [{"key": _reference(k, t.key_type), "value": _reference(v, t.item_type)} for k, v in value]
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return [_reference(v, t.value_type) for v in value]
    if pa.types.is_floating(t):
        if math.isnan(value):
            return "NaN"
        return value if not math.isinf(value) else ("Infinity" if value > 0 else "-Infinity")
    if pa.types.is_binary(t) or pa.types.is_fixed_size_binary(t) or pa.types.is_large_binary(t):
        return base64.b64encode(value).decode()
    if pa.types.is_timestamp(t):  # microseconds here (to_pylist cannot give nanoseconds without pandas)
        text = value.replace(tzinfo=None).isoformat(timespec="microseconds")
        return text + ("Z" if t.tz else "")
    if pa.types.is_date(t):
        return value.isoformat()
    if pa.types.is_time(t):
        return value.isoformat(timespec="microseconds" if t.unit == "us" else "milliseconds")
    if pa.types.is_duration(t):
        seconds = value.days * 86400 + value.seconds
        return f"PT{seconds}.{value.microseconds:06d}S"
    return value


def _expected(table: pa.Table) -> list[dict[str, Any]]:
    types = {f.name: f.type for f in table.schema}
    return [{k: _reference(v, types[k]) for k, v in row.items()} for row in table.to_pylist()]


def _exact(values: Any) -> Any:
    """JSON values with decimals as ``(digits,)`` so 1.50 and 1.5 differ, for comparisons."""
    if isinstance(values, dict):
        return {k: _exact(v) for k, v in values.items()}
    if isinstance(values, list):
        return [_exact(v) for v in values]
    if isinstance(values, decimal.Decimal):
        return ("decimal", str(values))
    if isinstance(values, float):
        return ("float", repr(values))
    return values


def _loads(line: bytes | str) -> Any:
    return json.loads(line, parse_float=decimal.Decimal)


def _typed_table(n: int) -> pa.Table:
    utc = datetime.UTC
    base = datetime.datetime(2026, 12, 1, 13, 5, 0, 123456)
    return pa.table(
        {
            "id": pa.array(range(n), pa.int64()),
            "u64": pa.array([2**64 - 1 - i for i in range(n)], pa.uint64()),
            "price": pa.array([decimal.Decimal(f"{i}.{i % 100:02d}") if i % 7 else None for i in range(n)],
                              pa.decimal128(12, 2)),
            "huge": pa.array([decimal.Decimal("12345678901234567890123456789.123456789")] * n, pa.decimal256(40, 9)),
            "f": pa.array([0.1 * i if i % 5 else float("nan") for i in range(n)], pa.float64()),
            "f32": pa.array([0.1] * n, pa.float32()),
            "name": pa.array([f"név {i} \u2603" for i in range(n)], pa.string()),
            "blob": pa.array([bytes([i % 256, 0, 255]) for i in range(n)], pa.binary()),
            "at": pa.array([(base + datetime.timedelta(seconds=i)).replace(tzinfo=utc) for i in range(n)],
                           pa.timestamp("us", tz="UTC")),
            "local": pa.array([base - datetime.timedelta(days=i) for i in range(n)], pa.timestamp("us")),
            "day": pa.array([datetime.date(2026, 1, 1) + datetime.timedelta(days=i) for i in range(n)], pa.date32()),
            "clock": pa.array([datetime.time(1, 2, 3, 4000)] * n, pa.time64("us")),
            "took": pa.array([datetime.timedelta(seconds=i, microseconds=5) for i in range(n)], pa.duration("us")),
            "tags": pa.array([[f"t{i}", None] if i % 3 else None for i in range(n)], pa.list_(pa.string())),
            "point": pa.array([{"x": i, "y": [1.5, None]} if i % 4 else None for i in range(n)]),
            "attrs": pa.array([[("k", i), ("k", None)] for i in range(n)], pa.map_(pa.string(), pa.int32())),
            "kind": pa.array(["a", "b", None] * (n // 3) + ["a"] * (n % 3)).dictionary_encode(),
        }
    )


def _parquet(table: pa.Table, row_group_size: int) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf, row_group_size=row_group_size)
    return buf.getvalue()


# ------------------------------------------------------------------ the mapping, without S3


def test_nanoseconds_and_edge_values_keep_every_digit() -> None:
    ns = pa.array([0, 1_700_000_000_123_456_789, -1], pa.timestamp("ns", tz="America/New_York"))
    assert json_values(ns, "c", "s3://b/k") == [
        "1970-01-01T00:00:00.000000000Z",
        "2023-11-14T22:13:20.123456789Z",
        "1969-12-31T23:59:59.999999999Z",
    ]
    assert json_values(pa.array([5, None], pa.timestamp("s")), "c", "w") == ["1970-01-01T00:00:05", None]
    assert json_values(pa.array([-1_500], pa.duration("ms")), "c", "w") == ["-PT1.500S"]
    assert json_values(pa.array([3_723_000_000_001], pa.time64("ns")), "c", "w") == ["01:02:03.000000001"]
    assert json_values(pa.array([float("inf"), -float("inf")]), "c", "w") == ["Infinity", "-Infinity"]
    # 32-bit times, half floats, views, fixed-size lists sliced.
    assert json_values(pa.array([1_000, None], pa.time32("ms")), "c", "w") == ["00:00:01.000", None]
    assert json_values(pa.array([1.5], pa.float32()).cast(pa.float16()), "c", "w") == [1.5]
    assert json_values(pa.array(["v"], pa.string_view()), "c", "w") == ["v"]
    assert json_values(pa.array([b"v"], pa.binary_view()), "c", "w") == ["dg=="]
    assert json_values(pa.array([[1, 2], [3, 4]], pa.list_(pa.int8(), 2)).slice(1), "c", "w") == [[3, 4]]
    assert resolve_format("x/y.parquet", "auto") == ("parquet", None)


_SCALARS = st.one_of(
    st.tuples(st.just(pa.int64()), st.integers(-(2**63), 2**63 - 1)),
    st.tuples(st.just(pa.decimal128(38, 10)), st.decimals(-(10**27), 10**27, places=10, allow_nan=False)),
    st.tuples(st.just(pa.string()), st.text()),
    st.tuples(st.just(pa.binary()), st.binary()),
    st.tuples(st.just(pa.float64()), st.floats()),
    st.tuples(
        st.just(pa.timestamp("us", tz="UTC")),
        st.datetimes(timezones=st.just(datetime.UTC)),
    ),
    st.tuples(st.just(pa.date32()), st.dates()),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_SCALARS, min_size=1, max_size=1).flatmap(
    lambda one: st.tuples(st.just(one[0][0]), st.lists(st.one_of(st.none(), st.just(one[0][1])), max_size=5))
), st.booleans())
def test_mapping_matches_pyarrows_reading(case: tuple[pa.DataType, list[Any]], nested: bool) -> None:
    t, values = case
    array = pa.array(values, t)
    if nested:  # the same values inside a list and a struct, sliced (offsets not at 0)
        lists = pa.array([[v] for v in values], pa.list_(t))
        array = pa.StructArray.from_arrays([lists], ["v"]).slice(min(1, len(values)))
    got = _loads(encode_json(json_values(array, "c", "w")))
    assert _exact(got) == _exact(_loads(encode_json([_reference(v, array.type) for v in array.to_pylist()])))


# ------------------------------------------------------------------ through real jobs


def _job(src: str, out: str, **kw: Any) -> S3BatchInput:
    return S3BatchInput(bucket=src, output_bucket=out, output_prefix="o/", **kw)


async def test_parquet_job_output_is_pyarrows_rows_exactly(
    client: Client, worker: Worker, s3: Any, buckets: tuple[str, str], task_queue: str
) -> None:
    src, out = buckets
    table = _typed_table(250)
    s3.put_object(Bucket=src, Key="t.parquet", Body=_parquet(table, 60))  # 5 row groups; chunks cross them
    result = await execute(client, task_queue, _job(src, out, chunk_records=45, group_max_files=1), "parquet")
    assert result.status == "succeeded"
    entry = report(s3, out)["files"][0]
    assert (entry["records"], entry["records_written"], entry["chunks"]) == (250, 250, 6)
    body = b"".join(
        s3.get_object(Bucket=out, Key=f"o/t.parquet/part-{i:05d}.jsonl")["Body"].read() for i in range(6)
    )
    got = [_loads(line) for line in body.splitlines()]
    assert _exact(got) == _exact([_loads(encode_json(row)) for row in _expected(table)])
    assert got[0]["huge"] == decimal.Decimal("12345678901234567890123456789.123456789")
    assert b'"price":1.01,' in body.splitlines()[1]  # the decimal's scale is kept


async def test_truncated_parquet_fails_the_file_at_once_naming_it(
    client: Client, worker: Worker, s3: Any, buckets: tuple[str, str], task_queue: str
) -> None:
    src, out = buckets
    data = _parquet(_typed_table(30), 10)
    s3.put_object(Bucket=src, Key="cut.parquet", Body=data[: len(data) // 2])
    s3.put_object(Bucket=src, Key="fine.parquet", Body=data)
    result = await execute(client, task_queue, _job(src, out, max_failed_files=1, group_max_files=1), "pq-cut")
    assert result.status == "succeeded"
    files = {f["key"]: f for f in report(s3, out)["files"]}
    cut = files["cut.parquet"]
    assert cut["status"] == "failed" and cut["attempts"] == 1, cut  # BadFile: never retried
    assert f"s3://{src}/cut.parquet is not a readable Parquet file" in cut["error"]
    assert files["fine.parquet"]["records"] == 30


@pytest.mark.slow
async def test_sigkill_resume_fetches_no_byte_of_the_row_groups_already_committed(
    client: Client, stack: Any, s3: Any, buckets: tuple[str, str], task_queue: str, tmp_path: Path
) -> None:
    src, out = buckets
    groups, per_group, chunk = 6, 2_000, 500
    n = groups * per_group
    table = pa.table({"id": pa.array(range(n), pa.int64()), "pad": pa.array([os.urandom(60).hex() for _ in range(n)])})
    data = _parquet(table, per_group)
    meta = pq.ParquetFile(io.BytesIO(data)).metadata
    spans = []  # (first byte, end) of each row group's column chunks
    for g in range(groups):
        cols = [meta.row_group(g).column(c) for c in range(meta.num_columns)]
        starts = [c.dictionary_page_offset if c.has_dictionary_page else c.data_page_offset for c in cols]
        spans.append((min(starts), max(s + c.total_compressed_size for s, c in zip(starts, cols, strict=True))))
    assert spans[0][1] - spans[0][0] > 100_000  # a row group is big enough to see in the bytes fetched
    s3.put_object(Bucket=src, Key="big.parquet", Body=data)
    first = worker_process(task_queue, tmp_path, "a", S3BATCH_TEST_HANDLER_DELAY="0.15")
    second: WorkerProcess | None = None
    with FaultProxy(stack.config.s3_port) as proxy:
        try:
            first.wait_ready()
            spec = _job(src, out, chunk_records=chunk, handler="slow_passthrough", heartbeat_timeout_seconds=5)
            handle = await start(client, task_queue, spec, "pq-kill")
            await wait_for(lambda: len(committed_parts(s3, out, "o/big.parquet/")) >= 10, 90, "10 committed parts")
            first.kill()
            committed = committed_parts(s3, out, "o/big.parquet/")[-1].next_record
            assert per_group * 2 < committed < n, "the kill must land after two row groups"
            second = worker_process(task_queue, tmp_path, "b", AWS_ENDPOINT_URL_S3=proxy.url)
            second.wait_ready()
            result = await handle.result()
            assert result.status == "succeeded"
        finally:
            first.stop()
            if second:
                second.stop()
    entry = report(s3, out)["files"][0]
    assert entry["resumed_from_record"] == committed and entry["records"] == n
    got = read_jsonl(s3, out, "o/big.parquet/")
    assert [r["id"] for r in got] == list(range(n))
    assert [r["pad"] for r in got] == table.column("pad").to_pylist()
    reads = []
    for e in proxy.entries(method="GET", path=rf"^/{src}/big\.parquet"):
        assert e.range is not None, e  # every read is a ranged GET
        lo, hi = (int(x) for x in e.range.removeprefix("bytes=").split("-"))
        reads.append((lo, hi + 1))
    resume_group = committed // per_group
    fetched_before = sum(
        max(0, min(hi, s_hi) - max(lo, s_lo)) for lo, hi in reads for s_lo, s_hi in spans[:resume_group]
    )
    fetched = sum(hi - lo for lo, hi in reads)
    assert fetched_before == 0, (reads, spans)
    # What the new attempt read: the footer and the row groups from the resume point's on, no more.
    later = sum(s_hi - s_lo for s_lo, s_hi in spans[resume_group:])
    assert later <= fetched <= later + len(data) - spans[-1][1] + 64 * 1024, (fetched, later)
    print(f"resumed at row {committed} (group {resume_group}): fetched {fetched} of {len(data)} bytes")


async def test_rejects_name_the_parquet_row_number(
    client: Client, worker: Worker, s3: Any, buckets: tuple[str, str], task_queue: str
) -> None:
    src, out = buckets
    n = 30
    table = pa.table(
        {
            "customer_id": pa.array([i + 1 for i in range(n)], pa.int64()),
            "email": [f"c{i}@example.com" if i not in (4, 17) else "not an email" for i in range(n)],
            "name": [f"Customer {i}" for i in range(n)],
            "country": ["FR"] * n,
            "amount": pa.array([decimal.Decimal(f"{i}.25") for i in range(n)], pa.decimal128(10, 2)),
            "created_at": pa.array([datetime.datetime(2026, 12, 1, 8, i) for i in range(n)], pa.timestamp("ms")),
        }
    )
    s3.put_object(Bucket=src, Key="c.parquet", Body=_parquet(table, 8))
    spec = _job(src, out, handler="customers", chunk_records=7)
    assert (await execute(client, task_queue, spec, "pq-rejects")).status == "succeeded"
    rejects = read_jsonl(s3, out, "o/c.parquet/", kind="rejects")
    assert [r["line"] for r in rejects] == [5, 18]  # rows 5 and 18 (1-based) of the file
    assert len(read_jsonl(s3, out, "o/c.parquet/")) == n - 2


async def test_parquet_overwritten_mid_file_fails_with_source_changed(
    client: Client, worker: Worker, s3: Any, buckets: tuple[str, str], task_queue: str
) -> None:
    import tests.slow_handlers  # noqa: F401 - registers slow_passthrough for the in-process worker

    src, out = buckets
    table = pa.table({"id": pa.array(range(3_000), pa.int64())})
    s3.put_object(Bucket=src, Key="p.parquet", Body=_parquet(table, 500))  # 6 row groups, each its own GET
    spec = _job(src, out, chunk_records=100, handler="slow_passthrough", max_failed_files=1)
    handle = await start(client, task_queue, spec, "pq-changed")
    await wait_for(lambda: committed_parts(s3, out, "o/p.parquet/"), 60, "a committed part")
    s3.put_object(Bucket=src, Key="p.parquet", Body=_parquet(table.slice(0, 10), 5))
    assert (await handle.result()).status == "succeeded"  # one failed file is allowed
    entry = report(s3, out)["files"][0]
    assert entry["status"] == "failed" and entry["attempts"] == 1, entry
    assert entry["error"].startswith(f"SourceChanged: s3://{src}/p.parquet changed since it was listed"), entry

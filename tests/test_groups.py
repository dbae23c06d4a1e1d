"""A group of small files processed a few at once (``activities/files.py``, ``GROUP_THREADS``): each file
reported exactly once, a cancel stopping every file in flight at a chunk boundary, a failure of one file
stopping the others, and a killed worker's group resumed elsewhere without duplicates. Real Temporal and
SeaweedFS (the session's stack); no timing assertions: the handlers below wait for each other or for the
cancel, so what overlaps is decided by the test, not by the scheduler."""

from __future__ import annotations

import dataclasses
import itertools
import json
import threading
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from s3batch.activities import file_setup, files
from s3batch.activities.s3_activities import S3Activities
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from s3batch import layout
from s3batch.checkpoint import Checkpoint
from s3batch.formats.common import Record
from s3batch.handlers import HandlerResult, register
from s3batch.messages import ObjectRef, ProcessFileInput, ProcessGroupInput
from tests.helpers import wait_for
from tests.helpers.assertions import assert_exactly_once
from tests.helpers.data import make_csv
from tests.helpers.jobs import start
from tests.helpers.output import committed_parts, list_keys, report
from tests.helpers.workers import worker_process

OUT_PREFIX = "out/"
WAIT = 15.0
"""Seconds a handler waits for the test's condition before it fails the test (only ever reached by a failing test)."""


@pytest.fixture(params=[False, True], ids=["parts-at-once", "parts-behind"])
def behind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Small files' parts written at once (as in production) and one chunk behind (as a big file's)."""
    if request.param:
        monkeypatch.setattr(file_setup, "BEHIND_MIN_BYTES", 0)
    return bool(request.param)


def upload(s3: Any, bucket: str, key: str, body: bytes) -> ObjectRef:
    s3.put_object(Bucket=bucket, Key=key, Body=body)
    etag = s3.head_object(Bucket=bucket, Key=key)["ETag"].strip('"')
    return ObjectRef(key=key, etag=etag, size=len(body))


def group_input(buckets: tuple[str, str], objs: list[ObjectRef], handler: str, chunk_records: int) -> ProcessGroupInput:
    src, out = buckets
    first = ProcessFileInput(
        job_id="job-test",
        bucket=src,
        obj=objs[0],
        output_bucket=out,
        output_prefix=OUT_PREFIX,
        format="auto",
        handler=handler,
        chunk_records=chunk_records,
        max_record_bytes=1024 * 1024,
    )
    return ProcessGroupInput(file=first, more=objs[1:])


def file_prefix(key: str) -> str:
    return layout.file_dir(OUT_PREFIX, key)


class Gated:
    """A passthrough chunk handler that counts the files inside it at once. A chunk that starts at record
    ``from_record`` or later (of a file whose first record passes ``only``) first waits until ``gate()``
    holds; once ``parties`` chunks wait there together, ``on_all_waiting`` is called (once)."""

    def __init__(
        self,
        gate: Callable[[], bool],
        from_record: int = 0,
        *,
        only: Callable[[dict[str, Any]], bool] = lambda value: True,
        parties: int = 0,
        on_all_waiting: Callable[[], None] | None = None,
    ) -> None:
        self.name = f"gated-{uuid.uuid4().hex[:8]}"
        self.gate, self.from_record, self.only = gate, from_record, only
        self.parties, self.on_all_waiting = parties, on_all_waiting
        self.inside = self.most_inside = self.waiting = 0
        self.lock = threading.Condition()
        register(self.name, self, replace=True)

    def open(self) -> None:
        """Wake the waiting chunks to look at ``gate()`` again."""
        with self.lock:
            self.lock.notify_all()

    def __call__(self, records: Sequence[Record]) -> HandlerResult:
        with self.lock:
            self.inside += 1
            self.most_inside = max(self.most_inside, self.inside)
            self.lock.notify_all()
        try:
            first = records[0].value if records else None
            if first is not None and int(first["id"]) >= self.from_record and self.only(first):
                with self.lock:
                    self.waiting += 1
                    if self.waiting == self.parties and self.on_all_waiting is not None:
                        self.on_all_waiting()
                    assert self.lock.wait_for(self.gate, WAIT), "the test's condition never held"
            return HandlerResult([r.value for r in records], [])
        finally:
            with self.lock:
                self.inside -= 1
                self.lock.notify_all()


class Beats:
    """The heartbeats of a group: (file index, checkpoint) in the order they were sent, and the bytes of the
    group's files finished that each reported (``done``); ``then`` is called with each."""

    def __init__(self, env: ActivityEnvironment, then: Callable[[int, Checkpoint], None] | None = None) -> None:
        self.seen: list[tuple[int, dict[str, Any]]] = []
        self.done: list[tuple[int, int]] = []
        self.lock = threading.Lock()
        self.then = then
        env.on_heartbeat = self

    def __call__(self, *details: Any) -> None:
        cp, index, done = details
        assert isinstance(cp, Checkpoint) and isinstance(index, int) and isinstance(done, int)
        with self.lock:
            self.seen.append((index, json.loads(cp.model_dump_json())))
            self.done.append((index, done))
        if self.then is not None:
            self.then(index, cp)


class Crash(Exception):
    """Stands for the worker dying right after a heartbeat."""


# ------------------------------------------------------------------------------ activity level


def test_files_of_a_group_run_at_once_and_each_is_reported_once(
    s3: Any, buckets: tuple[str, str], behind: bool
) -> None:
    # Before: a group's files ran one after the other; a handler waiting for a second file to be inside
    # it at the same time waited in vain (and failed the file).
    src, out = buckets
    objs = [upload(s3, src, f"g/{i:02d}.csv", make_csv(25 + i)) for i in range(10)]
    handler = Gated(lambda: handler.most_inside >= 2)
    env = ActivityEnvironment()
    beats = Beats(env)
    results = env.run(S3Activities(s3).process_group, group_input(buckets, objs, handler.name, chunk_records=10))
    assert [r.key for r in results] == [o.key for o in objs]
    for i, (obj, r) in enumerate(zip(objs, results, strict=True)):
        assert (r.status, r.records, r.records_written, r.chunks) == ("succeeded", 25 + i, 25 + i, 3 + i // 6), r
        assert_exactly_once(s3, out, file_prefix(obj.key), 25 + i)
        assert [cp.chunk for cp in committed_parts(s3, out, file_prefix(obj.key))] == list(range(1, r.chunks + 1))
    assert 2 <= handler.most_inside <= files.GROUP_THREADS
    # Each heartbeat's bytes of finished files (``s3batch watch``'s progress) add up the sizes of other files,
    # never the heartbeating file's own; the last files to start saw all but the ones beside them finished.
    sizes = [o.size for o in objs]
    subsets = list(itertools.product((0, 1), repeat=len(sizes)))
    others = [{sum(s for j, (s, b) in enumerate(zip(sizes, bits, strict=True)) if b and j != i) for bits in subsets}
              for i in range(len(sizes))]
    assert beats.done and all(done in others[i] for i, done in beats.done)
    assert max(done for _, done in beats.done) >= sum(sizes) - max(sizes) * files.GROUP_THREADS


def test_cancel_stops_every_file_in_flight_at_a_chunk_boundary(
    s3: Any, buckets: tuple[str, str], behind: bool
) -> None:
    # GROUP_THREADS files are in flight, each in its second chunk (its first part committed, or written
    # behind) when the job is cancelled; two more wait for a thread. Each file in flight completes the
    # chunk it is building, commits it and stops; the two never start.
    src, out = buckets
    n = files.GROUP_THREADS + 2
    objs = [upload(s3, src, f"c/{i:02d}.csv", make_csv(50)) for i in range(n)]
    env = ActivityEnvironment()
    cancelled = threading.Event()

    def cancel() -> None:
        cancelled.set()
        env.cancel()

    handler = Gated(cancelled.is_set, 10, parties=files.GROUP_THREADS, on_all_waiting=cancel)
    results = env.run(S3Activities(s3).process_group, group_input(buckets, objs, handler.name, chunk_records=10))
    assert cancelled.is_set()
    assert [r.key for r in results] == [o.key for o in objs]
    for obj, r in zip(objs[: files.GROUP_THREADS], results, strict=False):
        assert (r.status, r.records, r.records_written, r.chunks) == ("cancelled", 20, 20, 2), r
        assert [cp.next_record for cp in committed_parts(s3, out, file_prefix(obj.key))] == [10, 20]
        parts = [file_prefix(obj.key) + layout.part_name(c) for c in range(2)]
        assert list_keys(s3, out, file_prefix(obj.key)) == parts
    for obj, r in zip(objs[files.GROUP_THREADS :], results[files.GROUP_THREADS :], strict=True):
        assert (r.status, r.records, r.chunks) == ("cancelled", 0, 0), r
        assert list_keys(s3, out, file_prefix(obj.key)) == []


def test_a_failing_file_stops_the_others_and_the_retry_resumes_each_exactly_once(
    s3: Any, buckets: tuple[str, str], behind: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The attempt dies (as a worker killed mid-group would leave it) once file 0 heartbeats its second
    # part; the other files in flight wait in their third chunk until the group has seen the failure,
    # then finish that chunk and stop; the last file never starts. The next attempt gets the group's
    # last heartbeat (one file's checkpoint) and finds every other file's committed parts itself: no
    # record is written twice, none is lost.
    src, out = buckets
    n = files.GROUP_THREADS + 1
    rows = 60
    objs = [upload(s3, src, f"k/{i:02d}.csv", make_csv(rows, pad=1 if i == 0 else 0)) for i in range(n)]
    failed = threading.Event()
    handler = Gated(failed.is_set, 20, only=lambda value: value["note"] == "")
    fail = files._GroupRun._fail

    def seen_failing(run: Any, err: BaseException) -> None:
        fail(run, err)
        failed.set()
        handler.open()

    monkeypatch.setattr(files._GroupRun, "_fail", seen_failing)

    def crash_in_file_0(index: int, cp: Checkpoint) -> None:
        if index == 0 and cp.chunk == 2:
            raise Crash("worker killed after file 0 heartbeated its second part")

    env = ActivityEnvironment()
    beats = Beats(env, crash_in_file_0)
    req = group_input(buckets, objs, handler.name, chunk_records=10)
    with pytest.raises(ApplicationError) as info:
        env.run(S3Activities(s3).process_group, req)
    assert info.value.type == "Crash", info.value
    for obj in objs[1:]:
        assert len(committed_parts(s3, out, file_prefix(obj.key))) <= 3, f"{obj.key} went on after the failure"
    assert committed_parts(s3, out, file_prefix(objs[-1].key)) == []
    last_index, last_cp = beats.seen[-1]

    retry = ActivityEnvironment()
    retry.info = dataclasses.replace(retry.info, attempt=2, heartbeat_details=[last_cp, last_index])
    Beats(retry)
    results = retry.run(S3Activities(s3).process_group, req)
    assert [(r.key, r.status, r.records, r.records_written) for r in results] == [
        (o.key, "succeeded", rows, rows) for o in objs
    ]
    assert results[0].resumed_from_record == 20
    for i, obj in enumerate(objs):
        assert_exactly_once(s3, out, file_prefix(obj.key), rows, pad=1 if i == 0 else 0)


def test_the_files_of_the_groups_of_a_process_never_outnumber_its_s3_connections(
    s3: Any, buckets: tuple[str, str]
) -> None:
    # Two groups at once on a client of 3 connections: 3 of their files are in flight together, never
    # more (more would open connections that its pool drops, with a warning each).
    from s3batch.s3io import make_client

    src, _ = buckets
    small = make_client(3)
    objs = [[upload(s3, src, f"p{g}/{i:02d}.csv", make_csv(5)) for i in range(files.GROUP_THREADS)] for g in range(2)]
    handler = Gated(lambda: handler.most_inside >= 3)
    outcome: list[Any] = []

    def one_group(g: int) -> None:
        req = group_input(buckets, objs[g], handler.name, chunk_records=10)
        outcome.extend(ActivityEnvironment().run(S3Activities(small).process_group, req))

    threads = [threading.Thread(target=one_group, args=(g,)) for g in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    assert [r.status for r in outcome] == ["succeeded"] * 2 * files.GROUP_THREADS
    assert handler.most_inside == 3


# ------------------------------------------------------------------------------ a worker killed


async def test_worker_killed_mid_group_resumes_elsewhere_without_duplicates(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, tmp_path: Path
) -> None:
    # One group of 12 files of 1,000 rows, 100-row chunks at 50 ms each (slow_passthrough): several
    # files are part-way when the worker is killed; the next worker's attempt of the group resumes
    # each from its committed parts.
    from s3batch.models import S3BatchInput

    src, out = buckets
    count, rows = 12, 1_000
    for i in range(count):
        s3.put_object(Bucket=src, Key=f"in/{i:02d}.csv", Body=make_csv(rows))
    first = worker_process(task_queue, tmp_path, "a")
    second = None
    try:
        first.wait_ready()
        spec = S3BatchInput(
            bucket=src, prefix="in/", output_bucket=out, output_prefix="o/", handler="slow_passthrough",
            chunk_records=100, heartbeat_timeout_seconds=5, group_max_files=count,
        )
        handle = await start(client, task_queue, spec, "groupkill")

        def parts_of_several_files() -> bool:
            folders = {k.rsplit("/", 1)[0] for k in list_keys(s3, out, "o/in/") if "/part-" in k}
            return len(folders) >= 2

        await wait_for(parts_of_several_files, 120, "parts of 2 files written", interval=0.05)
        first.kill()
        second = worker_process(task_queue, tmp_path, "b")
        second.wait_ready()
        result = await handle.result()
    finally:
        first.stop()
        if second is not None:
            second.stop()
    assert result.status == "succeeded"
    assert result.totals.files_succeeded == count
    assert result.totals.records_written == count * rows
    for i in range(count):
        assert_exactly_once(s3, out, f"o/in/{i:02d}.csv/", rows)
    entries = report(s3, out, "o/")["files"]
    assert any(f["attempts"] >= 2 and f.get("resumed_from_record") for f in entries), "no file resumed part-way"

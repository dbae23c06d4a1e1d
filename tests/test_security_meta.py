"""Issue 19, metadata: what encryption leaves in plain text names no bucket, prefix or key
(search attributes, default workflow IDs); the continue-as-new state cannot be forged by a start;
hostile object keys (rich markup, terminal escapes, control characters) are shown escaped by the
CLI and in text logs. Against the real Temporal dev server and SeaweedFS, with real jobs."""

from __future__ import annotations

import base64
import io
import json
import logging
import os
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.worker import Worker

import tests.slow_handlers  # noqa: F401 - registers slow_passthrough (50 ms a chunk) for the in-process worker
from s3batch import search_attributes as sa
from s3batch.dev.stack import Stack
from s3batch.logs import TextFormatter, printable
from s3batch.models import S3BatchInput
from s3batch.plugin import S3BatchPlugin
from s3batch.s3io import make_client
from tests.helpers import run, wait_for
from tests.helpers.assertions import assert_invalid_input
from tests.helpers.history import history_events
from tests.helpers.workers import worker_process

KEY = os.urandom(32)
KEY_B64 = base64.b64encode(KEY).decode()


async def keyed_client(stack: Stack) -> tuple[Client, S3BatchPlugin]:
    plugin = S3BatchPlugin(make_client(), encryption_key=KEY)
    return await Client.connect(stack.config.temporal_address, plugins=[plugin]), plugin


def keyed_worker(client: Client, task_queue: str) -> Worker:
    return Worker(client, task_queue=task_queue, max_concurrent_activities=4, activity_executor=ThreadPoolExecutor(4))


async def seen_without_key(stack: Stack, workflow_id: str) -> dict[str, bytes]:
    """What a client without the key reads of a job: every event of every run (protobuf bytes: plain
    payloads and strings appear verbatim), the same as JSON, and the search attributes and memo."""
    bare = await Client.connect(stack.config.temporal_address)
    events = await history_events(bare, workflow_id)
    history = await bare.get_workflow_handle(workflow_id).fetch_history()
    info = (await bare.get_workflow_handle(workflow_id).describe()).raw_description.workflow_execution_info
    return {
        "history": b"".join(e.SerializeToString() for e in events),
        "history JSON": history.to_json().encode(),
        "search attributes": info.search_attributes.SerializeToString(),
        "memo": info.memo.SerializeToString(),
    }


def encrypted_job_files(s3: Any, src: str, tag: str) -> tuple[str, list[str]]:
    """A prefix with one failing file (a CSV header that is not UTF-8) and one good file; returns the
    prefix and the names that must not reach the server."""
    prefix = f"secret-prefix-{tag}/"
    s3.put_object(Bucket=src, Key=f"{prefix}secret-file-{tag}.csv", Body=b"\xff\xfename,city\n1,2\n")
    s3.put_object(Bucket=src, Key=f"{prefix}fine-{tag}.jsonl", Body=b'{"a": 1}\n')
    return prefix, [f"secret-prefix-{tag}", f"secret-file-{tag}", f"fine-{tag}", f"secret-out-{tag}"]


# ------------------------------------------------------------------------------ 1. metadata


def test_source_values_are_keyed_hmacs_one_per_key_of_the_keyring() -> None:
    other = os.urandom(32)
    value = sa.source_value("incoming", "customers/", [KEY])
    assert value.startswith(sa.HASHED) and len(value) == len(sa.HASHED) + 32
    assert "incoming" not in value and "customers" not in value
    assert value == sa.source_value("incoming", "customers/", [KEY, other])  # the current key hashes
    assert value != sa.source_value("incoming", "customers/", [other])
    assert value != sa.source_value("incoming", "customers", [KEY])  # exact source, not a prefix match
    assert sa.source_value("incoming", "customers/") == "incoming/customers/"  # no key: plain, as before
    assert sa.source_values("incoming", "customers/", [other, KEY]) == [
        sa.source_value("incoming", "customers/", [other]),
        value,
    ]
    assert sa.source_query("b", "p/", [KEY]) == f'S3BatchSource IN ("{sa.source_value("b", "p/", [KEY])}")'


def test_default_ids_name_no_bucket_with_a_key_and_list_source_is_an_exact_clause() -> None:
    from s3batch.cli.jobs import list_query
    from s3batch.cli.output import EXIT_BAD_INPUT, CliError
    from s3batch.client import default_workflow_id

    job = S3BatchInput(bucket="secret-bucket", prefix="p/", output_bucket="out-bucket")
    assert "secret-bucket" not in default_workflow_id(job, encrypted=True)
    assert default_workflow_id(job, encrypted=False).startswith("s3batch-secret-bucket-")  # as before
    query = list_query(running=True, source="s3://secret-bucket/p/", keys=[KEY])
    assert query.endswith(f'AND S3BatchSource IN ("{sa.source_value("secret-bucket", "p/", [KEY])}")'), query
    assert "secret-bucket" not in query
    for bad in ("no-slash", '/p/', 'b/p" OR WorkflowId != "'):  # no bucket, or a quote breaking the query
        with pytest.raises(CliError) as refused:
            list_query(running=False, source=bad, keys=[])
        assert refused.value.code == EXIT_BAD_INPUT and "BUCKET/PREFIX" in str(refused.value)


async def test_an_encrypted_job_started_by_s3batch_names_no_source_in_what_the_server_stores(
    stack: Stack, s3: Any, buckets: tuple[str, str], task_queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    src, out = buckets
    tag = uuid.uuid4().hex[:8]
    prefix, names = encrypted_job_files(s3, src, tag)
    client, plugin = await keyed_client(stack)
    # As worker.py does: the attributes are registered, so the workflow upserts its status.
    plugin.s3_activities.search_attributes_registered = await sa.ensure_registered(client)
    monkeypatch.setenv("S3BATCH_ENCRYPTION_KEY", KEY_B64)  # for the s3batch subprocesses
    async with keyed_worker(client, task_queue):
        r = await run(
            "s3batch", "start", "--bucket", src, "--prefix", prefix, "--output-bucket", out,
            "--output-prefix", f"secret-out-{tag}/", "--task-queue", task_queue, "--json", "--wait",
        )  # fmt: skip
    assert r.code == 1, r  # the job failed: one bad file
    started = json.loads(r.stdout)
    wid = started["workflow_id"]
    assert started["status"] == "failed" and "JobFailed" in started["error"], started
    assert wid.startswith("s3batch-") and src not in wid, wid

    seen = await seen_without_key(stack, wid)
    # Positive controls: the scan reads the stored search attributes and failure types.
    hashed = sa.source_value(src, prefix, [KEY])
    assert hashed.encode() in seen["search attributes"] and b"failed" in seen["search attributes"]
    assert b"JobFailed" in seen["history"] and b"BadFile" in seen["history"]
    for what, blob in seen.items():
        for name in [src, out, *names]:
            assert name.encode() not in blob, f"{name!r} in the {what} (read without the key)"

    # Still found by its source: s3batch computes the HMAC, and so does the printed query.
    async def listed_by_s3batch() -> list[str]:
        got = await run("s3batch", "list", "--source", f"{src}/{prefix}", "--json")
        assert got.code == 0, got
        return [row["workflow_id"] for row in json.loads(got.stdout)]

    assert await wait_for(listed_by_s3batch, 30, f"`s3batch list --source` to find {wid}", interval=0.5) == [wid]
    query = await run("python", "-m", "s3batch.search_attributes", "query", f"{src}/{prefix}")
    assert query.code == 0 and query.stdout.strip() == f'S3BatchSource IN ("{hashed}")', query
    assert [w.id async for w in client.list_workflows(query.stdout.strip())] == [wid]
    # Only this job (the shared server holds every test's jobs, whose long IDs would narrow the column).
    human = await run("s3batch", "list", "--source", f"{src}/{prefix}")
    [row] = [line for line in human.stdout.splitlines() if wid in line]
    assert f"hidden ({hashed[:12]}" in row and src not in row, row


async def test_an_encrypted_job_started_without_search_attributes_is_indexed_by_its_hmac(
    stack: Stack, s3: Any, buckets: tuple[str, str], task_queue: str
) -> None:
    """Started as ``temporal workflow start`` would (no search attributes) on a registering worker:
    the workflow upserts the source the worker's check computed, never the names."""
    src, out = buckets
    tag = uuid.uuid4().hex[:8]
    prefix, names = encrypted_job_files(s3, src, tag)
    client, plugin = await keyed_client(stack)
    plugin.s3_activities.search_attributes_registered = await sa.ensure_registered(client)
    wid = f"enc-plain-start-{tag}"
    async with keyed_worker(client, task_queue):
        handle = await client.start_workflow(
            "S3BatchWorkflow",
            {"bucket": src, "prefix": prefix, "output_bucket": out, "output_prefix": f"secret-out-{tag}/"},
            id=wid,
            task_queue=task_queue,
        )
        with pytest.raises(Exception, match="failed"):
            await handle.result()
    seen = await seen_without_key(stack, wid)
    assert sa.source_value(src, prefix, [KEY]).encode() in seen["search attributes"]
    for what, blob in seen.items():
        for name in [src, out, *names]:
            assert name.encode() not in blob, f"{name!r} in the {what} (read without the key)"


# ------------------------------------------------------------------------------ 7. forged state


async def test_a_forged_continue_as_new_state_fails_the_job_before_anything_runs(
    client: Client, worker: Worker, task_queue: str, buckets: tuple[str, str]
) -> None:
    src, out = buckets
    # An unknown handler too: had the forged run number skipped the check, a file activity would
    # have used the name (metrics labels) before anything validated it.
    job = {"bucket": src, "output_bucket": out, "handler": f"no-such-handler-{uuid.uuid4().hex[:6]}"}
    forged_states: list[Any] = [
        {"run": 3, "listing_done": True, "totals": {"files_listed": 1, "files_succeeded": 1}},
        {"files_per_run": 2, "indexed": True},  # the tuning knob alone is fine; with more it is not
        {"pending": [{"key": "a", "etag": "e", "size": 1}]},
        [1, 2],
        "state",
    ]
    for n, state in enumerate(forged_states):
        handle = await client.start_workflow(
            "S3BatchWorkflow", args=[job, state], id=f"forged-{n}-{uuid.uuid4().hex[:8]}", task_queue=task_queue
        )
        # Fails at once, InvalidInput naming the argument, no activity scheduled (helpers).
        message = await assert_invalid_input(client, handle.id, ["second argument", "continue-as-new"])
        assert "files_per_run" in message, message


async def test_files_per_run_alone_is_a_tuning_knob_and_real_continue_as_new_states_pass(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets: tuple[str, str]
) -> None:
    src, out = buckets
    for i in range(5):
        s3.put_object(Bucket=src, Key=f"can/{i}.jsonl", Body=b'{"a": 1}\n')
    spec = S3BatchInput(bucket=src, prefix="can/", output_bucket=out, output_prefix="o/", group_max_files=1)
    wid = f"tuned-{uuid.uuid4().hex[:8]}"
    result = await client.execute_workflow(
        "S3BatchWorkflow", args=[spec.model_dump(mode="json"), {"files_per_run": 2}], id=wid, task_queue=task_queue
    )
    assert result["status"] == "succeeded" and result["totals"]["files_succeeded"] == 5, result
    events = await history_events(client, wid)
    starts = [e for e in events if e.HasField("workflow_execution_started_event_attributes")]
    assert len(starts) == 3  # 2 + 2 + 1 files: two continue-as-new, each handing over its whole state
    assert all(s.workflow_execution_started_event_attributes.continued_execution_run_id for s in starts[1:])


# ------------------------------------------------------------------------------ 8. hostile keys

# SeaweedFS keeps control characters in keys but folds "//" into "/": no "://" in these.
HOSTILE = [
    "[/bold]closing-tag.csv",
    "[link=mailto:a@evil.example]click[/link].csv",
    "clear\x1b[2J\x1b[31mred.csv",
    "carriage\rreturn.csv",
    "bidi\u202eslx.csv",
    ":smile:[bold red]emoji.csv",
]
BAD_HOSTILE = "bad\x1b]8;;mailto:a@evil.example\x07header[/].csv"
"""Fails (a CSV header that is not UTF-8): its key and error reach the report's error column."""


def assert_shown_escaped(output: str, keys: list[str]) -> None:
    """Each key appears as typed, its unprintable characters escaped; nothing raw reaches the terminal."""
    for key in keys:
        assert printable(key) in output, f"{key!r} not shown as {printable(key)!r}:\n{output}"
    for raw in ("\x1b", "\r", "\x07", "\u202e"):
        assert raw not in output, f"{raw!r} reached the terminal:\n{output!r}"


async def test_hostile_keys_are_shown_escaped_by_report_list_status_and_watch(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets: tuple[str, str]
) -> None:
    src, out = buckets
    prefix = "h[/bold]\x1b[2J/"  # the prefix shows in `list` (S3BatchSource) and in the report
    keys = [prefix + name for name in HOSTILE]
    for key in keys:
        s3.put_object(Bucket=src, Key=key, Body=b"id,name\n" + b"".join(b"%d,n\n" % i for i in range(400)))
    s3.put_object(Bucket=src, Key=prefix + BAD_HOSTILE, Body=b"\xff\xfeid\n1\n")
    listed = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=src, Prefix=prefix)["Contents"])
    assert listed == sorted([*keys, prefix + BAD_HOSTILE])  # SeaweedFS keeps them as given

    assert await sa.ensure_registered(client)
    wid = f"hostile-{uuid.uuid4().hex[:8]}"
    # Slow (50 ms per 10-record chunk, one file at a time) so files are in flight for status/watch.
    r = await run(
        "s3batch", "start", "--bucket", src, "--prefix", prefix, "--output-bucket", out, "--output-prefix", "o/",
        "--handler", "slow_passthrough", "--chunk-records", "10", "--group-max-files", "1",
        "--max-concurrent-files", "1", "--heartbeat-timeout-seconds", "20", "--max-attempts", "1",
        "--task-queue", task_queue, "--id", wid,
    )  # fmt: skip
    assert r.code == 0, r

    async def in_flight_shown() -> Any:
        status = await run("s3batch", "status", wid)
        assert status.code == 0, status
        shown = [k for k in [*keys, prefix + BAD_HOSTILE] if printable(k) in status.stdout]
        return (status, shown) if "In-flight files" in status.stdout and shown else None

    status, shown = await wait_for(in_flight_shown, 60, f"`s3batch status {wid}` to show a file in flight", 0.3)
    assert_shown_escaped(status.stdout, shown)
    async def watched_in_flight() -> Any:
        # Files run one at a time: between two of them none is in flight, so look again until one is.
        once = await run("s3batch", "watch", wid, "--once")
        assert once.code == 0, once
        return once if "In flight" in once.stdout else None

    watch = await wait_for(watched_in_flight, 60, f"`s3batch watch {wid} --once` to show a file in flight", 0.3)
    assert "\x1b" not in watch.stdout and "\r" not in watch.stdout, watch

    follow = await run("s3batch", "watch", wid, "--interval", "0.5", timeout=180)
    assert follow.code == 1, follow  # the bad file fails the job
    assert "\x1b" not in follow.stdout + follow.stderr and "JobFailed" in follow.stderr, follow
    report = await run("s3batch", "report", wid)
    assert report.code == 1, report  # the report of a failed job
    assert_shown_escaped(report.stdout, [*keys, prefix + BAD_HOSTILE])
    [bad_row] = [line for line in report.stdout.splitlines() if "header[/].csv" in line]
    assert "failed" in bad_row, report.stdout

    async def in_list() -> Any:
        listing = await run("s3batch", "list")
        assert listing.code == 0, listing
        return [line for line in listing.stdout.splitlines() if wid in line]

    [row] = await wait_for(in_list, 30, f"`s3batch list` to show {wid}", interval=0.5)
    assert f"s3://{src}/{printable(prefix)}" in row and "\x1b" not in row, row


def test_text_logs_escape_control_characters_and_json_logs_quote_them() -> None:
    key = "in/a\nFAKE ERROR line\x1b[2J\r.csv"
    record = logging.LogRecord("s3batch", logging.INFO, __file__, 1, "finished s3://b/%s", (key,), None)
    text = TextFormatter().format(record)
    assert "\n" not in text and "\x1b" not in text and "\r" not in text
    assert text.endswith("finished s3://b/in/a\\nFAKE ERROR line\\x1b[2J\\r.csv"), text


async def test_a_worker_logs_a_hostile_key_on_one_escaped_line(
    client: Client, s3: Any, buckets: tuple[str, str], task_queue: str, tmp_path: Path
) -> None:
    src, out = buckets
    key = "logs/evil\nFAKE 2026-01-01 ERROR forged line\x1b[2J.jsonl"
    s3.put_object(Bucket=src, Key=key, Body=b'{"a": 1}\n')
    worker = worker_process(task_queue, tmp_path, "hostile-log", S3BATCH_LOG_FORMAT="text")
    try:
        worker.wait_ready()
        await client.execute_workflow(
            "S3BatchWorkflow",
            {"bucket": src, "prefix": "logs/", "output_bucket": out},
            id=f"hostile-log-{uuid.uuid4().hex[:8]}",
            task_queue=task_queue,
        )
    finally:
        worker.terminate()
    log = worker.log()
    assert printable(key) in log, log  # the finished-file line names the key, escaped
    assert "\x1b" not in log
    assert not [line for line in log.splitlines() if line.startswith("FAKE")], log


def test_printable_escapes_what_a_terminal_acts_on_and_keeps_the_rest() -> None:
    assert printable("plain/key-ü-名.csv") == "plain/key-ü-名.csv"
    assert printable("a\x1b[2Jb\x07c\x9bd\u202ee\u200bf") == "a\\x1b[2Jb\\x07c\\x9bd\\u202ee\\u200bf"
    buffer = io.StringIO()
    from rich.console import Console

    from s3batch.cli.output import cell, safe_line

    console = Console(file=buffer, width=200, color_system=None, emoji=False)
    console.print(safe_line(("[/bold]", "bold"), " [link=x]y[/link] :smile:"))
    console.print(cell("[/]\\"))
    assert buffer.getvalue() == "[/bold] [link=x]y[/link] :smile:\n[/]\\\n"

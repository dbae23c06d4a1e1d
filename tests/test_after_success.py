"""``after_success`` (issue 35): each file that succeeded is archived, deleted or tagged once its output is
committed, exactly the version processed; a file that failed, or changed after it was processed, is left in
place and the report says why; a worker killed between the copy and the delete archives once on retry; on a
versioned and an unversioned bucket, on the real S3 server."""

from __future__ import annotations

import json
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import boto3
import pytest
from pydantic import ValidationError
from s3batch.activities import after_success as archiving
from temporalio.client import Client, WorkflowFailureError
from temporalio.worker import Worker

from s3batch.after_success import COPY_OF_METADATA
from s3batch.cli import build_parser, run
from s3batch.cli.render import totals_lines
from s3batch.cli.start import job_from_args
from s3batch.client import prepare_redrive
from s3batch.dev.faultproxy import FaultProxy, Rule
from s3batch.dev.stack import Stack, ensure_buckets
from s3batch.formats.common import Record
from s3batch.handlers import HandlerResult, chunk_context, chunk_handler
from s3batch.messages import Totals
from s3batch.models import S3BatchInput
from s3batch.plugin import S3BatchPlugin
from s3batch.s3io import make_client
from tests.helpers import wait_for
from tests.helpers.jobs import execute, start
from tests.helpers.output import report
from tests.helpers.workers import worker_process

ROWS = b'{"id": 1}\n{"id": 2}\n'
BAD = b"not json\nnor this\n"
"""Every record rejected: the file fails (TooManyRejects), and stays where it is."""
NEW = b'{"id": 9, "new": true}\n'


@chunk_handler("overwrite_own_source")
def overwrite_own_source(records: Sequence[Record]) -> HandlerResult:
    """A passthrough that overwrites its file's source while handling it when a record says ``overwrite``: the
    file succeeds (its one read is done) with a newer version in place before its ``after_success``."""
    if any(isinstance(r.value, dict) and r.value.get("overwrite") for r in records):
        ctx = chunk_context()
        make_client().put_object(Bucket=ctx.bucket, Key=ctx.key, Body=NEW)
    return HandlerResult([r.value for r in records], [])


def _job(src: str, out: str, after: dict[str, Any], **kw: Any) -> S3BatchInput:
    options: dict[str, Any] = {
        "bucket": src,
        "prefix": "in/",
        "output_bucket": out,
        "output_prefix": "o/",
        "after_success": after,
        "max_failed_files": 5,
        "max_attempts": 2,
        "heartbeat_timeout_seconds": 3,
    }
    return S3BatchInput.model_validate({**options, **kw})


def _versions(s3: Any, bucket: str, key: str) -> list[str]:
    listed = s3.list_object_versions(Bucket=bucket, Prefix=key)
    return [v["VersionId"] for v in listed.get("Versions", []) if v["Key"] == key]


def _body(s3: Any, bucket: str, key: str) -> bytes | None:
    try:
        return s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    except s3.exceptions.NoSuchKey:
        return None


def _tags(s3: Any, bucket: str, key: str) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in s3.get_object_tagging(Bucket=bucket, Key=key)["TagSet"]}


# ------------------------------------------------------------------ the option


def test_the_option_is_strict_json_a_flag_and_a_schedule_option() -> None:
    base = {"bucket": "src-bkt", "prefix": "in/", "output_bucket": "out-bkt"}
    for after in ({"action": "archive", "prefix": "d/"}, {"action": "delete"}, {"action": "tag", "tags": {"a": "b"}}):
        job = S3BatchInput.model_validate_json(json.dumps({**base, "after_success": after}))
        expected = {"bucket": None, **after} if after["action"] == "archive" else after
        assert job.model_dump(mode="json")["after_success"] == expected
    assert "after_success" not in S3BatchInput.model_validate(base).model_dump(mode="json")  # left out unset
    for bad, says in (
        ({"action": "move"}, "action"),
        ({"action": "delete", "force": True}, "force"),
        ({"action": "tag", "tags": {}}, "tags"),
        ({"action": "tag", "tags": {f"k{i}": "v" for i in range(11)}}, "tags"),
        ({"action": "archive", "prefix": "in/done/"}, "lies under the source prefix"),
        ({"action": "archive", "bucket": "out-bkt", "prefix": ""}, "prefix"),
        ({"action": "archive", "bucket": "out-bkt", "prefix": "x/"}, "overlaps the output prefix"),
    ):
        with pytest.raises(ValidationError, match=says):
            S3BatchInput.model_validate({**base, "after_success": bad})
    flag = ["--bucket", "src-bkt", "--prefix", "in/", "--output-bucket", "out-bkt", "--output-prefix", "o/",
            "--after-success", '{"action": "archive", "bucket": "out-bkt", "prefix": "done/"}']  # fmt: skip
    job = job_from_args(build_parser().parse_args(["start", *flag]))
    assert job.after_success is not None and job.after_success.action == "archive"
    scheduled = job_from_args(build_parser().parse_args(["schedule", "create", "nightly", "--every", "1h", *flag]))
    assert scheduled.after_success == job.after_success


def test_the_dry_run_lists_what_would_be_moved(s3: Any, buckets: tuple[str, str], capsys: Any) -> None:
    src, out = buckets
    for key in ("in/a.jsonl", "in/sub/b.jsonl", "other/c.jsonl"):
        s3.put_object(Bucket=src, Key=key, Body=ROWS)
    after = json.dumps({"action": "archive", "bucket": out, "prefix": "done/"})
    args = ["start", "--bucket", src, "--prefix", "in/", "--output-bucket", out, "--output-prefix", "o/",
            "--after-success", after, "--dry-run"]  # fmt: skip
    assert run([*args, "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert [(f["key"], f["then"]) for f in planned["files"]] == [
        ("in/a.jsonl", f"archive to s3://{out}/done/a.jsonl"),
        ("in/sub/b.jsonl", f"archive to s3://{out}/done/sub/b.jsonl"),
    ]
    assert run(args) == 0
    text = capsys.readouterr().out
    assert "nothing started" in text and f"then: archive to s3://{out}/done/sub/b.jsonl" in text
    assert _body(s3, src, "in/a.jsonl") == ROWS and not s3.list_objects_v2(Bucket=out, Prefix="done/").get("Contents")


def test_the_summary_counts_what_became_of_the_sources() -> None:
    totals = Totals(files_listed=4, files_succeeded=3, files_failed=1, after_success={"archived": 2, "skipped": 1})
    assert totals_lines(totals)[2] == "sources  2 archived, 1 skipped after success"
    assert len(totals_lines(Totals(files_listed=1, files_succeeded=1))) == 2  # a job without the option
    assert "after_success" not in Totals().model_dump(mode="json")


IAM = Path(__file__).resolve().parents[1] / "deploy" / "iam"
TAGGING = {"s3:GetObjectTagging", "s3:GetObjectVersionTagging"}


@pytest.mark.parametrize(
    ("action", "granted"),
    [
        ("delete", {"SOURCE": {"s3:DeleteObject", "s3:DeleteObjectVersion"}}),
        ("tag", {"SOURCE": TAGGING | {"s3:PutObjectTagging", "s3:PutObjectVersionTagging"}}),
        (
            "archive",
            {
                "SOURCE": {"s3:DeleteObject", "s3:DeleteObjectVersion"} | TAGGING,
                "ARCHIVE": {"s3:PutObject", "s3:GetObject", "s3:PutObjectTagging"},
                "ARCHIVE-BUCKET": {"s3:ListBucket"},
            },
        ),
    ],
)
def test_each_action_adds_only_its_permissions(action: str, granted: dict[str, set[str]]) -> None:
    policy = json.loads((IAM / f"after-success-{action}.json").read_text())
    found: dict[str, set[str]] = {}
    for statement in policy["Statement"]:
        assert statement["Effect"] == "Allow"
        assert statement["Condition"]["StringEquals"] == {"s3:ResourceAccount": "ACCOUNT-ID"}, statement
        resource = statement["Resource"].removeprefix("arn:aws:s3:::")
        if statement["Action"] == ["s3:ListBucket"]:
            assert statement["Condition"]["StringLike"] == {"s3:prefix": [f"{resource.split('-')[0]}-PREFIX/*"]}
        else:
            kind = resource.split("-")[0]
            assert resource == f"{kind}-BUCKET/{kind}-PREFIX/*", resource
            resource = kind
        found.setdefault(resource, set()).update(statement["Action"])
    assert found == granted


# ------------------------------------------------------------------ each action, on both kinds of bucket

ACTIONS = {
    "archive": {"action": "archive", "prefix": "archive/"},
    "delete": {"action": "delete"},
    "tag": {"action": "tag", "tags": {"s3batch": "done"}},
}


@pytest.mark.parametrize("versioned", [False, True], ids=["unversioned", "versioned"])
@pytest.mark.parametrize("action", list(ACTIONS))
async def test_each_file_that_succeeded_and_only_that_version(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets: tuple[str, str], action: str, versioned: bool
) -> None:
    src, out = buckets
    if versioned:
        s3.put_bucket_versioning(Bucket=src, VersioningConfiguration={"Status": "Enabled"})
    put = {}
    for key, body in (("in/a.jsonl", ROWS), ("in/sub/b.jsonl", ROWS), ("in/bad.jsonl", BAD),
                      ("in/moved.jsonl", b'{"id": 3, "overwrite": true}\n')):  # fmt: skip
        put[key] = s3.put_object(Bucket=src, Key=key, Body=body, Tagging="kept=yes")
    after = dict(ACTIONS[action], **({"bucket": out} if action == "archive" and not versioned else {}))
    result = await execute(client, task_queue, _job(src, out, after, handler="overwrite_own_source"), "after")
    done = {"archive": "archived", "delete": "deleted", "tag": "tagged"}[action]
    assert result.totals.files_succeeded == 3 and result.totals.files_failed == 1
    assert result.totals.after_success == {done: 2, "skipped": 1}
    files = {f["key"]: f for f in report(s3, out)["files"]}
    assert "after_success" not in files["in/bad.jsonl"] and files["in/bad.jsonl"]["status"] == "failed"
    skipped = files["in/moved.jsonl"]["after_success"]
    assert skipped["done"] == "skipped" and "changed after it was processed" in skipped["reason"], skipped
    # Left in place: the file that failed as it was, the one overwritten with its new version (untouched).
    assert _body(s3, src, "in/bad.jsonl") == BAD and _body(s3, src, "in/moved.jsonl") == NEW
    assert "s3batch" not in _tags(s3, src, "in/bad.jsonl") and _tags(s3, src, "in/moved.jsonl") == {}
    archive = out if action == "archive" and not versioned else src
    for key in ("in/a.jsonl", "in/sub/b.jsonl"):
        entry = files[key]["after_success"]
        assert entry["done"] == done, entry
        if versioned:
            assert files[key]["version_id"] == put[key]["VersionId"]
        if action == "tag":
            assert _tags(s3, src, key) == {"kept": "yes", "s3batch": "done"} and _body(s3, src, key) == ROWS
            continue
        assert _body(s3, src, key) is None
        if versioned:
            assert _versions(s3, src, key) == []  # that version deleted, no delete marker left
        if action == "archive":
            copy = "archive/" + key.removeprefix("in/")
            assert entry["to"] == f"s3://{archive}/{copy}"
            assert _body(s3, archive, copy) == ROWS
            marker = s3.head_object(Bucket=archive, Key=copy)["Metadata"][COPY_OF_METADATA]
            assert marker.split()[0] == put[key]["ETag"].strip('"')
    if action == "archive":
        assert sorted(o["Key"] for o in s3.list_objects_v2(Bucket=archive, Prefix="archive/")["Contents"]) == [
            "archive/a.jsonl", "archive/sub/b.jsonl"
        ]  # fmt: skip
        if not versioned:  # a redrive takes the failed file only: nothing is archived twice
            s3.put_object(Bucket=src, Key="in/bad.jsonl", Body=ROWS)
            plan = await prepare_redrive(client, report(s3, out)["job_id"])
            again = await execute(client, task_queue, plan.job, "redrive")
            assert again.totals.files_listed == 1 and again.totals.after_success == {"archived": 1}
            assert len(s3.list_objects_v2(Bucket=archive, Prefix="archive/")["Contents"]) == 3


async def test_a_file_in_splits_is_acted_on_once_when_all_its_splits_succeeded(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets: tuple[str, str]
) -> None:
    src, out = buckets
    body = b"".join(b'{"id": %d, "pad": "%s"}\n' % (i, b"x" * 80) for i in range(3_000))
    s3.put_object(Bucket=src, Key="in/big.jsonl", Body=body)
    job = _job(src, out, {"action": "delete"}, split_bytes=100_000, max_concurrent_files=3)
    result = await execute(client, task_queue, job, "splits")
    assert result.totals.records_written == 3_000 and result.totals.after_success == {"deleted": 1}
    [entry] = report(s3, out)["files"]
    assert entry["splits"] == 3 and entry["after_success"] == {"done": "deleted"}
    assert _body(s3, src, "in/big.jsonl") is None


async def test_an_incremental_job_keeps_archived_files_as_processed(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets: tuple[str, str]
) -> None:
    src, out = buckets
    for key in ("in/a.jsonl", "in/b.jsonl"):
        s3.put_object(Bucket=src, Key=key, Body=ROWS)
    job = _job(src, out, {"action": "archive", "bucket": out, "prefix": "archive/"}, incremental={})
    first = await execute(client, task_queue, job, "incr")
    assert first.totals.after_success == {"archived": 2}
    ledger = json.loads(_body(s3, out, "o/ledger/ledger.json") or b"{}")
    assert sorted(ledger["near"]) == ["in/a.jsonl", "in/b.jsonl"] and ledger["retry"] == {}
    assert ledger["runs"][-1]["succeeded"] == 2
    second = await execute(client, task_queue, job, "incr")
    assert second.totals.files_listed == 0 and second.totals.after_success is None


# ------------------------------------------------------------------ a worker killed between copy and delete


async def test_a_worker_killed_between_copy_and_delete_archives_once(
    client: Client, stack: Stack, task_queue: str, s3: Any, buckets: tuple[str, str], tmp_path: Path
) -> None:
    """Two jobs at once, over a versioned and an unversioned bucket: one kill between their copies and deletes.
    The archive bucket is versioned: a second copy would be a second version."""
    plain, out = buckets
    versioned, archive = plain.replace("src-", "ver-"), plain.replace("src-", "arc-")
    ensure_buckets(s3, versioned, archive)
    for bucket in (versioned, archive):
        s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    keys = ["in/a.jsonl", "in/b.jsonl"]
    for src in (plain, versioned):
        for key in keys:
            s3.put_object(Bucket=src, Key=key, Body=ROWS)
    into = {src: {"action": "archive", "bucket": archive, "prefix": f"{src}/"} for src in (plain, versioned)}
    jobs = {src: _job(src, out, after, output_prefix=f"o/{src}/") for src, after in into.items()}
    with FaultProxy(stack.config.s3_port) as proxy:
        # The deletes of the sources fail (S3 slowing down) until the worker is killed: its copies are done.
        proxy.add(Rule("503", method="DELETE", path=rf"^/({plain}|{versioned})/in/"))
        first = worker_process(task_queue, tmp_path, "first", AWS_ENDPOINT_URL_S3=proxy.url).wait_ready()
        try:
            handles = [await start(client, task_queue, job, "killed") for job in jobs.values()]

            def both_deleting() -> bool:
                return all(proxy.entries(method="DELETE", path=rf"^/{src}/in/") for src in jobs)

            await wait_for(both_deleting, 60, "a delete after the first copy of each job", alive=[first])
            first.kill()
        finally:
            first.stop()
    copied = {src: [k for k in keys if _versions(s3, archive, f"{src}/{k[3:]}")] for src in jobs}
    assert all(copied.values()), copied  # each job's first copy was made before the kill
    async with Worker(client, task_queue=task_queue, activity_executor=ThreadPoolExecutor(4)):
        results = [await handle.result() for handle in handles]
    for src, result in zip(jobs, results, strict=True):
        assert result.totals.after_success == {"archived": 2}, result.totals
        files = {f["key"]: f for f in report(s3, out, f"o/{src}/")["files"]}
        for key in keys:
            copy = f"{src}/{key[3:]}"
            assert len(_versions(s3, archive, copy)) == 1, copy  # copied once: the retry found the copy by its marker
            assert files[key]["after_success"] == {"done": "archived", "to": f"s3://{archive}/{copy}"}
            assert _body(s3, src, key) is None and _body(s3, archive, copy) == ROWS
            assert _versions(s3, src, key) == []  # on the versioned bucket: that version deleted, no marker left


async def test_a_cancel_while_files_are_archived_waits_for_their_archive(
    client: Client, stack: Stack, task_queue: str, s3: Any, buckets: tuple[str, str]
) -> None:
    """The job is cancelled while its file's copy is held (a slow S3): the action is not cut in the middle, and
    the report says the file was archived."""
    src, out = buckets
    s3.put_object(Bucket=src, Key="in/a.jsonl", Body=ROWS)
    job = _job(src, out, {"action": "archive", "bucket": out, "prefix": "archive/"})
    with FaultProxy(stack.config.s3_port) as proxy:
        held = proxy.add(Rule("delay", method="PUT", path=rf"^/{out}/archive/", delay=2.0))
        s3_via_proxy = boto3.session.Session().client("s3", endpoint_url=proxy.url)
        proxied = await Client.connect(stack.config.temporal_address, plugins=[S3BatchPlugin(s3_via_proxy)])
        async with Worker(proxied, task_queue=task_queue, activity_executor=ThreadPoolExecutor(4)):
            handle = await start(client, task_queue, job, "cancel-archive")
            await wait_for(lambda: held.matched, 30, "the copy to the archive")
            await handle.cancel()
            with pytest.raises(WorkflowFailureError):
                await handle.result()
    rep = report(s3, out)
    assert rep["status"] == "cancelled" and rep["totals"]["after_success"] == {"archived": 1}
    [entry] = rep["files"]
    assert entry["status"] == "succeeded" and entry["after_success"]["done"] == "archived", entry
    assert _body(s3, src, "in/a.jsonl") is None and _body(s3, out, "archive/a.jsonl") == ROWS


async def test_a_file_over_the_copy_limit_is_archived_in_parts(
    client: Client, worker: Worker, task_queue: str, s3: Any, buckets: tuple[str, str], monkeypatch: Any
) -> None:
    """Over 5 GiB, one CopyObject cannot copy a file: it is copied in parts (here over 1 MiB, 2 parts of 8 MiB)."""
    monkeypatch.setattr(archiving, "COPY_OBJECT_LIMIT", 1024 * 1024)
    src, out = buckets
    body = b"".join(b'{"id": %d, "pad": "%s"}\n' % (i, b"x" * 100) for i in range(80_000))
    assert len(body) > 8 * 1024 * 1024
    s3.put_object(Bucket=src, Key="in/big.jsonl", Body=body, ContentType="application/x-ndjson", Metadata={"m": "1"})
    job = _job(src, out, {"action": "archive", "bucket": out, "prefix": "archive/"}, chunk_records=100_000)
    result = await execute(client, task_queue, job, "parts")
    assert result.totals.after_success == {"archived": 1}
    head = s3.head_object(Bucket=out, Key="archive/big.jsonl")
    assert head["ETag"].endswith('-2"'), head["ETag"]  # a multipart copy
    assert head["ContentType"] == "application/x-ndjson" and head["Metadata"]["m"] == "1"
    assert COPY_OF_METADATA in head["Metadata"]
    assert _body(s3, out, "archive/big.jsonl") == body and _body(s3, src, "in/big.jsonl") is None

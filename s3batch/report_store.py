"""The job report on S3: assembled from the runs' segments with its books checked, written as a stream, read back.

A job writes ``{output_prefix}_report.json`` when it ends (its model: :mod:`s3batch.report`). Runs before a
continue-as-new flush their files' results as report segments (JSON lines under ``{output_prefix}_s3batch/``),
which the final report gathers. Everything that writes or reads a report goes through this module: the
``write_report`` activity, a redrive's listing (``only_failed_of``) and the client.

Big jobs: the report stays one JSON document whatever the number of files (the same key, the same
bytes as for a small job), written as a stream: :func:`final_report` goes over the segments twice,
first to check the books (counts and the key digest: constant memory), then to write the document
file by file (:meth:`FinalReport.chunks`) into a multipart upload (:func:`put_report`), so the writer
holds one segment (one run's results) and one upload part, never the job's files. One document, not
a manifest of per-segment files (Step Functions' ResultWriter), because everything that reads a
report reads that one object: ``s3batch report``, a redrive (which copies it and lists its failed
files), the output-ownership check, the incremental ledger, and users' own tools (``jq``); a manifest
would have made every one of them, and every report already written, a second format to read. Its
cost: the segments are read twice, and a reader of a million-file report parses a big document.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import uuid
from collections.abc import Callable, Iterable, Iterator
from json.encoder import encode_basestring_ascii
from typing import TYPE_CHECKING, Any

import orjson
from botocore.exceptions import BotoCoreError, ClientError

from s3batch import layout
from s3batch.accounting import combine, key_digest
from s3batch.errors import S3Error
from s3batch.messages import FileResult, FinalReportInput
from s3batch.report import JobReport, ReportFile, parse_report, redrive_plan
from s3batch.s3io import error_code, raise_s3_error

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import CompletedPartTypeDef


def read_report(s3: S3Client, bucket: str, key: str, *, action: str = "reading the job report") -> JobReport:
    """The job report at ``s3://bucket/key``.

    Raises:
        NotFound: There is none (and the other errors of ``s3batch.s3io.raise_s3_error``).
        InvalidInput: The object is not a job report.
    """
    return fetch_report(s3, bucket, key, action=action)[0]


def fetch_report(
    s3: S3Client, bucket: str, key: str, *, action: str = "reading the job report"
) -> tuple[JobReport, str]:
    """The job report at ``s3://bucket/key`` and its ETag (for a copy conditional on it), raising
    like :func:`read_report`."""
    found = _get(s3, bucket, key, action, missing_ok=False)
    assert found is not None
    return found


def find_report(s3: S3Client, bucket: str, key: str) -> tuple[JobReport, str] | None:
    """Like :func:`fetch_report`, but None where there is no such object (yet): the job has not ended."""
    return _get(s3, bucket, key, "reading the job report", missing_ok=True)


def _get(s3: S3Client, bucket: str, key: str, action: str, *, missing_ok: bool) -> tuple[JobReport, str] | None:
    try:
        response = s3.get_object(Bucket=bucket, Key=key)
        body = response["Body"].read()
    except ClientError as err:
        if missing_ok and error_code(err) == "NoSuchKey":
            return None
        raise_s3_error(err, action, bucket, key)
    except BotoCoreError as err:
        raise_s3_error(err, action, bucket, key)
    return parse_report(body, f"s3://{bucket}/{key}"), response["ETag"]


def segment_body(files: list[FileResult]) -> bytes:
    """A report segment: the results of one workflow run, one JSON line each."""
    return b"".join(orjson.dumps(f.model_dump(mode="json")) + b"\n" for f in files)


def read_segment(s3: S3Client, bucket: str, key: str) -> list[dict[str, Any]]:
    """The file results of the report segment at ``s3://bucket/key`` (one run's: a few thousand at most)."""
    try:
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    except (ClientError, BotoCoreError) as err:
        raise_s3_error(err, "reading report segment", bucket, key)
    return [orjson.loads(line) for line in body.splitlines() if line]


Entries = Callable[[], Iterable[dict[str, Any]]]
"""The file results of a report, in order, as a function that yields them afresh at each call (the
writer goes over them twice: once to check the books, once to write)."""


class _Books:
    """The report's books, counted while its files stream past (constant memory: counts and the digest)."""

    def __init__(self) -> None:
        self.files = 0
        self.statuses: dict[str, int] = {}
        self.digest = 0

    def add(self, entry: dict[str, Any]) -> None:
        self.files += 1
        status = str(entry.get("status"))
        self.statuses[status] = self.statuses.get(status, 0) + 1
        self.digest += key_digest([str(entry.get("key"))])

    def problems(self, entries: Entries, totals: dict[str, int], listed_digest: int | None) -> list[str]:
        """What is wrong with the report's files given the job's totals (empty when the books agree):
        every listed key in the report exactly once, the per-status counts equal to the totals."""
        problems: list[str] = []
        if self.files != totals.get("files_listed"):
            problems.append(f"the report lists {self.files} files, but the job listed {totals.get('files_listed')}")
        counts = []
        for status in ("succeeded", "failed", "cancelled", "not_started"):
            counted, said = self.statuses.get(status, 0), totals.get(f"files_{status}")
            if counted != said:
                counts.append(f"the report has {counted} {status} files, the totals say {said}")
        digest_off = listed_digest is not None and self.digest % 2**63 != listed_digest
        if problems or counts or digest_off or listed_digest is None:
            # A repeated key changes the count or the digest, so with a digest the books already fail:
            # only then (or for a job started before digests) are the keys gone over again, to say how
            # many repeat. That pass holds the set of keys; the one that checks the books holds none.
            repeated = self.files - len({str(e.get("key")) for e in entries()})
            if repeated:
                problems.append(f"{repeated} key(s) appear more than once in the report")
        problems.extend(counts)
        if digest_off:
            problems.append("the report's keys are not the keys the job listed")
        return problems


class FinalReport:
    """The final report of a job, ready to be written: its summary (the whole report but its files)
    and the file results, streamed from their segments into the JSON document (see :meth:`chunks`)."""

    def __init__(self, summary: dict[str, Any], entries: Entries, books: _Books) -> None:
        self.summary = summary
        """The report's JSON object without ``files`` (in the order of :class:`JobReport`'s fields)."""
        self.entries = entries
        self._books = books

    @property
    def head(self) -> JobReport:
        """The report with an empty ``files`` list: status, totals, listing, accounting errors."""
        return JobReport.model_validate({**self.summary, "files": []})

    def chunks(self) -> Iterator[bytes]:
        """The report's JSON, piece by piece: the same bytes as ``JobReport.to_json`` of the whole
        report, with at most one file's JSON in memory at a time.

        Raises:
            S3Error: The files read now are not those whose books were checked (a segment changed
                in between): before the last piece, so the report is not completed; a retry reads
                them again.
        """
        marker = f"s3batch-files-{uuid.uuid4().hex}"
        document = self.head.model_dump(mode="json", exclude_unset=True)
        document["files"] = [marker]
        before, after = json.dumps(document, indent=1).split(json.dumps(marker))
        # ``before`` ends with the list's "[\n  ", ``after`` starts with its "\n ]": a JSON string never
        # holds a raw line break, so re-indenting each file's own indent=1 JSON by two spaces is exact.
        first = True
        books = _Books()
        for entry in self.entries():
            books.add(entry)
            item = ReportFile.model_validate(entry).model_dump(mode="json", exclude_unset=True)
            if item.get("rejected"):  # where its rejects files are
                item.setdefault("rejects_prefix", layout.rejects_uri(self.summary["output"], item["key"]))
            yield (before.encode() if first else b",\n  ") + _file_json(item).encode()
            first = False
        if first:  # no file: "files": []
            yield before[: -len("\n  ")].encode()
            after = after[len("\n ") :]
        if (books.files, books.statuses, books.digest) != (self._books.files, self._books.statuses, self._books.digest):
            raise S3Error(
                f"the report segments under {self.summary['output']} changed while the report was written (their "
                "files differ from those counted a moment before); the report was not written, a retry reads them again"
            )
        yield after.encode()


def _file_json(item: dict[str, Any]) -> str:
    """``json.dumps(item, indent=1)`` as it appears in the report's ``files`` list (indented by two
    more spaces), about three times faster for the flat values of a file's result."""
    fields = []
    for name, value in item.items():
        if isinstance(value, str):
            text = encode_basestring_ascii(value)
        elif value is None or isinstance(value, bool):
            text = json.dumps(value)
        elif type(value) is int:
            text = int.__repr__(value)
        else:  # a float, the reject reasons, the warnings: rare
            text = json.dumps(value, indent=1).replace("\n", "\n   ")
        fields.append(f"   {encode_basestring_ascii(name)}: {text}")
    return "{\n" + ",\n".join(fields) + "\n  }" if fields else "{}"


def final_report(req: FinalReportInput, segments: Entries, redriven: JobReport | None = None) -> FinalReport:
    """The final report of the job of ``req``: the files of its segments, then those of its last run,
    with its books checked (``accounting_errors`` and status ``failed`` when they do not add up).

    Args:
        req: What the workflow knows at the end.
        segments: The file results flushed by earlier runs, in order (read afresh at each call).
        redriven: The report this job redrives (``only_failed_of``, else ``rejected_of``), needed only when the
            job was cancelled before its listing ended.
    """
    job = req.job
    totals = req.totals.model_dump(mode="json")
    digest = req.listed_digest
    listing: dict[str, Any] = {
        "done": req.listing_done,
        "continuation_token": req.continuation_token,
        "last_listed_key": req.last_listed_key,
    }
    unlisted: list[str] = []
    if redriven is not None and not req.listing_done:
        # A redrive cancelled before it listed all it had to redrive: the rest of the redriven
        # report becomes this report's never-started files, and its listing goes on where that
        # report's did, so a redrive of this job picks up exactly what is left.
        keys, rest = redrive_plan(redriven, job.prefix, rejected=not job.only_failed_of)
        token = req.continuation_token or "0"
        unlisted, rest = ([], token[3:]) if token.startswith("s3:") else (keys[int(token) :], rest)
        totals["files_listed"] += len(unlisted)
        totals["files_not_started"] += len(unlisted)
        if digest is not None:
            digest = combine(digest, key_digest(unlisted))
        listing = {"done": rest is None, "continuation_token": rest, "last_listed_key": req.last_listed_key}

    def entries() -> Iterator[dict[str, Any]]:
        yield from segments()
        yield from (f.model_dump(mode="json") for f in req.files)
        yield from (FileResult.not_started(key).model_dump(mode="json") for key in unlisted)

    summary: dict[str, Any] = {
        "job_id": req.job_id,
        "status": req.status,
        "finished_at": datetime.datetime.now(datetime.UTC).isoformat(),
        "source": f"s3://{job.bucket}/{job.prefix}",
        "output": f"s3://{job.output_bucket}/{job.output_prefix}",
        "input": job.model_dump(mode="json"),
        "totals": totals,
        "listing": listing,
    }
    if not totals["files_listed"] and listing["done"]:
        # A prefix that matches nothing is most often a typo: said in the report, not only by the CLI.
        summary["warnings"] = [f"no file matched {summary['source']}: nothing was processed (check the prefix)"]
    books = _Books()
    for entry in entries():
        books.add(entry)
    problems = books.problems(entries, totals, digest)
    if problems:
        summary["status"] = "failed"
        summary["accounting_errors"] = problems
    return FinalReport(summary, entries, books)


def assemble_report(
    req: FinalReportInput, segment_files: list[dict[str, Any]], redriven: JobReport | None = None
) -> JobReport:
    """The final report of :func:`final_report`, whole in memory (for a few files: tests, tools)."""
    report = final_report(req, lambda: segment_files, redriven)
    return parse_report(b"".join(report.chunks()), f"the report of job {req.job_id}")


PART_BYTES = 8 * 1024 * 1024
"""Size of the parts of a report written as a multipart upload (S3's smallest part is 5 MiB)."""


def put_report(
    s3: S3Client, bucket: str, key: str, chunks: Iterable[bytes], params: dict[str, Any], part_bytes: int = PART_BYTES
) -> None:
    """Write the report ``chunks`` to ``s3://bucket/key``: one PUT when it fits in one part, else a
    multipart upload holding one part in memory at a time (aborted when a part fails).

    ``params``: more arguments of the PUT (server-side encryption).
    """
    pending: list[bytes] = []
    held = 0
    upload_id: str | None = None
    parts: list[CompletedPartTypeDef] = []
    try:
        for chunk in chunks:
            pending.append(chunk)
            held += len(chunk)
            if held >= part_bytes:
                if upload_id is None:
                    upload_id = s3.create_multipart_upload(
                        Bucket=bucket, Key=key, ContentType="application/json", **params
                    )["UploadId"]
                body = b"".join(pending)
                pending.clear()
                held = 0
                number = len(parts) + 1
                etag = s3.upload_part(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=body)["ETag"]
                parts.append({"PartNumber": number, "ETag": etag})
        body = b"".join(pending)
        if upload_id is None:
            s3.put_object(Bucket=bucket, Key=key, Body=body, ContentType="application/json", **params)
            return
        if body or not parts:
            number = len(parts) + 1
            etag = s3.upload_part(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=body)["ETag"]
            parts.append({"PartNumber": number, "ETag": etag})
        s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts})
    except BaseException as err:  # the chunks' own errors and a cancellation too: no upload left open
        if upload_id is not None:
            with contextlib.suppress(ClientError, BotoCoreError):
                s3.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
        if isinstance(err, ClientError | BotoCoreError):
            raise_s3_error(err, "writing", bucket, key)
        raise

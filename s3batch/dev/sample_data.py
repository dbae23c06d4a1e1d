"""Deterministic sample data for the demo, the benchmark and the tests.

Every generator is seeded and yields ``bytes`` chunks, so a 100 MB file can be generated and uploaded
as a stream without ever being held in memory::

    s3 = s3batch.dev.stack.s3_client(config)
    samples = upload_samples(s3, "incoming", "demo/", rows=200_000)
    for sample in samples:
        print(sample.key, sample.records, sample.parse_rejects)

The same arguments always give the same bytes (hence the same ETags), and each :class:`Sample` says
how many records a job will read from it and how many of them are malformed, so a test can assert
exact counts.
"""

from __future__ import annotations

import csv
import datetime
import io
import random
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson
from boto3.s3.transfer import TransferConfig

CUSTOMER_COLUMNS = ("customer_id", "email", "name", "country", "amount", "created_at")
"""Header of the customers CSV; the columns of ``s3batch.handlers.Customer``."""

_BATCH_ROWS = 2_000
"""Rows rendered per yielded chunk: big enough to be fast, small enough to stay a few hundred KB."""

_FIRST = ("Ada", "Alan", "Grace", "Linus", "Margaret", "Dennis", "Barbara", "Ken", "Frances", "Edsger",
          "Anne-Marie", "José", "Zoë", "Björn", "Siobhán", "Chidi", "Mei", "Ravi", "Olga", "Kwame")
_LAST = ("Lovelace", "Turing", "Hopper", "Torvalds", "Hamilton", "Ritchie", "Liskov", "Thompson",
         "Allen", "Dijkstra", "O'Brien", "García", "Müller", "Nakamura", "Okafor", "Kowalski")
_COUNTRIES = ("US", "GB", "DE", "FR", "JP", "BR", "IN", "NG", "PL", "ES", "CA", "AU")
_EVENT_TYPES = ("page_view", "add_to_cart", "checkout", "refund", "login", "logout")
_EPOCH = datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)


@dataclass(frozen=True)
class Sample:
    """One generated object and what a job will find in it."""

    key: str
    records: int
    """Records a parser yields from the object (valid and malformed), i.e. the job's ``records``."""
    parse_rejects: int
    """Records every handler rejects: wrong CSV column count, invalid JSON."""
    customer_rejects: int
    """Records the ``customers`` handler rejects on top of ``parse_rejects`` (e.g. invalid emails)."""
    chunks: Callable[[], Iterator[bytes]]
    """Generates the object's bytes, chunk by chunk (call it again to regenerate them)."""


def malformed_rows(rows: int, malformed: int) -> set[int]:
    """Row indexes (0-based, header excluded) that a generator makes malformed, spread evenly.

    Args:
        rows: Rows in the file.
        malformed: How many of them to spoil; at most ``rows``.
    """
    malformed = min(malformed, rows)
    return {(k + 1) * rows // (malformed + 1) for k in range(malformed)}


def customer_row(rng: random.Random, customer_id: Any, email_tag: Any) -> list[Any]:
    """One valid ``Customer`` row, in ``CUSTOMER_COLUMNS`` order; ``email_tag`` makes the email
    unique. About one name in five contains a comma, one in fifty a double quote and one in a
    hundred a line break."""
    first, last = rng.choice(_FIRST), rng.choice(_LAST)
    shape = rng.random()
    if shape < 0.01:
        name = f"{first}\n{last}"
    elif shape < 0.03:
        name = f'{first} "{last[:3]}" {last}'
    elif shape < 0.23:
        name = f"{last}, {first}"
    else:
        name = f"{first} {last}"
    created = _EPOCH + datetime.timedelta(seconds=rng.randrange(366 * 86_400))
    return [
        customer_id,
        f"{_ascii(first)}.{_ascii(last)}{email_tag}@example.com",
        name,
        rng.choice(_COUNTRIES),
        f"{rng.randrange(1_000_000) / 100:.2f}",
        created.isoformat().replace("+00:00", "Z"),
    ]


def customers_csv(rows: int, *, seed: int = 0, malformed: int = 0) -> Iterator[bytes]:
    """A customer import, RFC 4180 (CRLF, quoted fields), with a header row.

    About one name in five contains a comma, one in fifty a double quote and one in a hundred a
    line break, so they are quoted. Of the ``malformed`` rows, the first, third, fifth... have a
    seventh column (every parser rejects them) and the others an invalid email (only the
    ``customers`` handler rejects them).

    Args:
        rows: Data rows (the header is extra).
        seed: Same seed, same bytes.
        malformed: Number of spoiled rows, spread evenly (see :func:`malformed_rows`).

    Yields:
        UTF-8 chunks of a few hundred kilobytes.
    """
    rng = random.Random(seed)
    bad = sorted(malformed_rows(rows, malformed))
    kinds = {index: n % 2 for n, index in enumerate(bad)}  # 0: extra column, 1: invalid email
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\r\n")
    writer.writerow(CUSTOMER_COLUMNS)
    for i in range(rows):
        row = customer_row(rng, i + 1, i)
        kind = kinds.get(i)
        if kind == 0:
            row.append("unexpected extra column")
        elif kind == 1:
            row[1] = f"{row[1].split('.', 1)[0]} at example dot com"
        writer.writerow(row)
        if (i + 1) % _BATCH_ROWS == 0:
            yield _drain(buffer)
    tail = _drain(buffer)
    if tail:
        yield tail


def events_jsonl(rows: int, *, seed: int = 0, malformed: int = 0) -> Iterator[bytes]:
    """Clickstream events, one JSON object per line; ``malformed`` lines are truncated JSON.

    Args:
        rows: Lines (events plus malformed lines).
        seed: Same seed, same bytes.
        malformed: Number of invalid JSON lines, spread evenly (see :func:`malformed_rows`).

    Yields:
        UTF-8 chunks of a few hundred kilobytes.
    """
    rng = random.Random(seed)
    bad = malformed_rows(rows, malformed)
    parts: list[bytes] = []
    for i in range(rows):
        ts = _EPOCH + datetime.timedelta(milliseconds=rng.randrange(366 * 86_400_000))
        event = {
            "event_id": f"evt-{seed}-{i:09d}",
            "type": rng.choice(_EVENT_TYPES),
            "customer_id": rng.randrange(1, 1_000_000),
            "ts": ts.isoformat().replace("+00:00", "Z"),
            "properties": {"path": f"/p/{rng.randrange(500)}", "amount": rng.randrange(100_000) / 100},
        }
        line = orjson.dumps(event)
        if i in bad:
            line = line[: len(line) // 2]
        parts.append(line + b"\n")
        if len(parts) == _BATCH_ROWS:
            yield b"".join(parts)
            parts.clear()
    if parts:
        yield b"".join(parts)


def gzip_chunks(chunks: Iterable[bytes], level: int = 6) -> Iterator[bytes]:
    """Gzip a stream of chunks on the fly (one gzip member, readable by ``gzip.decompress``)."""
    compressor = zlib.compressobj(level, zlib.DEFLATED, 31)  # wbits 31: gzip header and trailer
    for chunk in chunks:
        out = compressor.compress(chunk)
        if out:
            yield out
    yield compressor.flush()


class ChunkStream(io.RawIOBase):
    """A read-only, non-seekable file object over an iterator of ``bytes`` chunks."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        super().__init__()
        self._chunks = iter(chunks)
        self._pending = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._pending:
            try:
                self._pending = memoryview(next(self._chunks))
            except StopIteration:
                return 0
        n = min(len(buffer), len(self._pending))
        buffer[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n


def upload_chunks(s3: Any, bucket: str, key: str, chunks: Iterable[bytes]) -> None:
    """Stream ``chunks`` into ``s3://bucket/key`` (a multipart upload once past 8 MB).

    Args:
        s3: A boto3 S3 client.
        bucket: Target bucket (must exist).
        key: Target key; an existing object is replaced.
        chunks: The object's bytes; consumed once, never held whole in memory.
    """
    config = TransferConfig(multipart_threshold=8 * 1024 * 1024, multipart_chunksize=8 * 1024 * 1024)
    with io.BufferedReader(ChunkStream(chunks), buffer_size=1024 * 1024) as stream:
        s3.upload_fileobj(stream, bucket, key, Config=config)


def sample_set(prefix: str = "", rows: int = 200_000, *, seed: int = 0) -> list[Sample]:
    """The demo's objects: a large CSV, a JSONL, a gzipped JSONL and a small CSV of bad rows.

    Args:
        prefix: Prepended to every key.
        rows: Rows of the large customers CSV; the event files get a quarter of that each.
        seed: Same seed, same bytes.
    """
    events = max(rows // 4, 1)
    few = 10
    return [
        Sample(
            key=f"{prefix}customers/customers.csv",
            records=rows,
            parse_rejects=0,
            customer_rejects=0,
            chunks=lambda: customers_csv(rows, seed=seed),
        ),
        Sample(
            key=f"{prefix}customers/customers-malformed.csv",
            records=few * 10,
            parse_rejects=(few + 1) // 2,
            customer_rejects=few // 2,
            chunks=lambda: customers_csv(few * 10, seed=seed + 1, malformed=few),
        ),
        Sample(
            key=f"{prefix}events/events.jsonl",
            records=events,
            parse_rejects=3,
            customer_rejects=0,
            chunks=lambda: events_jsonl(events, seed=seed + 2, malformed=3),
        ),
        Sample(
            key=f"{prefix}events/events-archive.jsonl.gz",
            records=events,
            parse_rejects=0,
            customer_rejects=0,
            chunks=lambda: gzip_chunks(events_jsonl(events, seed=seed + 3)),
        ),
    ]


def upload_samples(s3: Any, bucket: str, prefix: str = "", rows: int = 200_000, *, seed: int = 0) -> list[Sample]:
    """Generate and upload :func:`sample_set` to ``bucket``, streaming each object.

    Args:
        s3: A boto3 S3 client.
        bucket: Target bucket (must exist).
        prefix: Prepended to every key (e.g. ``"demo/"``).
        rows: Rows of the large customers CSV.
        seed: Same seed, same bytes.

    Returns:
        The uploaded samples, with the counts a job over them will report.
    """
    samples = sample_set(prefix, rows, seed=seed)
    for sample in samples:
        upload_chunks(s3, bucket, sample.key, sample.chunks())
    return samples


def _drain(buffer: io.StringIO) -> bytes:
    data = buffer.getvalue().encode()
    buffer.seek(0)
    buffer.truncate()
    return data


def _ascii(name: str) -> str:
    folded = name.lower().translate(_FOLD)
    return "".join(c for c in folded if c.isascii() and c.isalnum())


_FOLD = str.maketrans({"é": "e", "ë": "e", "ö": "o", "ü": "u", "á": "a", "í": "i"})

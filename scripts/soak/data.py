"""The soak's source data: files whose every record is known, and what each record must become.

Each record carries an id of its own (``rid``: the job, the file, the version and its number), so the
checker finds it wherever it lands: a JSONL or Parquet part, a table row, or (by its line) a rejects file.
A file is built from a seeded :class:`random.Random`, so a seed gives the same bytes again.

What a record must become depends on where the job writes it (:meth:`Rec.fate`):

- ``malformed``: a CSV row with a field too many, or a JSON line cut short: a reject of the parser,
  whatever the sink;
- ``db_bad``: a negative ``qty`` (the soak tables' CHECK): refused by PostgreSQL, written by the S3 sinks;
- ``null_key``: an empty ``k`` (NULL in a table): a reject of an upsert, written elsewhere.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import random
from dataclasses import dataclass, field
from typing import Any, Literal

Fate = Literal["out", "reject"]
SinkKind = Literal["jsonl", "parquet", "pg-insert", "pg-upsert"]

WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "fox", "golf", "hotel", "india", "juliet", "kilo", "lima")


@dataclass(frozen=True)
class Rec:
    """One record of a source file."""

    line: int
    """The source line it starts on (a Parquet row: its row number, from 1)."""
    rid: str
    value: dict[str, Any]
    """What a passthrough writes to S3 parts for it (CSV: every field a string)."""
    malformed: bool = False
    db_bad: bool = False
    null_key: bool = False

    def fate(self, sink: SinkKind) -> Fate:
        if self.malformed:
            return "reject"
        if sink.startswith("pg") and self.db_bad:
            return "reject"
        if sink == "pg-upsert" and self.null_key:
            return "reject"
        return "out"

    def row(self) -> tuple[str, str | None, str, int | None]:
        """The table row the record becomes (rid, k, name, qty): CSV's unquoted empty field is NULL."""
        v = self.value
        k = v.get("k")
        qty = v.get("qty")
        return (
            self.rid,
            None if k in (None, "") else str(k),
            str(v.get("name")),
            None if qty in (None, "") else int(qty),
        )


@dataclass
class Version:
    """One version of a source object: its bytes and records (``etag`` once uploaded)."""

    body: bytes
    records: list[Rec]
    etag: str = ""

    def expected(self, sink: SinkKind) -> tuple[list[Rec], list[Rec]]:
        """The records it must write, and those it must reject."""
        out = [r for r in self.records if r.fate(sink) == "out"]
        return out, [r for r in self.records if r.fate(sink) == "reject"]


@dataclass
class SourceFile:
    """A source object and its versions in upload order (the last one is current)."""

    key: str
    versions: list[Version] = field(default_factory=list)

    @property
    def current(self) -> Version:
        return self.versions[-1]

    def version(self, etag: str) -> Version | None:
        return next((v for v in self.versions if v.etag == etag), None)


@dataclass(frozen=True)
class Mix:
    """How a file's records are drawn."""

    malformed: float = 0.0
    db_bad: float = 0.0
    null_key: float = 0.0
    odd_text: float = 0.05
    """Names with a comma, a quote or a line break (quoted in CSV)."""
    keys: int | None = None
    """Upsert files: ``k`` drawn from this many values (repeats: the last good row of a key wins); None:
    every ``k`` its own."""


def _name(rng: random.Random, mix: Mix) -> str:
    name = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 3)))
    if rng.random() < mix.odd_text:
        name += rng.choice([", inc", ' "quoted"', "\nsecond line", "é ü"])
    return name


def _fields(
    rng: random.Random, rid: str, n: int, tag: str, mix: Mix, empty: str | None = None
) -> tuple[dict[str, Any], bool, bool]:
    """A record's fields; a NULL key is ``empty`` (CSV: "", which a table reads as NULL; JSON: null)."""
    null_key = rng.random() < mix.null_key
    k = empty if null_key else f"{tag}-{rng.randrange(mix.keys) if mix.keys else n}"
    db_bad = rng.random() < mix.db_bad
    qty = -rng.randint(1, 9) if db_bad else rng.randint(0, 999)
    return {"rid": rid, "k": k, "name": _name(rng, mix), "qty": qty}, db_bad, null_key


def csv_version(rng: random.Random, tag: str, count: int, mix: Mix) -> Version:
    """A CSV file (header ``rid,k,name,qty``) of ``count`` records, some malformed (a field too many)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["rid", "k", "name", "qty"])
    line, records = 2, []
    for n in range(count):
        rid = f"{tag}:{n}"
        fields, db_bad, null_key = _fields(rng, rid, n, tag, mix, "")
        value = {name: str(v) for name, v in fields.items()}
        at = out.tell()
        if rng.random() < mix.malformed:
            out.write(f"{rid},{fields['k']},bad row,1,{n}\n")
            records.append(Rec(line, rid, value, malformed=True))
        else:
            writer.writerow(value.values())
            records.append(Rec(line, rid, value, db_bad=db_bad, null_key=null_key))
        line += out.getvalue()[at:].count("\n")
    return Version(out.getvalue().encode(), records)


def jsonl_version(rng: random.Random, tag: str, count: int, mix: Mix, *, gz: bool = False) -> Version:
    """A JSON Lines file of ``count`` objects, some lines cut short (invalid JSON); gzip-compressed with ``gz``."""
    lines, records = [], []
    for n in range(count):
        rid = f"{tag}:{n}"
        fields, db_bad, null_key = _fields(rng, rid, n, tag, mix)
        text = json.dumps(fields, ensure_ascii=False)
        if rng.random() < mix.malformed:
            lines.append(text[: len(text) // 2])
            records.append(Rec(n + 1, rid, fields, malformed=True))
        else:
            lines.append(text)
            records.append(Rec(n + 1, rid, fields, db_bad=db_bad, null_key=null_key))
    body = ("\n".join(lines) + "\n").encode()
    return Version(gzip.compress(body, mtime=0) if gz else body, records)


def parquet_version(rng: random.Random, tag: str, count: int, mix: Mix, row_group: int = 500) -> Version:
    """A Parquet file of ``count`` rows (``rid``, ``k``, ``name`` strings, ``qty`` int64), in row groups."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = []
    for n in range(count):
        fields, db_bad, null_key = _fields(rng, f"{tag}:{n}", n, tag, mix)
        records.append(Rec(n + 1, fields["rid"], fields, db_bad=db_bad, null_key=null_key))
    table = pa.table({
        "rid": pa.array([r.value["rid"] for r in records], pa.string()),
        "k": pa.array([r.value["k"] for r in records], pa.string()),
        "name": pa.array([r.value["name"] for r in records], pa.string()),
        "qty": pa.array([r.value["qty"] for r in records], pa.int64()),
    })
    sink = io.BytesIO()
    pq.write_table(table, sink, row_group_size=row_group)
    return Version(sink.getvalue(), records)


def manifest_body(bucket: str, keys: list[str]) -> bytes:
    """A plain CSV manifest (``bucket,key``), one object a row."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for key in keys:
        writer.writerow([bucket, key])
    return out.getvalue().encode()

"""What the soak's jobs left behind, read straight from the servers (never from the jobs' own report): every key
of the output and source buckets, the records of each file's parts (JSONL or Parquet) and rejects files, and
the rows of the PostgreSQL tables."""

from __future__ import annotations

import io
import json
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from s3batch import layout
from scripts.soak.cluster import OUTPUT_BUCKET, SOURCE_BUCKET, TABLES


def list_keys(s3: Any, bucket: str, prefix: str = "") -> list[str]:
    keys: list[str] = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys += [o["Key"] for o in page.get("Contents", [])]
    return keys


def read_json(s3: Any, key: str) -> dict[str, Any] | None:
    try:
        body = s3.get_object(Bucket=OUTPUT_BUCKET, Key=key)["Body"].read()
    except s3.exceptions.NoSuchKey:
        return None
    return json.loads(body)  # type: ignore[no-any-return]


def read_report(s3: Any, output_prefix: str, name: str = "_report.json") -> dict[str, Any] | None:
    return read_json(s3, output_prefix + name)


@dataclass
class FileOutputs:
    """One source file's output folder."""

    records: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    """(part name, record) of every part, parts in name order (the file's order)."""
    rejects: list[dict[str, Any]] = field(default_factory=list)
    names: list[str] = field(default_factory=list)


def read_folder(s3: Any, folder: str, names: list[str]) -> FileOutputs:
    """The parts and rejects files among ``names`` (object names under ``folder``)."""
    out = FileOutputs(names=sorted(names))
    for name in out.names:
        body = s3.get_object(Bucket=OUTPUT_BUCKET, Key=folder + name)["Body"].read()
        if name.startswith("rejects-"):
            out.rejects += [json.loads(line) for line in body.splitlines() if line]
        elif name.endswith(layout.PARQUET):
            import pyarrow.parquet as pq

            out.records += [(name, row) for row in pq.read_table(io.BytesIO(body)).to_pylist()]
        elif name.startswith("part-"):
            out.records += [(name, json.loads(line)) for line in body.splitlines() if line]
    return out


def folders(keys: list[str], output_prefix: str) -> dict[str, list[str]]:
    """The object names of each folder directly holding parts or rejects under ``output_prefix`` (by folder)."""
    found: dict[str, list[str]] = defaultdict(list)
    for key in keys:
        if not key.startswith(output_prefix):
            continue
        folder, _, name = key.rpartition("/")
        if name.startswith(("part-", "rejects-")):
            found[folder + "/"].append(name)
    return found


@dataclass
class Tables:
    """The rows of the soak's tables, by file (the ``rid`` up to its record number: job, file, version)."""

    insert: dict[str, list[tuple[Any, ...]]] = field(default_factory=lambda: defaultdict(list))
    upsert: dict[str, list[tuple[Any, ...]]] = field(default_factory=lambda: defaultdict(list))
    others: list[str] = field(default_factory=list)
    """Tables of the database other than the soak's and the checkpoint table."""

    @staticmethod
    def tag(rid: str) -> str:
        return rid.rpartition(":")[0]


def read_tables(pg: Any) -> Tables:
    tables = Tables()
    if pg is None:
        return tables
    for rid, k, name, qty in pg.execute("SELECT rid, k, name, qty FROM public.soak_insert"):
        tables.insert[Tables.tag(str(rid))].append((rid, k, name, qty))
    for rid, k, name, qty in pg.execute("SELECT rid, k, name, qty FROM public.soak_upsert"):
        tables.upsert[Tables.tag(str(rid))].append((rid, k, name, qty))
    known = {*TABLES, "s3batch_checkpoints"}
    rows = pg.execute("SELECT schemaname || '.' || tablename FROM pg_tables WHERE schemaname NOT IN "
                      "('pg_catalog', 'information_schema')")
    tables.others = sorted(str(r[0]) for r in rows if str(r[0]).split(".", 1)[1] not in known)
    return tables


def all_keys(s3: Any) -> tuple[list[str], list[str]]:
    """Every key of the output bucket and of the source bucket."""
    return list_keys(s3, OUTPUT_BUCKET), list_keys(s3, SOURCE_BUCKET)

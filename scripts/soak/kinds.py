"""The jobs the soak runs: one builder per kind, each making a :class:`JobPlan` from a seeded random source (the
files, their records, the job's input, and the controls a person would use on it while it runs).

Kinds: ``many-small`` (a prefix of hundreds of small CSV files: listing pages, groups), ``jsonl-gz`` (JSON Lines,
some gzip-compressed), ``parquet-in`` (Parquet inputs), ``big-split`` (a CSV in byte-range splits), ``manifest``
(a CSV manifest, one key missing), ``pg-insert`` and ``pg-upsert`` (the shared PostgreSQL tables),
``parquet-sink`` (Parquet parts), ``rejects`` (reject limits: files over them fail), ``incremental`` (a ledger's
runs, files added and overwritten while they run). Any but ``incremental`` may be paused and resumed, have its
concurrency changed, or be cancelled (and then redriven or not).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from scripts.soak.cluster import CONNECTION, OUTPUT_BUCKET, SOURCE_BUCKET
from scripts.soak.data import Mix, SinkKind, SourceFile, Version, csv_version, jsonl_version, parquet_version


@dataclass
class Control:
    """Something done to a running job, ``at`` seconds after its start."""

    at: float
    action: Literal["pause", "cancel", "concurrency"]
    hold: float = 0.0
    """``pause``: seconds until the resume."""
    redrive_after: float | None = None
    """``cancel``: seconds after the job ended until its redrive (None: never redriven)."""
    value: int = 0
    """``concurrency``: the new ``max_concurrent_files``."""


@dataclass
class Change:
    """Incremental jobs: files added and overwritten ``at`` seconds after run ``run`` started."""

    run: int
    at: float
    add: int
    overwrite: int


@dataclass
class RunRecord:
    """One workflow of a job: the job itself, its redrive, or a run of an incremental job."""

    workflow_id: str
    output_prefix: str
    role: str
    status: str = "unknown"
    """``succeeded``, ``failed``, ``cancelled``, or ``unfinished`` (not ended when the soak stopped waiting)."""
    error: str | None = None
    started: float = 0.0
    ended: float = 0.0


@dataclass
class JobPlan:
    kind: str
    job_id: str
    spec: dict[str, Any]
    """The job input (``S3BatchInput`` as JSON)."""
    sink: SinkKind
    files: dict[str, SourceFile]
    """Every source object the job may list, by key, with its versions."""
    rng: random.Random
    missing: list[str] = field(default_factory=list)
    """Keys the manifest names that do not exist."""
    manifest: tuple[str, bytes] | None = None
    files_per_run: int | None = None
    controls: list[Control] = field(default_factory=list)
    runs: int = 1
    changes: list[Change] = field(default_factory=list)
    records: list[RunRecord] = field(default_factory=list)
    checked_early: list[str] = field(default_factory=list)
    """Violations found while it ran (a cancelled job's books, checked before its redrive)."""

    @property
    def prefix(self) -> str:
        return f"{self.job_id}/"

    def tag(self, name: str, version: int = 0) -> str:
        """The ``rid`` prefix of a file's records: job, file and version."""
        return f"{self.job_id}:{name}:v{version}"


KINDS: dict[str, Callable[[random.Random, str, float, bool], JobPlan]] = {}
WEIGHTS: dict[str, float] = {}


def kind(name: str, weight: float) -> Callable[[Callable[..., JobPlan]], Callable[..., JobPlan]]:
    def register(build: Callable[..., JobPlan]) -> Callable[..., JobPlan]:
        KINDS[name], WEIGHTS[name] = build, weight
        return build

    return register


def _n(rng: random.Random, low: int, high: int, scale: float) -> int:
    return max(1, int(rng.randint(low, high) * scale))


def _base(rng: random.Random, job_id: str, kind_name: str, sink_kind: SinkKind, **spec: Any) -> JobPlan:
    plan = JobPlan(kind_name, job_id, {}, sink_kind, {}, rng)
    plan.spec = {
        "bucket": SOURCE_BUCKET,
        "prefix": plan.prefix,
        "output_bucket": OUTPUT_BUCKET,
        "output_prefix": plan.prefix,
        "heartbeat_timeout_seconds": 10,
        "max_attempts": 25,
        "max_concurrent_files": rng.choice([2, 4, 6, 8]),
        "max_failed_files": 1_000,
        "handler": rng.choices(["passthrough", "soak_count", "soak_slow"], [4, 4, 2])[0],
        **spec,
    }
    if rng.random() < 0.4:
        plan.files_per_run = rng.randint(3, 40)
    return plan


def _add(plan: JobPlan, name: str, version: Version) -> None:
    plan.files.setdefault(plan.prefix + name, SourceFile(plan.prefix + name)).versions.append(version)


def _controls(plan: JobPlan) -> None:
    rng = plan.rng
    if rng.random() < 0.2:
        plan.controls.append(Control(rng.uniform(0.5, 8), "pause", hold=rng.uniform(2, 12)))
    if rng.random() < 0.15:
        plan.controls.append(Control(rng.uniform(0.5, 10), "concurrency", value=rng.choice([1, 2, 3, 12])))
    if rng.random() < 0.25:
        redrive = rng.uniform(1, 15) if rng.random() < 0.7 else None
        plan.controls.append(Control(rng.uniform(0.5, 12), "cancel", redrive_after=redrive))


@kind("many-small", 1.0)
def many_small(rng: random.Random, job_id: str, scale: float, pg: bool) -> JobPlan:
    plan = _base(rng, job_id, "many-small", "jsonl")
    for i in range(_n(rng, 400, 1_100, scale)):
        version = csv_version(rng, plan.tag(f"f{i}"), rng.randint(1, 6), Mix(malformed=0.03))
        _add(plan, f"d{i % 7}/f{i:04d}.csv", version)
    _controls(plan)
    return plan


@kind("jsonl-gz", 1.0)
def jsonl_gz(rng: random.Random, job_id: str, scale: float, pg: bool) -> JobPlan:
    plan = _base(rng, job_id, "jsonl-gz", "jsonl", chunk_records=rng.choice([250, 500, 1_000]))
    for i in range(_n(rng, 4, 10, scale)):
        gz = rng.random() < 0.5
        version = jsonl_version(rng, plan.tag(f"j{i}"), _n(rng, 300, 4_000, scale), Mix(malformed=0.01), gz=gz)
        _add(plan, f"j{i:02d}.jsonl" + (".gz" if gz else ""), version)
    _controls(plan)
    return plan


@kind("parquet-in", 0.6)
def parquet_in(rng: random.Random, job_id: str, scale: float, pg: bool) -> JobPlan:
    plan = _base(rng, job_id, "parquet-in", "jsonl", chunk_records=rng.choice([200, 500]))
    for i in range(_n(rng, 2, 5, scale)):
        version = parquet_version(rng, plan.tag(f"p{i}"), _n(rng, 500, 3_000, scale), Mix(), rng.choice([200, 500]))
        _add(plan, f"p{i:02d}.parquet", version)
    _controls(plan)
    return plan


@kind("big-split", 1.0)
def big_split(rng: random.Random, job_id: str, scale: float, pg: bool) -> JobPlan:
    plan = _base(
        rng, job_id, "big-split", "jsonl", chunk_records=rng.choice([500, 1_000, 2_000]),
        split_bytes=rng.choice([64, 128, 256]) * 1024, max_concurrent_files=rng.choice([4, 6, 8]),
    )
    _add(plan, "big.csv", csv_version(rng, plan.tag("big"), _n(rng, 15_000, 45_000, scale), Mix(malformed=0.002)))
    for i in range(rng.randint(0, 3)):
        _add(plan, f"small{i}.csv", csv_version(rng, plan.tag(f"s{i}"), rng.randint(10, 300), Mix()))
    _controls(plan)
    return plan


@kind("manifest", 0.8)
def manifest(rng: random.Random, job_id: str, scale: float, pg: bool) -> JobPlan:
    plan = _base(rng, job_id, "manifest", "jsonl", chunk_records=rng.choice([300, 1_000]))
    keys = []
    for i in range(_n(rng, 6, 20, scale)):
        _add(plan, f"m{i:02d}.csv", csv_version(rng, plan.tag(f"m{i}"), _n(rng, 50, 1_500, scale), Mix(malformed=0.01)))
        keys.append(plan.prefix + f"m{i:02d}.csv")
    plan.missing = [plan.prefix + "gone.csv"]
    listed = sorted(keys + plan.missing)
    rng.shuffle(listed)
    manifest_key = f"manifests/{job_id}.csv"
    body = "".join(f"{SOURCE_BUCKET},{key}\n" for key in listed).encode()
    plan.manifest = (manifest_key, body)
    del plan.spec["bucket"], plan.spec["prefix"]
    plan.spec["manifest"] = f"s3://{SOURCE_BUCKET}/{manifest_key}"
    _controls(plan)
    return plan


@kind("pg-insert", 1.0)
def pg_insert(rng: random.Random, job_id: str, scale: float, pg: bool) -> JobPlan:
    sink = {"type": "postgres", "connection": CONNECTION, "table": "public.soak_insert"}
    plan = _base(rng, job_id, "pg-insert", "pg-insert", sink=sink, chunk_records=rng.choice([200, 1_000, 3_000]))
    plan.spec["heartbeat_timeout_seconds"] = 15
    for i in range(_n(rng, 3, 8, scale)):
        mix = Mix(malformed=0.005, db_bad=0.01)
        if rng.random() < 0.5:
            _add(plan, f"i{i:02d}.csv", csv_version(rng, plan.tag(f"i{i}"), _n(rng, 200, 6_000, scale), mix))
        else:
            _add(plan, f"i{i:02d}.jsonl", jsonl_version(rng, plan.tag(f"i{i}"), _n(rng, 200, 3_000, scale), mix))
    _controls(plan)
    return plan


@kind("pg-upsert", 0.8)
def pg_upsert(rng: random.Random, job_id: str, scale: float, pg: bool) -> JobPlan:
    sink = {"type": "postgres", "connection": CONNECTION, "table": "public.soak_upsert", "mode": "upsert",
            "key": ["k"]}
    plan = _base(rng, job_id, "pg-upsert", "pg-upsert", sink=sink, chunk_records=rng.choice([100, 500, 2_000]))
    plan.spec["heartbeat_timeout_seconds"] = 15
    for i in range(_n(rng, 2, 6, scale)):
        count = _n(rng, 200, 4_000, scale)
        mix = Mix(db_bad=0.01, null_key=0.01, keys=max(1, count // 3))
        _add(plan, f"u{i:02d}.csv", csv_version(rng, plan.tag(f"u{i}"), count, mix))
    _controls(plan)
    return plan


@kind("parquet-sink", 0.7)
def parquet_sink(rng: random.Random, job_id: str, scale: float, pg: bool) -> JobPlan:
    sink = {"type": "s3", "format": "parquet"}
    plan = _base(rng, job_id, "parquet-sink", "parquet", sink=sink, chunk_records=rng.choice([300, 1_000]))
    for i in range(_n(rng, 2, 6, scale)):
        if rng.random() < 0.5:
            _add(plan, f"q{i:02d}.csv", csv_version(rng, plan.tag(f"q{i}"), _n(rng, 100, 3_000, scale), Mix()))
        else:
            _add(plan, f"q{i:02d}.jsonl", jsonl_version(rng, plan.tag(f"q{i}"), _n(rng, 100, 3_000, scale), Mix()))
    _controls(plan)
    return plan


@kind("rejects", 0.8)
def rejects(rng: random.Random, job_id: str, scale: float, pg: bool) -> JobPlan:
    plan = _base(rng, job_id, "rejects", "jsonl", chunk_records=rng.choice([200, 500]), max_rejected_ratio=0.3)
    for i in range(_n(rng, 4, 8, scale)):
        ratio = rng.choice([0.0, 0.05, 0.2, 0.6, 1.0])
        count = _n(rng, 50, 2_500, scale)
        _add(plan, f"r{i:02d}.csv", csv_version(rng, plan.tag(f"r{i}"), count, Mix(malformed=ratio)))
    _controls(plan)
    return plan


@kind("incremental", 1.0)
def incremental(rng: random.Random, job_id: str, scale: float, pg: bool) -> JobPlan:
    plan = _base(rng, job_id, "incremental", "jsonl", incremental={}, chunk_records=rng.choice([100, 500]))
    for i in range(_n(rng, 10, 40, scale)):
        _add(plan, f"n{i:03d}.csv", csv_version(rng, plan.tag(f"n{i}"), rng.randint(5, 800), Mix(malformed=0.01)))
    plan.runs = rng.randint(3, 5)
    for run in range(plan.runs - 1):
        plan.changes.append(Change(run, rng.uniform(0, 6), add=rng.randint(0, 5), overwrite=rng.randint(0, 3)))
    return plan


def plan_job(rng: random.Random, number: int, seed: int, scale: float, pg: bool,
             only: tuple[str, ...] = ()) -> JobPlan:
    """The next job: its kind drawn by weight (among ``only`` when given; the PostgreSQL kinds only with a
    server)."""
    names = [k for k in KINDS if (pg or not k.startswith("pg-")) and (not only or k in only)]
    name = rng.choices(names, [WEIGHTS[k] for k in names])[0]
    job_id = f"soak-{seed}-{number:03d}-{name}"
    return KINDS[name](random.Random(rng.getrandbits(64)), job_id, scale, pg)

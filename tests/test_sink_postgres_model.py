"""A model-based test of the PostgreSQL sink (issue 29): hypothesis stateful testing against a real PostgreSQL
server started for this module, with an in-memory model of exactly what the target table must hold.

The model (:class:`TableModel`) knows the table's rows, and the checkpoint row the database keeps of each file
(version, options that shape its rows, how far it got, its counts). The rules import generated CSV and JSON
Lines files (in the real S3 server) through the real sink, ``S3Activities.process_file`` as a worker runs it
(``ActivityEnvironment``), and compare the table, the file's checkpoint, the reported counts and the rejects
files' lines with what the model says after every step:

- a file imported in ``insert`` or ``upsert`` mode (rows the database refuses: a value that is no integer, a
  NULL in a NOT NULL column, a check constraint, a duplicate key; in upsert a NULL key; JSON objects without some
  of the fields, which the table fills or an upsert leaves as they are), with the CSV fast path or not, its
  transactions written behind or not;
- imported again: with the same options (nothing written, the report says so), with options that do not change
  the rows (``chunk_records``: nothing doubled, a half-done file resumes), with options that change them
  (another handler, another column mapping, another mode) or a new version of the file: refused in insert mode
  with nothing written, written over by key in upsert mode, the file's earlier rows replaced exactly with
  ``"on_reimport": "replace"`` and ``"source_column"``;
- a crash at a chosen chunk, then the resume: a real SIGKILL of a process running the activity (in the chunk's
  transaction, after its rows and before its commit), an abort between the rows and the checkpoint (a trigger
  of the checkpoint table that raises), a handler that raises, the database restarted in the chunk's
  transaction; the table then holds exactly the committed chunks' rows, and after the resume every accepted
  row exactly once;
- the database restarted between imports (the worker's pools hold dead connections);
- table shapes: identity (always, by default), ``serial``, ``DEFAULT now()``, a generated stored column, a check
  constraint (every shape), more columns than the file (subset), a file's column with a default, a fact table
  without a unique key (a row written twice would be there twice).

A second test runs the same machine's imports as whole jobs on an in-process worker; one more runs its crash rule
with a real SIGKILL for certain. The defects the model found are pinned by focused tests at the end.

The CI run is derandomized and bounded (:data:`EXAMPLES` examples of :data:`STEPS` steps); a longer run by
hand: ``S3BATCH_MODEL_EXAMPLES=500 .venv/bin/pytest tests/test_sink_postgres_model.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import dataclasses
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import EllipsisType
from typing import Any, NamedTuple

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from s3batch.activities import file_job, file_setup
from s3batch.activities.s3_activities import S3Activities
from s3batch.workflows.batch import S3BatchWorkflow
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment
from temporalio.worker import Worker

from s3batch.checkpoint import Checkpoint
from s3batch.config import Settings
from s3batch.dev.postgres import PostgresServer, server_bindir
from s3batch.dev.stack import Stack
from s3batch.file_output import FileOutput
from s3batch.handlers import HandlerResult, chunk_context, chunk_handler
from s3batch.jsonvalues import encode_json
from s3batch.messages import FileResult, ObjectRef, ProcessFileInput
from s3batch.models import S3BatchInput
from s3batch.plugin import S3BatchPlugin
from s3batch.s3io import make_client
from s3batch.sinks.postgres import PostgresOutput
from s3batch.sinks.postgres_pools import PostgresPools
from s3batch.sinks.spec import PostgresSink
from tests.helpers.output import read_jsonl, report

ROOT = Path(__file__).resolve().parent.parent
MODULE = f"tests.{Path(__file__).stem}"
"""This module, as the child processes run it (``python -m``: its handlers, :func:`_child_main`)."""

EXAMPLES = int(os.environ.get("S3BATCH_MODEL_EXAMPLES") or 60)
"""Examples of the state machine (each a fresh table and files); the CI run's few, a longer run's many."""
STEPS = int(os.environ.get("S3BATCH_MODEL_STEPS") or 12)
"""Steps (rules) at most per example."""
PHASES = [p for p in Phase if p != Phase.shrink or not os.environ.get("S3BATCH_MODEL_NO_SHRINK")]
"""Hypothesis's phases (``S3BATCH_MODEL_NO_SHRINK=1``: a failure as found, without the minutes of shrinking)."""

# ---------------------------------------------------------------- the table shapes

COMMON = "k integer NOT NULL, name text NOT NULL, qty integer CHECK (qty >= 0), note text, src text"
"""What every shape holds: the file's columns (``k``, ``name``, ``qty``), ``note`` (another column mapping
writes there), ``src`` (``source_column``), a NOT NULL and a check constraint."""

class Shape(NamedTuple):
    columns: str
    keyed: bool
    """``k`` is a unique key (upsert's ``key``; in insert mode a second row of a key is refused)."""
    qty: int | None = None
    """``qty``'s default (then NOT NULL): a row without the field gets it."""


SHAPES = {
    "identity-always": Shape(f"id bigint GENERATED ALWAYS AS IDENTITY, {COMMON}, UNIQUE (k)", True),
    "identity-by-default": Shape(f"id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, {COMMON}, UNIQUE (k)", True),
    "serial": Shape(f"id serial PRIMARY KEY, {COMMON}, UNIQUE (k)", True),
    "default-now": Shape(f"{COMMON}, loaded_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (k)", True),
    "generated": Shape(f"{COMMON}, name_len integer GENERATED ALWAYS AS (length(name)) STORED, UNIQUE (k)", True),
    "subset": Shape(f"amount numeric(10, 2), {COMMON}, seen date, batch integer NOT NULL DEFAULT 7, UNIQUE (k)", True),
    "default-qty": Shape(COMMON.replace("qty integer", "qty integer NOT NULL DEFAULT 1") + ", UNIQUE (k)", True, 1),
    "fact": Shape(f"id bigint GENERATED ALWAYS AS IDENTITY, {COMMON}", False),
}
"""The tables the files go into. The fact table has no unique key: a row written twice is there twice."""

COLUMNS = ("k", "name", "qty", "note", "src")
"""The columns the model knows; the others the table fills (checked by :func:`_filled_columns_hold`)."""

# ---------------------------------------------------------------- handlers

_HANDLER_FAULT: dict[str, int] = {}
"""Source key -> the chunk at which ``model_upper`` raises (once)."""


@chunk_handler("model_upper")
def model_upper(records: Any) -> HandlerResult:
    """Another handler (other rows than ``passthrough``): each record with its name in capitals. Raises (the
    chunk's attempt fails, as a crashing handler's) in the chunk :data:`_HANDLER_FAULT` names for its file."""
    context = chunk_context()
    if _HANDLER_FAULT.get(context.key) == context.chunk:
        del _HANDLER_FAULT[context.key]
        raise RuntimeError("the handler crashed (injected)")
    out = [{**r.value, "name": r.value["name"].upper()} if isinstance(r.value.get("name"), str) else r.value
           for r in records]
    return HandlerResult(out, [], dropped=0, lines=[r.line for r in records])


# ---------------------------------------------------------------- the files


Value = int | str | None | EllipsisType


@dataclass(frozen=True)
class Version:
    """One version of a source file: its records (``k``, ``name``, ``qty`` as written: in a CSV, text) and
    bytes."""

    fmt: str
    """``csv`` (a header line ``k,name,qty``) or ``jsonl``."""
    records: tuple[tuple[Value, Value, Value], ...]
    """In a JSON Lines file ``...`` is a field the object lacks."""
    crlf: bool = False
    """A CSV's lines end with CR LF (a line break inside a quoted name stays LF)."""
    bom: bool = False
    """A CSV starts with a UTF-8 byte order mark (as spreadsheet tools write it)."""

    def body(self) -> tuple[bytes, list[int]]:
        """The file's bytes and the line each record starts on."""
        lines: list[int] = []
        if self.fmt == "jsonl":
            text = "".join(json.dumps(_fields(r), ensure_ascii=False) + "\n" for r in self.records)
            return text.encode(), list(range(1, len(self.records) + 1))
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\r\n" if self.crlf else "\n")
        writer.writerow(["k", "name", "qty"])
        line = 2
        for record in self.records:
            lines.append(line)
            at = out.tell()
            writer.writerow(record)
            line += out.getvalue()[at:].count("\n")
        return ("\ufeff" if self.bom else "").encode() + out.getvalue().encode(), lines

    def read(self, header: tuple[str, ...] | None) -> list[tuple[int, dict[str, Value]]]:
        """The records a job reads (its line, its values): with a ``header`` list, the file's header line is a
        record too, its fields named by the list."""
        _, lines = self.body()
        rows: list[tuple[int, tuple[Value, ...]]] = list(zip(lines, self.records, strict=True))
        if self.fmt == "csv" and header is not None:
            rows.insert(0, (1, ("k", "name", "qty")))
        names = header if self.fmt == "csv" and header is not None else ("k", "name", "qty")
        return [(line, _fields(r, names)) for line, r in rows]


def _fields(record: tuple[Value, ...], names: tuple[str, ...] = ("k", "name", "qty")) -> dict[str, Value]:
    """A record's fields (a JSON object's: without those it lacks, ``...`` in :attr:`Version.records`)."""
    return {name: value for name, value in zip(names, record, strict=True) if value is not ...}


_NAME = st.text(alphabet=st.sampled_from(list('abYz é,"\n漢ß')), min_size=1, max_size=5)
_QTY_BAD = st.sampled_from([-1, -30, "many", "2.5", "99999999999", "1e3"])
_K_BAD = st.sampled_from(["x", "4.0", "3000000000"])


@st.composite
def versions(draw: st.DrawFn, fmt: str | None = None) -> Version:
    """A file: 0-14 records, most of them good; keys among 0-15 (some twice, some written with spaces around them),
    some values the database refuses; JSON objects without some of the fields; a CSV's lines end with LF or CR LF,
    after a byte order mark or not."""
    fmt = fmt or draw(st.sampled_from(["csv", "jsonl"]))
    json_only = st.nothing() if fmt == "csv" else st.sampled_from([None, ...])
    k = st.one_of(st.integers(0, 15), st.integers(0, 15).map(str), st.integers(0, 15).map(" {} ".format), _K_BAD,
                  json_only)
    name = st.one_of(_NAME, _NAME, _NAME, json_only)
    lacking = st.nothing() if fmt == "csv" else st.just(...)  # a JSON object without qty: a run of its own
    qty = st.one_of(st.integers(0, 50), st.integers(0, 50), st.just(" 8"), _QTY_BAD, json_only, lacking)
    records = draw(st.lists(st.tuples(k, name, qty), max_size=14))
    if fmt == "jsonl":
        return Version(fmt, tuple(records))
    text = tuple(tuple(str(v) for v in r) for r in records)
    return Version(fmt, text, crlf=draw(st.booleans()), bom=draw(st.booleans()))  # type: ignore[arg-type]


# ---------------------------------------------------------------- the options


@dataclass(frozen=True)
class Options:
    """A job's options for one file (and how the worker writes it: ``fast``, ``behind``)."""

    mode: str = "insert"
    on_reimport: str | None = None
    source_column: str | None = None
    handler: str = "passthrough"
    header: tuple[str, ...] | None = None
    """A CSV's column mapping: None (its header line), or names for every line (the header line is a record)."""
    chunk_records: int = 4
    ratio: float | None = None
    """``max_rejected_ratio`` (None: no limit set; a file of only rejects then fails)."""
    fast: bool = False
    """The CSV fast path for this small file (``FAST_MIN_BYTES`` 0)."""
    behind: bool = False
    """Transactions written behind the chunk loop, two at once in insert mode (``BEHIND_MIN_BYTES`` 0)."""

    def rows(self) -> tuple[Any, ...]:
        """What decides the rows written (the sink's ``rows_fingerprint``): not the chunk size, the limits, the
        worker's paths."""
        return (self.mode, self.source_column, self.handler, self.header)

    @property
    def policy(self) -> str:
        return self.on_reimport or ("refuse" if self.mode == "insert" else "upsert")

    def sink(self, table: str) -> PostgresSink:
        return PostgresSink(
            type="postgres", connection="test", table=f"public.{table}", mode=self.mode,  # type: ignore[arg-type]
            key=["k"] if self.mode == "upsert" else None, on_reimport=self.on_reimport,  # type: ignore[arg-type]
            source_column=self.source_column,
        )


MAX_RECORD_BYTES = S3BatchInput.model_fields["max_record_bytes"].default
"""A job's default (it shapes the rows: an activity given another would be another import of the file)."""

MAPPINGS = [None, ("k", "name", "qty"), ("k", "name", "note")]
CHUNKS = st.sampled_from([1, 2, 3, 4, 5, 7, 100])


@st.composite
def options(draw: st.DrawFn, keyed: bool, fmt: str) -> Options:
    mode = draw(st.sampled_from(["insert", "upsert"])) if keyed else "insert"
    on_reimport = draw(st.sampled_from([None, None, "refuse", "replace"]))
    source = "src" if on_reimport == "replace" else draw(st.sampled_from([None, "src"]))
    return Options(
        mode=mode, on_reimport=on_reimport, source_column=source,
        handler=draw(st.sampled_from(["passthrough", "passthrough", "model_upper"])),
        header=draw(st.sampled_from(MAPPINGS)) if fmt == "csv" else None,
        chunk_records=draw(CHUNKS), ratio=draw(st.sampled_from([None, None, 1.0])),
        fast=draw(st.booleans()), behind=draw(st.booleans()),
    )


# ---------------------------------------------------------------- the model

INT4 = (-(2**31), 2**31 - 1)
_INTEGER = re.compile(r"[ \t\n\r\f\v]*([+-]?[0-9]+)[ \t\n\r\f\v]*")
BAD = object()
"""A value the database refuses for an integer column."""


def pg_integer(value: Value) -> object:
    """``value`` (a JSON value, or a CSV field) as PostgreSQL's ``integer`` input takes it: an int, None, or
    :data:`BAD`."""
    if value is None:
        return None
    if isinstance(value, str):
        found = _INTEGER.fullmatch(value)
        if found is None:
            return BAD
        value = int(found.group(1))
    return value if INT4[0] <= value <= INT4[1] else BAD


@dataclass
class Stored:
    """A file's checkpoint row, as the model knows it."""

    etag: str
    rows: tuple[Any, ...]
    source_column: str | None
    job: str
    next_record: int = 0
    chunk: int = 0
    written: int = 0
    rejected: int = 0
    done: bool = False


@dataclass
class Outcome:
    """What an import does, as the model says."""

    kind: str
    """``refused`` (nothing written), ``done`` (found done at its start), ``run`` (reads from ``start``)."""
    start: int = 0
    chunk: int = 0
    delete: bool = False
    """The file's earlier rows are deleted in its first chunk's transaction (``on_reimport: replace``)."""


@dataclass
class TableModel:
    """The rows the table must hold, and the checkpoint row of each file (the database's)."""

    keyed: bool
    qty: int | None = None
    """``qty``'s default (then NOT NULL), if it has one."""
    rows: list[dict[str, Any]] = field(default_factory=list)
    stored: dict[str, Stored] = field(default_factory=dict)

    def decide(self, key: str, etag: str, opts: Options) -> Outcome:
        """Where an import of version ``etag`` of ``key`` with ``opts`` starts, if it does."""
        stored = self.stored.get(key)
        if stored is not None and stored.etag == etag and stored.rows == opts.rows():
            return Outcome("done") if stored.done else Outcome("run", stored.next_record, stored.chunk)
        if stored is not None and stored.written and (
            opts.policy == "refuse" or (opts.policy == "replace" and stored.source_column != opts.source_column)
        ):
            return Outcome("refused")
        return Outcome("run", delete=opts.on_reimport == "replace")

    def run(
        self, key: str, identity: str, version: Version, opts: Options, job: str, stop: int | None = None
    ) -> tuple[Outcome, list[int]]:
        """Apply an import to the model, chunk by chunk, up to (not including) chunk ``stop``; the outcome and the
        lines it rejected. ``identity``: ``s3://bucket/key#etag``."""
        etag = identity.rpartition("#")[2]
        outcome = self.decide(key, etag, opts)
        if outcome.kind != "run":
            return outcome, []
        records = version.read(opts.header)
        rejected: list[int] = []
        at, chunk = outcome.start, outcome.chunk
        while True:
            if chunk == stop:
                return outcome, rejected
            if chunk == 0 and outcome.delete:
                prefix = identity.rpartition("#")[0] + "#"
                self.rows = [r for r in self.rows if not (r["src"] or "").startswith(prefix)]
            part = records[at : at + opts.chunk_records]
            refused = [line for line, values in part if not self.write(values, opts, identity)]
            rejected += refused
            if chunk == 0:  # the first chunk's commit makes the file's checkpoint this import's
                self.stored[key] = Stored(etag, opts.rows(), opts.source_column, job)
            cp = self.stored[key]
            at += len(part)
            chunk += 1
            cp.job, cp.next_record, cp.chunk = job, at, chunk
            cp.written += len(part) - len(refused)
            cp.rejected += len(refused)
            cp.done = at >= len(records)
            if cp.done:
                return outcome, rejected

    def write(self, values: dict[str, Value], opts: Options, identity: str) -> bool:
        """Write one record's row as the sink does; whether the database took it. A field the record lacks is
        the column's default in a new row, left as it is in a row an upsert updates, whatever fields the other
        rows of its chunk have. The database checks the row an ``INSERT`` of its fields makes, also where an
        upsert then updates the row of its key (``ON CONFLICT`` comes after the NOT NULL and check constraints)."""
        row: dict[str, Any] = {}
        for name, value in values.items():
            if opts.handler == "model_upper" and name == "name" and isinstance(value, str):
                value = value.upper()
            row[name] = pg_integer(value) if name in ("k", "qty") else value
            if row[name] is BAD:
                return False
        if opts.source_column:
            row["src"] = identity
        if row.get("k") is None:  # NOT NULL (insert), a NULL key (upsert)
            return False
        found = next((r for r in self.rows if r["k"] == row["k"]), None) if self.keyed else None
        if found is not None and opts.mode == "insert":
            return False  # a duplicate key
        new = {**dict.fromkeys(COLUMNS), "qty": self.qty, **row}
        qty = new["qty"]
        if new["name"] is None or (qty is None and self.qty is not None) or (qty is not None and qty < 0):
            return False
        if found is None:
            self.rows.append(new)
        else:
            found.update(row)
        return True


def _order(row: dict[str, Any]) -> tuple[Any, ...]:
    return tuple((v is None, v if v is not None else "") for v in (row[c] for c in COLUMNS))


# ---------------------------------------------------------------- the servers, the faults

_FAULTS_DDL = [
    "CREATE TABLE public.model_faults (target text, source_key text, chunk integer)",
    "CREATE FUNCTION public.model_fault() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
    "IF EXISTS (SELECT 1 FROM public.model_faults f WHERE f.target = NEW.target AND f.source_key = NEW.source_key "
    "AND f.chunk = NEW.chunk) THEN RAISE EXCEPTION 'injected fault: a checkpoint not advanced'; END IF; "
    "RETURN NEW; END $$",
    "CREATE TRIGGER model_fault BEFORE UPDATE ON public.s3batch_checkpoints FOR EACH ROW "
    "EXECUTE FUNCTION public.model_fault()",
]
"""A fault between a chunk's rows and its checkpoint: the ``UPDATE`` advancing a file's checkpoint to chunk N
raises while ``public.model_faults`` lists (table, key, N); the chunk's transaction rolls back."""


@pytest.fixture(scope="module")
def pg() -> Iterator[PostgresServer]:
    bindir = server_bindir()
    if bindir is None:
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) not found: pg_config --bindir, /usr/lib/postgresql")
    server = PostgresServer(bindir)
    try:
        server.start()
    except (RuntimeError, KeyError) as err:  # KeyError: no postgres user to run it as root
        server.remove()
        pytest.skip(f"cannot start a PostgreSQL server here: {err}")
    try:
        server.execute("CREATE TABLE public.model_first (k integer)")
        pools = PostgresPools(Settings.explicit(postgres_dsns={"test": server.dsn}))
        try:  # the sink creates its checkpoint table on first use: the fault trigger goes on it
            pools.columns(PostgresSink(type="postgres", connection="test", table="model_first"))
        finally:
            pools.close()
        for statement in _FAULTS_DDL:
            server.execute(statement)
        yield server
    finally:
        server.remove()


_WRITE_FAULT: dict[str, tuple[int, Callable[[], None]]] = {}
"""Source key -> (chunk, what to do): done in that chunk's transaction, after its rows, where the sink writes
the chunk's rejects file (``FileOutput.write_rejects``), before its commit."""


@pytest.fixture
def write_faults(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sink's rejects write does what :data:`_WRITE_FAULT` says first (a database restart in a chunk's
    transaction)."""
    original = FileOutput.write_rejects

    def write_rejects(self: FileOutput, chunk: int, new: Any, rejects: list[tuple[int, bytes]]) -> None:
        fault = _WRITE_FAULT.get(self.key)
        if fault is not None and fault[0] == chunk:
            del _WRITE_FAULT[self.key]
            fault[1]()
        original(self, chunk, new, rejects)

    monkeypatch.setattr(FileOutput, "write_rejects", write_rejects)


class Child:
    """A process that runs one attempt of the activity, started ahead (its imports take a second or two) and
    waiting for its request on stdin; SIGKILLed by itself in the chunk's transaction it is told
    (:func:`_child_main`)."""

    def __init__(self, log: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", MODULE], cwd=ROOT, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=log.open("ab"), text=True,
        )

    def run(self, request: dict[str, Any]) -> dict[str, Any] | None:
        """The attempt's result or error; None when it was killed."""
        out, _ = self.proc.communicate(json.dumps(request) + "\n", timeout=120)
        if self.proc.returncode == -signal.SIGKILL:
            return None
        assert self.proc.returncode == 0, f"the child failed ({self.proc.returncode}): see its log"
        return json.loads(out.splitlines()[-1])  # type: ignore[no-any-return]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def _child_main() -> None:
    """One attempt of ``process_file`` (the request on stdin), killing its own process (SIGKILL) in the
    transaction of chunk ``kill_at`` of the file, after the chunk's rows, before its commit."""
    request = json.loads(sys.stdin.readline())
    req = ProcessFileInput.model_validate_json(request["req"])
    original = FileOutput.write_rejects

    def write_rejects(self: FileOutput, chunk: int, new: Any, rejects: list[tuple[int, bytes]]) -> None:
        if self.key == req.obj.key and chunk == request["kill_at"]:
            os.kill(os.getpid(), signal.SIGKILL)
        original(self, chunk, new, rejects)

    FileOutput.write_rejects = write_rejects  # type: ignore[method-assign]
    file_job.FAST_MIN_BYTES = 0 if request["fast"] else file_job.FAST_MIN_BYTES
    file_setup.BEHIND_MIN_BYTES = 0 if request["behind"] else file_setup.BEHIND_MIN_BYTES
    acts = S3Activities(make_client(), Settings.explicit(postgres_dsns={"test": request["dsn"]}))
    try:
        result = ActivityEnvironment().run(acts.process_file, req)
        answer: dict[str, Any] = {"result": result.model_dump(mode="json")}
    except ApplicationError as err:
        answer = {"error": err.type, "non_retryable": err.non_retryable, "message": str(err)}
    finally:
        acts.close()
    sys.stdout.write(json.dumps(answer) + "\n")


@dataclass
class Env:
    """What the machines share: the servers, the buckets, a warm child process."""

    s3: Any
    pg: PostgresServer
    src: str
    out: str
    log: Path
    warm: Child | None = None
    jobs: tuple[asyncio.AbstractEventLoop, Client, str] | None = None
    """For :class:`JobMachine`: the event loop of the worker, a client, its task queue."""

    def child(self) -> Child:
        """A child process, already started; the next one starts at once (ready when the next kill comes)."""
        child, self.warm = self.warm or Child(self.log), Child(self.log)
        return child

    def close(self) -> None:
        if self.warm is not None:
            self.warm.stop()


ENV: list[Env] = []
"""The running test's :class:`Env` (hypothesis makes the machines itself: they find it here)."""

Got = FileResult | ApplicationError

STATS: Counter[str] = Counter()
"""What the run did (steps, imports by outcome, crashes, restarts): printed at its end."""


@contextlib.contextmanager
def _paths(opts: Options) -> Iterator[None]:
    """The worker's paths the options ask: the CSV fast path and transactions written behind, for a small file."""
    saved = file_job.FAST_MIN_BYTES, file_setup.BEHIND_MIN_BYTES
    file_job.FAST_MIN_BYTES = 0 if opts.fast else saved[0]
    file_setup.BEHIND_MIN_BYTES = 0 if opts.behind else saved[1]
    try:
        yield
    finally:
        file_job.FAST_MIN_BYTES, file_setup.BEHIND_MIN_BYTES = saved


# ---------------------------------------------------------------- the machine

FILES = st.sampled_from(["f0", "f1", "f2"])
KILLS = ["kill", "trigger", "restart", "handler"]
RESUME = st.sampled_from([True, True, False])


class SinkMachine(RuleBasedStateMachine):
    """One table (of a drawn shape) and up to three files imported into it, against :class:`TableModel`."""

    def __init__(self) -> None:
        super().__init__()
        self.env = ENV[-1]
        self.tag = uuid.uuid4().hex[:8]
        self.table = ""
        self.model = TableModel(keyed=True)
        self.files: dict[str, tuple[str, Version, str, int]] = {}
        """File name -> its key, current version, ETag and size."""
        self.last: dict[str, Options] = {}
        """File name -> the options of its last import."""
        self.jobs = 0
        self.since_restart = 0
        self.acts = S3Activities(self.env.s3, Settings.explicit(postgres_dsns={"test": self.env.pg.dsn}))

    def teardown(self) -> None:
        self.acts.close()
        _HANDLER_FAULT.clear()
        _WRITE_FAULT.clear()
        if self.table:
            self.env.pg.execute("DELETE FROM public.model_faults WHERE target = %s", (f"public.{self.table}",))

    # ------------------------------------------------------------ set-up

    @initialize(shape=st.sampled_from(sorted(SHAPES)))
    def make_table(self, shape: str) -> None:
        self.shape = shape
        self.table = f"model_{shape.replace('-', '_')}_{self.tag}"
        self.env.pg.execute(f"CREATE TABLE public.{self.table} ({SHAPES[shape].columns})")
        self.model = TableModel(keyed=SHAPES[shape].keyed, qty=SHAPES[shape].qty)

    def _file(self, data: st.DataObject, name: str | None = None) -> str:
        """A file (drawn), written first when it does not exist yet."""
        name = name or data.draw(FILES, label="file")
        if name not in self.files:
            self._write(name, data.draw(versions(), label="first version"))
        return name

    def _write(self, name: str, version: Version) -> None:
        """Put ``version`` of the file (its format is its key's)."""
        key = self.files[name][0] if name in self.files else f"{self.tag}/{name}.{version.fmt}"
        body, _ = version.body()
        etag = self.env.s3.put_object(Bucket=self.env.src, Key=key, Body=body)["ETag"].strip('"')
        self.files[name] = (key, version, etag, len(body))

    def _fmt(self, name: str) -> str:
        return self.files[name][1].fmt

    # ------------------------------------------------------------ rules

    @rule(data=st.data())
    def import_file(self, data: st.DataObject) -> None:
        """Any file with any options: a first import, or another one of a file imported before."""
        name = self._file(data)
        self._import(name, data.draw(options(self.model.keyed, self._fmt(name)), label="options"))

    @rule(data=st.data())
    def import_again_with_the_same_options(self, data: st.DataObject) -> None:
        name = self._imported(data)
        self._import(name, self.last[name])

    @rule(data=st.data())
    def import_again_with_another_chunk_size(self, data: st.DataObject) -> None:
        """Options that do not change the rows: nothing doubled (done, or resumed where it stopped)."""
        name = self._imported(data)
        other = dataclasses.replace(
            self.last[name], chunk_records=data.draw(CHUNKS), fast=data.draw(st.booleans()),
            behind=data.draw(st.booleans()), ratio=data.draw(st.sampled_from([None, 1.0])),
        )
        self._import(name, other)

    @rule(data=st.data())
    def import_again_with_other_rows(self, data: st.DataObject) -> None:
        """Another handler, column mapping or mode: refused in insert mode, over the rows by key in upsert mode,
        replacing the file's earlier rows with ``on_reimport: replace``."""
        name = self._imported(data)
        last = self.last[name]
        change = data.draw(st.sampled_from(["handler", "mapping", "mode"]), label="change")
        if change == "mapping" and self._fmt(name) == "csv":
            mapping = data.draw(st.sampled_from([m for m in MAPPINGS if m != last.header]), label="mapping")
            other = dataclasses.replace(last, header=mapping)
        elif change == "mode" and self.model.keyed:
            other = dataclasses.replace(last, mode="upsert" if last.mode == "insert" else "insert")
        else:
            other = dataclasses.replace(last, handler="model_upper" if last.handler == "passthrough" else "passthrough")
        if data.draw(st.booleans(), label="replace"):
            other = dataclasses.replace(other, on_reimport="replace", source_column="src")
        self._import(name, other)

    @rule(data=st.data())
    def new_version(self, data: st.DataObject) -> None:
        """The file rewritten (a new ETag), imported with its last options (or replacing its earlier rows)."""
        name = self._imported(data)
        self._write(name, data.draw(versions(self._fmt(name)), label="new version"))
        opts = self.last[name]
        if data.draw(st.booleans(), label="replace"):
            opts = dataclasses.replace(opts, on_reimport="replace", source_column="src")
        self._import(name, opts)

    @rule(data=st.data(), kind=st.sampled_from(KILLS), at=st.integers(0, 3), resume=RESUME)
    def crash_and_resume(self, data: st.DataObject, kind: str, at: int, resume: bool) -> None:
        """A crash in the transaction of chunk ``at`` (of those the import writes), then the next attempt; or none
        (``resume`` False: the job failed there for good), the file left half-done for the next imports."""
        name = self._file(data)
        opts = data.draw(options(self.model.keyed, self._fmt(name)), label="options")
        key, _, etag, _ = self.files[name]
        if self.model.decide(key, etag, opts).kind != "run":  # refused or done: a new file crashes instead
            name = f"c{len(self.files)}"
            self._write(name, data.draw(versions(), label="crashing file"))
        if kind == "handler":
            opts = dataclasses.replace(opts, handler="model_upper")
        self._import(name, opts, (kind, at), resume)

    @precondition(lambda self: self.since_restart >= 3)
    @rule()
    def restart_the_database(self) -> None:
        """Between imports (a few imports after the last one): the worker's pools hold connections the server
        closed."""
        self.env.pg.restart()
        self.since_restart = 0
        STATS["restart between imports"] += 1

    def _imported(self, data: st.DataObject) -> str:
        """A file imported before (its last options), else a file first imported now."""
        if not self.last:
            name = self._file(data)
            self._import(name, data.draw(options(self.model.keyed, self._fmt(name)), label="options"))
        return data.draw(st.sampled_from(sorted(self.last)), label="imported file")

    # ------------------------------------------------------------ checks after every step

    @invariant()
    def the_table_is_the_model(self) -> None:
        STATS["checks"] += 1
        if not self.table:
            return
        found = [dict(zip(COLUMNS, r, strict=True)) for r in self.env.pg.execute(
            f"SELECT {', '.join(COLUMNS)} FROM public.{self.table}"
        )]
        assert sorted(found, key=_order) == sorted(self.model.rows, key=_order)
        self._filled_columns_hold()

    @invariant()
    def each_files_checkpoint_is_the_models(self) -> None:
        if not self.table:
            return
        rows = self.env.pg.execute(
            "SELECT source_key, etag, checkpoint FROM public.s3batch_checkpoints WHERE target = %s",
            (f"public.{self.table}",),
        )
        found = {str(k): (e, c["next_record"], c["chunk"], c["records_written"], c["rejected"], c["done"])
                 for k, e, c in rows}  # type: ignore[index]
        assert found == {
            k: (s.etag, s.next_record, s.chunk, s.written, s.rejected, s.done) for k, s in self.model.stored.items()
        }

    def _filled_columns_hold(self) -> None:
        """The columns the table fills: identity and serial values given and distinct, defaults, generated."""
        if self.shape in ("identity-always", "identity-by-default", "serial", "fact"):
            [(n, ids, nulls)] = self.env.pg.execute(
                f"SELECT count(*), count(DISTINCT id), count(*) - count(id) FROM public.{self.table}"
            )
            assert (ids, nulls) == (n, 0)
        checks = {
            "default-now": "loaded_at IS NULL",
            "generated": "name_len IS DISTINCT FROM length(name)",
            "subset": "amount IS NOT NULL OR seen IS NOT NULL OR batch <> 7",
        }
        if self.shape in checks:
            assert self.env.pg.execute(f"SELECT count(*) FROM public.{self.table} WHERE {checks[self.shape]}") == [(0,)]

    # ------------------------------------------------------------ an import, through the real sink

    def _import(self, name: str, opts: Options, fault: tuple[str, int] | None = None, resume: bool = True) -> None:
        """Import the file with ``opts`` as a job's activity does (its attempts, each resuming from the database's
        checkpoint); with a ``fault`` (kind, chunk), the first attempt crashes in that chunk's transaction, and
        the table is checked between the attempts (without ``resume``, no attempt follows)."""
        key, version, etag, size = self.files[name]
        self.jobs += 1
        self.since_restart += 1
        job = f"job-{self.tag}-{self.jobs}"
        identity = f"s3://{self.env.src}/{key}#{etag}"
        req = ProcessFileInput(
            job_id=job, bucket=self.env.src, obj=ObjectRef(key=key, etag=etag, size=size),
            output_bucket=self.env.out, output_prefix=f"{self.tag}/{job}/", handler=opts.handler, format="auto",
            max_record_bytes=MAX_RECORD_BYTES, chunk_records=opts.chunk_records, max_rejected_ratio=opts.ratio,
            sink=opts.sink(self.table), header=list(opts.header) if opts.header else None,
        )
        self.last[name] = opts
        attempt, heartbeat, rejected = 1, [], []
        if fault is not None:
            first = self.model.decide(key, etag, opts)
            stop: int | None = first.chunk + fault[1]
            if fault[0] == "handler" and first.start + fault[1] * opts.chunk_records >= len(version.read(opts.header)):
                stop = None  # a chunk of no records: the handler is not called
            outcome, rejected = self.model.run(key, identity, version, opts, job, stop=stop)
            crashed, heartbeat = self._crash(req, opts, fault[0], stop)
            stored = self.model.stored.get(key)
            if outcome.kind != "run" or (stored is not None and stored.done and stored.job == job):
                assert crashed is not None, "killed, but the file ended before the chunk of the kill"
                self._check(key, job, opts, outcome, crashed, rejected)  # it ended before the fault
                STATS[f"import {opts.mode} {outcome.kind}"] += 1
                return
            assert crashed is None or (isinstance(crashed, ApplicationError) and not crashed.non_retryable), crashed
            self.the_table_is_the_model()  # exactly the chunks committed before the crash
            self.each_files_checkpoint_is_the_models()
            if not resume:
                STATS[f"import {opts.mode} left after a {fault[0]}"] += 1
                return
            attempt = 2
        outcome, more = self.model.run(key, identity, version, opts, job)
        got = self._whole(req, opts, attempt, heartbeat)
        self._check(key, job, opts, outcome, got, rejected + more)
        STATS[f"import {opts.mode} {outcome.kind}" + (f" after a {fault[0]}" if attempt > 1 and fault else "")] += 1

    def _crash(
        self, req: ProcessFileInput, opts: Options, kind: str, chunk: int | None
    ) -> tuple[Got | None, list[Any]]:
        """The first attempt, crashing in the transaction of ``chunk`` (if the file has it): its result or error
        (None: killed), and its last heartbeat. The pool's connections a restart closed are dropped first (the
        attempt fails where the fault is, not where a dead connection is)."""
        key = req.obj.key
        self.acts.pools.pool("test").check()
        if kind == "kill":
            request = {"dsn": self.env.pg.dsn, "req": req.model_dump_json(), "kill_at": chunk, "fast": opts.fast,
                       "behind": opts.behind}
            answer = self.env.child().run(request)
            if answer is None:
                return None, []
            if "result" in answer:
                return FileResult.model_validate(answer["result"]), []
            return ApplicationError(answer["message"], type=answer["error"], non_retryable=answer["non_retryable"]), []
        target = f"public.{self.table}"
        if kind == "trigger":
            self.env.pg.execute("INSERT INTO public.model_faults VALUES (%s, %s, %s)", (target, key, chunk + 1))
        elif kind == "restart":
            _WRITE_FAULT[key] = (chunk, self._restart)
        else:
            _HANDLER_FAULT[key] = chunk
        try:
            with _paths(opts):
                return self._attempt(req, 1, [])
        finally:
            _WRITE_FAULT.pop(key, None)
            _HANDLER_FAULT.pop(key, None)
            self.env.pg.execute("DELETE FROM public.model_faults WHERE target = %s", (target,))

    def _restart(self) -> None:
        self.env.pg.restart()

    def _whole(self, req: ProcessFileInput, opts: Options, first: int, heartbeat: list[Any]) -> Got:
        """The import from attempt ``first`` to its end (:meth:`_attempts`)."""
        return self._attempts(req, opts, first, heartbeat)

    def _attempts(self, req: ProcessFileInput, opts: Options, first: int, heartbeat: list[Any]) -> Got:
        """Attempts from ``first`` until one succeeds or fails for good (as Temporal retries the activity), each
        given the last heartbeat; only a database restarted (a dead connection of the pool) may fail one."""
        with _paths(opts):
            for attempt in range(first, first + 12):
                got, heartbeat = self._attempt(req, attempt, heartbeat)
                if isinstance(got, FileResult) or got.non_retryable:
                    return got
                assert got.type == "SinkError" and re.search(r"OperationalError|AdminShutdown|57P0", str(got)), got
        raise AssertionError(f"{req.obj.key}: still failing after 12 attempts: {got}")

    def _attempt(self, req: ProcessFileInput, attempt: int, heartbeat: list[Any]) -> tuple[Got, list[Any]]:
        env = ActivityEnvironment()
        env.info = dataclasses.replace(env.info, attempt=attempt, heartbeat_details=heartbeat)
        beats: list[Any] = []
        env.on_heartbeat = lambda *details: beats.append(details)
        try:
            got: Got = env.run(self.acts.process_file, req)
        except ApplicationError as err:
            got = err
        if beats:
            heartbeat = [json.loads(beats[-1][0].model_dump_json()), *beats[-1][1:]]
        return got, heartbeat

    def _check(self, key: str, job: str, opts: Options, outcome: Outcome, got: Got, rejected: list[int]) -> None:
        """The import's result (or failure) and rejects files as the model says: counts of the whole file
        (``records_written`` + ``rejected`` = ``records``), none written where an earlier job wrote the file."""
        lines = [r["line"] for r in read_jsonl(self.env.s3, self.env.out, f"{self.tag}/{job}/{key}/", kind="rejects")]
        if outcome.kind == "refused":
            assert isinstance(got, ApplicationError) and got.type == "InvalidInput" and got.non_retryable, got
            assert "Nothing was written" in str(got), got
            assert lines == []
            return
        assert sorted(lines) == sorted(rejected)
        stored = self.model.stored[key]
        if stored.next_record and stored.rejected == stored.next_record and opts.ratio is None:
            assert isinstance(got, ApplicationError) and got.type == "TooManyRejects" and got.non_retryable, got
            return
        assert isinstance(got, FileResult), got
        earlier = outcome.kind == "done" and stored.job != job
        assert (got.records, got.rejected, got.chunks) == (stored.next_record, stored.rejected, stored.chunk)
        written = (0, stored.written) if earlier else (stored.written, None)
        assert (got.records_written, got.already_written) == written
        assert got.records_written + got.rejected + (got.already_written or 0) == got.records
        assert got.resumed_from_record == (stored.next_record if outcome.kind == "done" else outcome.start)


class JobMachine(SinkMachine):
    """The same rules and model, each import a whole job (the workflow, its file or group activity, Temporal's
    retries) on an in-process worker; a crash's first attempt and its resume are the activity's, as above."""

    def _whole(self, req: ProcessFileInput, opts: Options, first: int, heartbeat: list[Any]) -> Got:
        if first > 1:
            return super()._whole(req, opts, first, heartbeat)
        assert self.env.jobs is not None
        loop, client, task_queue = self.env.jobs
        job = S3BatchInput.model_validate({
            "bucket": req.bucket, "prefix": req.obj.key, "output_bucket": req.output_bucket,
            "output_prefix": req.output_prefix, "handler": req.handler, "chunk_records": req.chunk_records,
            "sink": opts.sink(self.table).model_dump(), **({"header": req.header} if req.header else {}),
            **({"max_rejected_ratio": opts.ratio} if opts.ratio is not None else {}),
        })

        async def run() -> None:
            with contextlib.suppress(WorkflowFailureError):  # a failed file fails the job: its report says why
                await client.execute_workflow(S3BatchWorkflow.run, job, id=req.job_id, task_queue=task_queue)

        with _paths(opts):
            asyncio.run_coroutine_threadsafe(run(), loop).result(timeout=240)
        STATS["whole jobs"] += 1
        [entry] = report(self.env.s3, req.output_bucket, req.output_prefix)["files"]
        if entry["status"] == "succeeded":
            return FileResult.model_validate(entry)
        return ApplicationError(entry["error"], type=entry["error"].partition(":")[0], non_retryable=True)


# ---------------------------------------------------------------- the tests


@pytest.mark.timeout(max(300, EXAMPLES * 40))
def test_the_table_always_holds_what_the_model_says(
    s3: Any, buckets: tuple[str, str], pg: PostgresServer, tmp_path: Path, write_faults: None
) -> None:
    """The state machine's derandomized examples (:data:`EXAMPLES` of at most :data:`STEPS` steps)."""
    ENV.append(Env(s3, pg, *buckets, tmp_path / "child.log"))
    STATS.clear()
    started = time.monotonic()
    try:
        run_state_machine_as_test(SinkMachine, settings=settings(
            max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None, derandomize=True,
            suppress_health_check=list(HealthCheck), phases=PHASES,
        ))
    finally:
        ENV.pop().close()
        print(f"model run: {EXAMPLES} examples, {time.monotonic() - started:.0f} s: {dict(sorted(STATS.items()))}")


def test_a_real_sigkill_in_a_chunks_transaction_then_the_resume(
    s3: Any, buckets: tuple[str, str], pg: PostgresServer, tmp_path: Path, write_faults: None
) -> None:
    """The machine's crash rule with a real SIGKILL, for certain (the derandomized examples may draw no kill that
    lands in a chunk): a CSV of 12 rows in insert mode killed in chunk 2's transaction then resumed; a JSON Lines
    file upserted with its transactions written behind, killed in chunk 1's and left half-done, then imported by
    another job with another chunk size (it resumes where the table's checkpoint is). The table is the model's
    after the kill and after each import."""
    ENV.append(Env(s3, pg, *buckets, tmp_path / "child.log"))
    STATS.clear()
    machine = SinkMachine()
    try:
        machine.make_table("identity-by-default")
        machine._write("f0", Version("csv", tuple((str(i), f"n{i}", str(i)) for i in range(12))))
        machine._import("f0", Options(chunk_records=3), ("kill", 2))
        machine._write("f1", Version("jsonl", tuple((100 + i % 5, f"m{i}", -i if i == 7 else i) for i in range(10))))
        upsert = Options(mode="upsert", chunk_records=2, behind=True)
        machine._import("f1", upsert, ("kill", 1), resume=False)
        machine._import("f1", dataclasses.replace(upsert, chunk_records=3))
        assert len(machine.model.rows) == 12 + 5
    finally:
        machine.teardown()
        ENV.pop().close()
    assert (STATS["import insert run after a kill"], STATS["import upsert left after a kill"]) == (1, 1), STATS


JOB_EXAMPLES = int(os.environ.get("S3BATCH_MODEL_JOB_EXAMPLES") or 3)
"""Examples of :class:`JobMachine` (a job takes a second or two)."""


@pytest.mark.timeout(max(300, JOB_EXAMPLES * 90))
async def test_the_table_holds_what_the_model_says_through_jobs_on_a_worker(
    stack: Stack, client: Client, s3: Any, buckets: tuple[str, str], pg: PostgresServer, task_queue: str,
    tmp_path: Path, write_faults: None,
) -> None:
    """The machine's imports as whole jobs on an in-process worker (:class:`JobMachine`): a few examples."""
    plain = await Client.connect(stack.config.temporal_address)
    worker_settings = Settings.explicit(postgres_dsns={"test": pg.dsn})
    plugin = S3BatchPlugin(make_client(), settings=worker_settings, register_search_attributes=False)
    async with Worker(plain, task_queue=task_queue, plugins=[plugin], max_concurrent_activities=4):
        ENV.append(Env(s3, pg, *buckets, tmp_path / "child.log", jobs=(asyncio.get_running_loop(), client, task_queue)))
        STATS.clear()
        started = time.monotonic()
        try:
            await asyncio.to_thread(run_state_machine_as_test, JobMachine, settings=settings(
                max_examples=JOB_EXAMPLES, stateful_step_count=8, deadline=None, derandomize=True,
                suppress_health_check=list(HealthCheck), phases=PHASES,
            ))
        finally:
            ENV.pop().close()
            took = time.monotonic() - started
            print(f"model run (jobs): {JOB_EXAMPLES} examples, {took:.0f} s: {dict(sorted(STATS.items()))}")


# ---------------------------------------------------------------- defects the model found, pinned


def _commit_in_chunks(
    s3: Any, buckets: tuple[str, str], pools: PostgresPools, spec: PostgresSink, rows: list[dict[str, Any]], size: int
) -> Checkpoint:
    """``rows`` (source lines 2, 3, ...) committed through the real sink in chunks of ``size``; the last checkpoint."""
    src, out = buckets
    key = f"in/{spec.table}.jsonl"
    folder = FileOutput(
        s3, bucket=out, output_prefix="o/", key=key, etag="e1", fingerprint="f", secret=None, put_params={},
        log_extra={},
    )
    sink = PostgresOutput(spec, folder, pools, job_id="j", bucket=src, where=f"s3://{src}/{key}")
    cp = sink.resume_point(None, Checkpoint(etag="e1", fingerprint="f"), fresh=False)
    for at in range(0, len(rows), size):
        part = rows[at : at + size]
        new = cp.model_copy(update={
            "chunk": cp.chunk + 1, "next_record": at + len(part), "records_written": cp.records_written + len(part),
            "line": at + len(part) + 1, "done": at + size >= len(rows),
        })
        cp = sink.commit(cp, new, [encode_json(r) for r in part], [], list(range(at + 2, at + 2 + len(part))))
    return cp


@pytest.mark.parametrize("size", [4, 1], ids=["one-chunk", "a-chunk-each"])
def test_an_upsert_row_a_later_row_of_its_key_writes_over_is_still_checked(
    s3: Any, buckets: tuple[str, str], pg: PostgresServer, size: int
) -> None:
    """Upsert: a row the database refuses (a NULL name, a negative quantity) followed in the same chunk by a good
    row of the same key. The last row of the key wins, and the refused one is a reject as it is when the two
    rows are in chunks of their own: the chunk size decides where a chunk ends, not which rows are rejected.
    (Found by the model: the stage's ``DISTINCT ON`` kept only the key's last row, so the earlier one never
    reached the database and was counted as written.)"""
    table = f"model_superseded_{uuid.uuid4().hex[:8]}"
    pg.execute(f"CREATE TABLE public.{table} (k integer PRIMARY KEY, name text NOT NULL, qty integer CHECK (qty >= 0))")
    spec = PostgresSink(type="postgres", connection="test", table=table, mode="upsert", key=["k"])
    rows: list[dict[str, Any]] = [
        {"k": 2, "name": None, "qty": 1}, {"k": 2, "name": "b", "qty": 2},
        {"k": 3, "name": "c", "qty": -1}, {"k": 3, "name": "d", "qty": 3},
    ]
    pools = PostgresPools(Settings.explicit(postgres_dsns={"test": pg.dsn}))
    try:
        cp = _commit_in_chunks(s3, buckets, pools, spec, rows, size)
    finally:
        pools.close()
    assert pg.execute(f"SELECT k, name, qty FROM public.{table} ORDER BY k") == [(2, "b", 2), (3, "d", 3)]
    assert (cp.records_written, cp.rejected) == (2, 2)
    rejects = read_jsonl(s3, buckets[1], f"o/in/{table}.jsonl/", kind="rejects")
    assert [(r["line"], r["reason"].split("SQLSTATE ")[1][:5]) for r in rejects] == [(2, "23502"), (4, "23514")]


@pytest.mark.parametrize("size", [2, 1], ids=["one-chunk", "a-chunk-each"])
@pytest.mark.parametrize("mode", ["insert", "upsert"])
def test_a_field_an_output_lacks_is_left_to_the_table_whatever_the_rest_of_its_chunk(
    s3: Any, buckets: tuple[str, str], pg: PostgresServer, mode: str, size: int
) -> None:
    """JSON outputs naming other fields: the first lacks ``qty``, the second names it. Insert: the first row gets
    the column's default, as in a chunk of its own (it got NULL, and its NOT NULL refused it, where the chunk
    held a row naming the field). Upsert: the row of key 1 keeps its ``qty`` (it was set to NULL where another
    row of the chunk named the field). Found by the model (JSON objects without some fields): the table and the
    rejects depended on where chunks end."""
    table = f"model_lacks_{uuid.uuid4().hex[:8]}"
    default = "NOT NULL DEFAULT 1" if mode == "insert" else ""
    pg.execute(f"CREATE TABLE public.{table} (k integer PRIMARY KEY, name text, qty integer {default})")
    if mode == "upsert":
        pg.execute(f"INSERT INTO public.{table} VALUES (1, 'old', 5)")
    spec = PostgresSink(type="postgres", connection="test", table=table, mode=mode,  # type: ignore[arg-type]
                        key=["k"] if mode == "upsert" else None)
    rows: list[dict[str, Any]] = [{"k": 1, "name": "a"}, {"k": 2, "name": "b", "qty": 3}]
    pools = PostgresPools(Settings.explicit(postgres_dsns={"test": pg.dsn}))
    try:
        cp = _commit_in_chunks(s3, buckets, pools, spec, rows, size)
    finally:
        pools.close()
    assert (cp.records_written, cp.rejected) == (2, 0)
    first = 1 if mode == "insert" else 5
    assert pg.execute(f"SELECT k, name, qty FROM public.{table} ORDER BY k") == [(1, "a", first), (2, "b", 3)]


@pytest.mark.parametrize("size", [2, 1], ids=["one-chunk", "a-chunk-each"])
def test_an_upsert_output_without_its_key_is_a_reject_whatever_the_rest_of_its_chunk(
    s3: Any, buckets: tuple[str, str], pg: PostgresServer, size: int
) -> None:
    """An output without the upsert key is a reject (a NULL key), also in a chunk where no output names the key
    (the file failed there, InvalidInput, where the same row was a reject in a chunk with keyed rows)."""
    table = f"model_keyless_{uuid.uuid4().hex[:8]}"
    pg.execute(f"CREATE TABLE public.{table} (k integer PRIMARY KEY, name text)")
    spec = PostgresSink(type="postgres", connection="test", table=table, mode="upsert", key=["k"])
    pools = PostgresPools(Settings.explicit(postgres_dsns={"test": pg.dsn}))
    try:
        cp = _commit_in_chunks(s3, buckets, pools, spec, [{"name": "a"}, {"k": 2, "name": "b"}], size)
    finally:
        pools.close()
    assert (cp.records_written, cp.rejected) == (1, 1)
    assert pg.execute(f"SELECT k, name FROM public.{table}") == [(2, "b")]
    [reject] = read_jsonl(s3, buckets[1], f"o/in/{table}.jsonl/", kind="rejects")
    assert reject["line"] == 2 and "NULL keys cannot be upserted" in reject["reason"], reject


@pytest.mark.parametrize("size", [2, 1], ids=["one-chunk", "a-chunk-each"])
def test_an_output_naming_no_field_is_a_row_of_the_tables_defaults(
    s3: Any, buckets: tuple[str, str], pg: PostgresServer, size: int
) -> None:
    """Insert: an empty JSON object is a row of the table's defaults, as in a chunk with other rows (in a chunk, or
    now a run of outputs, of its own it was ``COPY t () FROM STDIN``, a syntax error: the chunk failed and was
    retried until the file failed). Found by the model (a JSON object without any of the fields)."""
    table = f"model_empty_{uuid.uuid4().hex[:8]}"
    pg.execute(f"CREATE TABLE public.{table} (k integer, name text, qty integer NOT NULL DEFAULT 1)")
    spec = PostgresSink(type="postgres", connection="test", table=table)
    pools = PostgresPools(Settings.explicit(postgres_dsns={"test": pg.dsn}))
    try:
        cp = _commit_in_chunks(s3, buckets, pools, spec, [{}, {"k": 1, "name": "a"}], size)
    finally:
        pools.close()
    assert (cp.records_written, cp.rejected) == (2, 0)
    assert pg.execute(f"SELECT k, name, qty FROM public.{table} ORDER BY k") == [(1, "a", 1), (None, None, 1)]


if __name__ == "__main__":
    _child_main()

"""Handlers: what s3batch does with each chunk of records.

A handler receives the parsed records of a chunk and returns output records and rejects. Register
one with a decorator; the job input names it with ``"handler": "name"``::

    from s3batch.handlers import record_handler

    @record_handler("uppercase_names")
    def uppercase_names(value: dict) -> dict:
        return {**value, "name": value["name"].upper()}

A per-record handler (``@record_handler``) turns each record into one output value; returning
``None`` drops the record (counted as ``dropped`` in the report), raising turns it into a reject
carrying the error. A chunk handler (``@chunk_handler``) gets the whole list and returns a
:class:`HandlerResult`; an exception it raises fails the attempt (Temporal retries the chunk), so it
refuses single records with :class:`Reject`.

``@chunk_handler`` is the batch API: it gets the chunk's records at once (a list of ``Record``:
``value``, the parsed record, and ``line``), so a whole chunk can go through one call of native code
instead of a Python call per record. Give each output its record's line (``lines``) and say how many
records were dropped (``dropped=0``: s3batch then checks that every record is an output or a
reject). ``customers`` (below) validates a list in one pydantic-core call::

    @chunk_handler("customers")
    def customers(records: Sequence[Record]) -> HandlerResult:
        rows = _customer_rows([r.value for r in records])  # one call: each row's JSON, or None
        if None not in rows:  # the common case: the call took every row
            return HandlerResult(rows, [], encoded=True, dropped=0, lines=[r.line for r in records])
        ...  # the rows it refused, one by one: Customer.model_validate, an output or a Reject

One call is faster only when it saves work per record. ``TypeAdapter(list[Customer])`` does not: an
object per row either way, and the garbage collector walking them (0.7-0.9x the per-row loop on the
benchmark rows). :func:`_fast_rows` does: the model's own field schemas check each row into a plain
dict and write its JSON in the same call, the slowest checks (the ``Decimal`` amount, the datetime)
are narrowed to the strings whose JSON is the input itself, and only the rows the call refuses are
validated by the model, for exact rejects (about 2.7x the per-row loop).

On the fast CSV path a chunk handler may also have a *block encoder* (:mod:`s3batch.columns`): a whole
block of rows as Arrow columns, the documents of the rows it vouches for written by native kernels, the
others handed to the handler as records; ``customers`` has one.

Handlers must be deterministic (the same records give the same output): a retried chunk rewrites
its output under the same key, and identical bytes are what make that rewrite harmless.

A handler with side effects (an API call, a message) gets a stable idempotency key per record and
per chunk from :func:`chunk_context`: a chunk is handled at least once (again after a crash or a
retry, from its start), so the side effect must be deduplicated by the key on the other side.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime
import hashlib
import operator
from collections.abc import Callable, Iterator, Sequence
from decimal import Decimal
from typing import Annotated, Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError
from pydantic_core import SchemaSerializer, SchemaValidator, core_schema

from s3batch.errors import UnknownHandler
from s3batch.formats.common import Record
from s3batch.jsonvalues import encode_json
from s3batch.validation import describe_validation_error


class Reject(NamedTuple):
    """A record the handler refused."""

    line: int
    reason: str
    """Why, as written to the rejects file (it may quote the record: it goes nowhere else)."""
    value: Any = None
    summary: str | None = None
    """The reason as the report, the job's history and ``TooManyRejects`` show it: it must never
    quote the record (a field name and a constraint, an exception type). None: counted as "rejected
    by the handler" there (see ``s3batch.rejects``)."""


class HandlerResult(NamedTuple):
    output: list[Any]
    """Output records: JSON-serialisable values, or JSON documents as ``bytes`` when ``encoded``."""
    rejects: list[Reject]
    encoded: bool = False
    """The outputs are already JSON-encoded (saves a decode/encode round trip, e.g. with pydantic's
    ``__pydantic_serializer__.to_json``)."""
    dropped: int | None = None
    """Records deliberately dropped (no output, no reject). A handler that sets it accounts for every
    record it was given: ``len(output) + len(rejects) + dropped`` must equal the number of records,
    or the file fails with ``AccountingError``. None: outputs are not tied to records (fan-out,
    aggregation); only the rejects are checked (at most one per record)."""
    lines: list[int] | None = None
    """The source line of each output (``Record.line``), where a sink names it (a row the database
    refuses becomes a reject of that line). None: the record's when there is one output per record
    given, else the first line of the records given."""


ChunkHandler = Callable[[Sequence[Record]], HandlerResult]
"""Takes the valid records of a chunk, returns outputs and rejects."""


class ChunkContext(NamedTuple):
    """What a handler may know about the chunk it is handling (:func:`chunk_context`): where it is, and
    the idempotency keys of its side effects.

    The keys depend only on the job, the source version and the position, never on the attempt or the
    worker: a chunk handled again after a crash (or a retry) gives every record the same key, so the
    system a handler calls can drop the repeats (e.g. an ``Idempotency-Key`` HTTP header). A redrive is
    another job: its keys differ.
    """

    job_id: str
    """The job's workflow ID."""
    bucket: str
    key: str
    """The source object."""
    etag: str
    """The source version's ETag (pinned for the whole job)."""
    chunk: int
    """Index of the chunk in the file (the same chunk boundaries on every attempt)."""
    attempt: int
    """The activity attempt handling it (1 on the first); a chunk seen again has a higher one."""
    split: int | None = None
    """The byte-range split of a big file the chunk belongs to (``chunk`` counts within it); None: a whole file."""

    def _digest(self, *parts: object) -> str:
        where = ("s3batch-idempotency-v1", self.job_id, self.bucket, self.key, self.etag)
        text = "\0".join(str(p) for p in (*where, *parts))
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def record_key(self, line: int) -> str:
        """The idempotency key of the record at ``line`` (``Record.line``): 32 hex digits."""
        return self._digest("line", line)

    @property
    def chunk_key(self) -> str:
        """The idempotency key of the whole chunk (one call for the chunk): 32 hex digits."""
        if self.split is None:
            return self._digest("chunk", self.chunk)
        return self._digest("split", self.split, "chunk", self.chunk)


_CONTEXT: contextvars.ContextVar[ChunkContext | None] = contextvars.ContextVar("s3batch_chunk_context", default=None)


@contextlib.contextmanager
def in_chunk(context: ChunkContext | None) -> Iterator[None]:
    """Run a handler with ``context`` as its :func:`chunk_context` (s3batch's chunk loop does)."""
    token = _CONTEXT.set(context)
    try:
        yield
    finally:
        _CONTEXT.reset(token)


def chunk_context() -> ChunkContext:
    """The context of the chunk the calling handler is handling.

    Raises:
        RuntimeError: Called outside a handler run by s3batch.
    """
    context = _CONTEXT.get()
    if context is None:
        raise RuntimeError("chunk_context() is only available inside a handler while s3batch runs it")
    return context

_REGISTRY: dict[str, ChunkHandler] = {}


def register(name: str, fn: ChunkHandler, *, replace: bool = False) -> None:
    """Register ``fn`` as the chunk handler called ``name``."""
    if name in _REGISTRY and _REGISTRY[name] is not fn and not replace:
        raise ValueError(f"a handler named {name!r} is already registered")
    _REGISTRY[name] = fn


def chunk_handler(name: str) -> Callable[[ChunkHandler], ChunkHandler]:
    """Decorator: register a function ``(records) -> HandlerResult`` under ``name``."""

    def decorate(fn: ChunkHandler) -> ChunkHandler:
        register(name, fn)
        return fn

    return decorate


def record_handler(name: str) -> Callable[[Callable[[Any], Any]], Callable[[Any], Any]]:
    """Decorator: register a function ``(value) -> output | None`` applied to each record.

    An exception raised for a record turns that record into a reject with the error as reason.
    """

    def decorate(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def run_chunk(records: Sequence[Record]) -> HandlerResult:
            output: list[Any] = []
            rejects: list[Reject] = []
            lines: list[int] = []
            for record in records:
                try:
                    result = fn(record.value)
                except Exception as err:  # noqa: BLE001 - a poison record is a reject, not a crash
                    rejects.append(Reject(record.line, describe_error(err), record.value, summarize_error(err)))
                    continue
                if result is not None:
                    output.append(result)
                    lines.append(record.line)
            return HandlerResult(output, rejects, dropped=len(records) - len(output) - len(rejects), lines=lines)

        register(name, run_chunk)
        return fn

    return decorate


def get_handler(name: str) -> ChunkHandler:
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY)) or "none"
        raise UnknownHandler(
            f"no handler named {name!r} is registered on this worker (known: {known}); register it "
            "with @record_handler/@chunk_handler in a module listed in S3BATCH_HANDLER_MODULES"
        ) from None


def handler_names() -> list[str]:
    return sorted(_REGISTRY)


def describe_error(err: Exception) -> str:
    """A one-line reason for a reject; pydantic errors are listed field by field."""
    if isinstance(err, ValidationError):
        return describe_validation_error(err)
    return f"{type(err).__name__}: {err}"


def summarize_error(err: Exception) -> str:
    """A reject's ``summary``: the fields and constraints of a pydantic error (never the values), else
    only the exception's type (its text may quote the record)."""
    if isinstance(err, ValidationError):
        return describe_validation_error(err)
    return f"{type(err).__name__} raised by the handler"


@chunk_handler("passthrough")
def passthrough(records: Sequence[Record]) -> HandlerResult:
    """Each record becomes one JSON value as it is (CSV rows as ``{column: string}``), written with
    :func:`~s3batch.jsonvalues.encode_json`: JSON numbers exactly as read (big integers, decimals a
    double does not hold) and any nesting the parser accepts."""
    return HandlerResult([encode_json(r.value) for r in records], [], encoded=True, dropped=0)


class Customer(BaseModel):
    """Example schema: one row of a customer import."""

    model_config = ConfigDict(extra="ignore", str_strip_whitespace=True)

    customer_id: int = Field(gt=0)
    email: Annotated[str, StringConstraints(pattern=r"^[^@\s]+@[^@\s]+\.[^@\s]+$", max_length=254)]
    name: Annotated[str, StringConstraints(min_length=1, max_length=200)]
    country: Annotated[str, StringConstraints(pattern=r"^[A-Z]{2}$")]
    amount: Decimal = Field(ge=0, max_digits=14, decimal_places=2)
    created_at: datetime.datetime


_validate_customer = Customer.model_validate
_customer_json = Customer.__pydantic_serializer__.to_json

_CANONICAL_AMOUNT = core_schema.str_schema(
    pattern=r"^(?:0|[1-9][0-9]{0,11})(?:\.[0-9]{1,2})?$", strict=True, strip_whitespace=False
)
"""The amounts ``Customer`` accepts whose JSON is the input itself: ``str(Decimal(s)) == s``, at most
12 + 2 digits, no sign, exponent, whitespace or non-ASCII digit (anything else goes the exact way)."""

_LEAP_YEAR = r"(?:[1-9][0-9](?:0[48]|[2468][048]|[13579][26])|(?:[13579][26]|[2468][048])00)"
_DAY = (
    r"(?:[1-9][0-9]{3}-(?:(?:0[1-9]|1[0-2])-(?:0[1-9]|1[0-9]|2[0-8])|(?:0[13-9]|1[0-2])-(?:29|30)"
    rf"|(?:0[13578]|1[02])-31)|{_LEAP_YEAR}-02-29)"
)
_CANONICAL_CREATED_AT = core_schema.str_schema(
    pattern=rf"^{_DAY}T(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]Z$", strict=True, strip_whitespace=False
)
"""The times ``Customer`` accepts whose JSON is the input itself: a real day of the years 1000-9999 and a
time to the second, in UTC written ``Z`` (as the datetime is written back); fractions, offsets, other
forms go the exact way."""


def _refused(value: Any) -> None:
    """The fast schema's answer for a row it does not take: the row is then validated by ``Customer``."""
    return None


def _fast_rows(model: type[BaseModel], replace: dict[str, core_schema.CoreSchema]) -> Callable[[list[Any]], list[Any]]:
    """One pydantic-core call for a list of rows: each row's JSON as ``model`` writes it, or None.

    The model's own field schemas (and config) in a typed dict, so no object is built per row and the
    JSON is written in the same call; ``replace`` narrows fields whose exact validation is slow to the
    inputs whose JSON is known (the typed dict writes the validated value, the model its own type).
    A row the narrow schema refuses is None: validate it with the model (it may well be valid).
    """
    schema = model.__pydantic_core_schema__
    if schema["type"] != "model" or schema["schema"]["type"] != "model-fields" or schema["schema"]["computed_fields"]:
        raise TypeError(f"{model.__name__}: only a plain model (fields, no validators) has a fast row schema")
    fields = {}
    for name, field in schema["schema"]["fields"].items():
        if set(field) - {"type", "schema", "metadata"} or not _plain(field["schema"]):
            raise TypeError(f"{model.__name__}.{name}: only plain fields (no alias, default, validator or "
                            "serializer) have a fast row schema")
        fields[name] = core_schema.typed_dict_field(replace.get(name, field["schema"]))
    config = schema["config"]
    row = core_schema.typed_dict_schema(fields, extra_behavior="ignore", strict=True, config=config)
    as_json = core_schema.no_info_after_validator_function(SchemaSerializer(row).to_json, row)
    refused = core_schema.no_info_plain_validator_function(_refused)
    item = core_schema.union_schema([as_json, refused], mode="left_to_right")
    return SchemaValidator(core_schema.list_schema(item), config).validate_python


def _plain(schema: Any) -> bool:
    """Whether a field schema holds only built-in types and constraints: no default (a typed dict fills
    it in otherwise) and no function (a validator or serializer may expect the model, not a dict)."""
    if isinstance(schema, dict):
        return schema.get("type") != "default" and "serialization" not in schema and all(map(_plain, schema.values()))
    if isinstance(schema, list | tuple):
        return all(map(_plain, schema))
    return not callable(schema) or isinstance(schema, type)


_line, _value = operator.itemgetter(0), operator.itemgetter(1)
"""A record's line and value (``Record`` is a tuple: C-level getters for a chunk's lists)."""

_customer_rows = _fast_rows(Customer, {"amount": _CANONICAL_AMOUNT, "created_at": _CANONICAL_CREATED_AT})


@chunk_handler("customers")
def customers(records: Sequence[Record]) -> HandlerResult:
    """Validate each row against :class:`Customer`; invalid rows become rejects, not failures.

    The whole chunk goes through one pydantic-core call (:func:`_fast_rows`); the rows it does not take
    (invalid ones, and valid ones it cannot vouch for) are validated one by one by ``Customer``, so the
    outputs, rejects and their reasons are exactly those of ``Customer.model_validate`` row by row.
    """
    rows = _customer_rows(list(map(_value, records)))
    if None not in rows:
        return HandlerResult(rows, [], encoded=True, dropped=0, lines=list(map(_line, records)))
    output: list[bytes] = []
    rejects: list[Reject] = []
    lines: list[int] = []
    for record, row in zip(records, rows, strict=True):
        if row is None:
            try:
                row = _customer_json(_validate_customer(record.value))
            except ValidationError as err:
                reason = describe_error(err)
                rejects.append(Reject(record.line, reason, record.value, reason))
                continue
        output.append(row)
        lines.append(record.line)
    return HandlerResult(output, rejects, encoded=True, dropped=0, lines=lines)

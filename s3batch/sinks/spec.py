"""The ``sink`` object of a job input: where a job's records go (pure pydantic: the workflow imports it).

``{"type": "s3"}`` (the default: JSONL parts), ``{"type": "s3", "format": "parquet"}``, or
``{"type": "postgres", "connection": "warehouse", "table": "public.customers", "mode": "insert"}``
(``"mode": "upsert", "key": ["customer_id"]`` for re-runs of corrected files; ``"on_reimport": "replace",
"source_column": "src"`` to replace a file's earlier rows). Unknown types or fields are refused when the job
starts (``InvalidInput`` naming the field).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    StringConstraints,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

from s3batch.fielddocs import Documented
from s3batch.validation import INPUT_ERROR

Identifier = Annotated[str, StringConstraints(min_length=1, max_length=63, pattern=r"^[A-Za-z_][A-Za-z0-9_$]*$")]
"""A PostgreSQL identifier as written unquoted (letters, digits, ``_``, ``$``; at most 63 bytes)."""

CONNECTION_NAME = r"^[A-Za-z][A-Za-z0-9_]*$"
ConnectionName = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=CONNECTION_NAME)]
"""A connection name: its DSN is the worker's ``S3BATCH_POSTGRES_<NAME>_DSN`` (or ``_DSN_FILE``)."""


def postgres_variable(connection: str, setting: str) -> str:
    """The variable of a setting of PostgreSQL connection ``connection``: ``S3BATCH_POSTGRES_WAREHOUSE_DSN``."""
    return f"S3BATCH_POSTGRES_{connection.upper()}_{setting}"


class S3Sink(Documented, BaseModel):
    """Parts in the output bucket, one per chunk, each carrying its checkpoint (the default)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    type: Literal["s3"] = "s3"
    format: Literal["jsonl", "parquet"] = "jsonl"
    """``jsonl``: ``part-00000.jsonl`` (one JSON document a line); ``parquet``: ``part-00000.parquet``
    (one Parquet file a chunk, columns from the handler's output)."""

    def shape(self) -> dict[str, Any] | None:
        """What enters the output fingerprint (None for the default JSONL parts: their fingerprint
        is the one every earlier release wrote)."""
        return None if self.format == "jsonl" else {"type": "s3", "format": self.format}


class PostgresSink(Documented, BaseModel):
    """Rows into an existing PostgreSQL table; each chunk and the file's checkpoint in one transaction."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    type: Literal["postgres"]
    connection: ConnectionName
    """Name of a connection the workers know: ``"warehouse"`` reads ``S3BATCH_POSTGRES_WAREHOUSE_DSN``
    (or the file ``S3BATCH_POSTGRES_WAREHOUSE_DSN_FILE`` names). The DSN never enters the job."""
    table: Annotated[str, StringConstraints(pattern=r"^([A-Za-z_][A-Za-z0-9_$]*\.)?[A-Za-z_][A-Za-z0-9_$]*$")]
    """The target table, ``schema.table`` or ``table`` (then ``public``); it must exist."""
    mode: Literal["insert", "upsert"] = "insert"
    """``insert``: every row once (through the checkpoint); ``upsert``: ``ON CONFLICT (key) DO UPDATE``."""
    key: list[Identifier] | None = Field(None, min_length=1)
    """The conflict columns of ``upsert`` (a unique index or primary key of the table)."""
    on_reimport: Literal["refuse", "replace"] | None = None
    """A file the table holds rows of from another version of it or other options: ``refuse`` it (nothing
    written; the default in ``insert`` mode), or ``replace`` its earlier rows (found by ``source_column``),
    deleted in the transaction of the new import's first chunk. None: ``refuse`` in ``insert`` mode; ``upsert``
    writes over them by key."""
    source_column: Identifier | None = None
    """A text column of the table the sink fills, on every row it writes, with the file's identity:
    ``s3://bucket/key#etag`` (the handler's field of that name is replaced). Needed by ``replace``."""
    reject_details: bool = False
    """Whether the reason of a row the database refuses carries PostgreSQL's DETAIL text as well as its message
    (``Key (id)=(7) already exists.``). Off by default: for foreign-key and exclusion constraints DETAIL quotes
    values of other rows already in the table, and rejects files are read by whoever reads the output."""
    empty_as: Literal["null", "string"] | None = None
    """What an unquoted empty CSV field is: ``null`` (None: the default), NULL in the table, as PostgreSQL's own
    ``COPY ... (FORMAT csv)`` loads it (a quoted empty field ``""`` is the empty string); ``string``: the empty
    string too, as releases before this option wrote it. The handler sees the field so (None or ``''``)."""

    @model_validator(mode="after")
    def _key_with_upsert(self) -> PostgresSink:
        if self.mode == "upsert" and not self.key:
            raise PydanticCustomError(INPUT_ERROR, "mode 'upsert' needs 'key': the conflict columns, e.g. ['id']")
        if self.mode == "insert" and self.key:
            raise PydanticCustomError(INPUT_ERROR, "'key' is for mode 'upsert' only")
        if self.on_reimport == "replace" and self.source_column is None:
            raise PydanticCustomError(
                INPUT_ERROR,
                "on_reimport 'replace' needs 'source_column': a text column of the table the sink fills with each "
                "row's file (s3://bucket/key#etag), by which a file's earlier rows are found",
            )
        return self

    @model_serializer(mode="wrap")
    def _omit_unset(self, handler: SerializerFunctionWrapHandler) -> Any:
        # A sink without them is written as before: a worker of an earlier release refuses unknown fields.
        data = handler(self)
        if isinstance(data, dict):
            for name in ("on_reimport", "source_column", "empty_as"):
                if data.get(name, 0) is None:
                    del data[name]
            if data.get("reject_details") is False:
                del data["reject_details"]
        return data

    @property
    def reimport(self) -> Literal["refuse", "replace", "upsert"]:
        """What an import of a file does where the table holds rows of another version of it or other options:
        ``on_reimport``, else ``refuse`` in insert mode and ``upsert`` in upsert mode."""
        return self.on_reimport or ("refuse" if self.mode == "insert" else "upsert")

    @property
    def empty_null(self) -> bool:
        """An unquoted empty CSV field is NULL (``empty_as``)."""
        return self.empty_as != "string"

    @property
    def schema_name(self) -> str:
        return self.table.rpartition(".")[0] or "public"

    @property
    def table_name(self) -> str:
        return self.table.rpartition(".")[2]

    def shape(self) -> dict[str, Any]:
        """What enters the output fingerprint: a checkpoint of another table or mode is not reused; nor of rows
        marked in another ``source_column`` (``on_reimport`` is what becomes of earlier rows, not these rows), nor
        with ``empty_as: string``. The default (NULL) leaves the shape as earlier releases wrote it: a file they
        imported whole is found done, not imported again (its empty fields stay ``''``)."""
        table = f"{self.schema_name}.{self.table_name}"
        shape: dict[str, Any] = {"type": "postgres", "table": table, "mode": self.mode, "key": self.key}
        if self.source_column is not None:
            shape["source_column"] = self.source_column
        if not self.empty_null:
            shape["empty_as"] = "string"
        return shape


Sink = Annotated[S3Sink | PostgresSink, Field(discriminator="type")]
"""A job's ``sink`` (see the module docstring)."""


def destination(sink: S3Sink | PostgresSink | None, output_bucket: str, output_prefix: str) -> str:
    """Where a job's records go, for people (``s3batch status``/``report``, the progress query)."""
    folder = f"s3://{output_bucket}/{output_prefix}"
    if isinstance(sink, PostgresSink):
        key = f", key {', '.join(sink.key)}" if sink.key else ""
        how = f"connection {sink.connection!r}, {sink.mode}{key}"
        return f"PostgreSQL table {sink.schema_name}.{sink.table_name} ({how}); rejects and report in {folder}"
    return f"{folder} ({'Parquet' if sink is not None and sink.format == 'parquet' else 'JSONL'} parts)"


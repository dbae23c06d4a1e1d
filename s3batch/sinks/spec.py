"""The ``sink`` object of a job input: where a job's records go (pure pydantic: the workflow imports it).

``{"type": "s3"}`` (the default: JSONL parts), ``{"type": "s3", "format": "parquet"}``, or
``{"type": "postgres", "connection": "warehouse", "table": "public.customers", "mode": "insert"}``
(``"mode": "upsert", "key": ["customer_id"]`` for re-runs of corrected files). Unknown types or
fields are refused when the job starts (``InvalidInput`` naming the field).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator
from pydantic_core import PydanticCustomError

from s3batch.validation import INPUT_ERROR

Identifier = Annotated[str, StringConstraints(min_length=1, max_length=63, pattern=r"^[A-Za-z_][A-Za-z0-9_$]*$")]
"""A PostgreSQL identifier as written unquoted (letters, digits, ``_``, ``$``; at most 63 bytes)."""

ConnectionName = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[A-Za-z][A-Za-z0-9_]*$")]
"""A connection name: its DSN is the worker's ``S3BATCH_POSTGRES_<NAME>_DSN`` (or ``_DSN_FILE``)."""


class S3Sink(BaseModel):
    """Parts in the output bucket, one per chunk, each carrying its checkpoint (the default)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, use_attribute_docstrings=True)

    type: Literal["s3"] = "s3"
    format: Literal["jsonl", "parquet"] = "jsonl"
    """``jsonl``: ``part-00000.jsonl`` (one JSON document a line); ``parquet``: ``part-00000.parquet``
    (one Parquet file a chunk, columns from the handler's output)."""

    def shape(self) -> dict[str, Any] | None:
        """What enters the output fingerprint (None for the default JSONL parts: their fingerprint
        is the one every earlier release wrote)."""
        return None if self.format == "jsonl" else {"type": "s3", "format": self.format}


class PostgresSink(BaseModel):
    """Rows into an existing PostgreSQL table; each chunk and the file's checkpoint in one transaction."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, use_attribute_docstrings=True)

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

    @model_validator(mode="after")
    def _key_with_upsert(self) -> PostgresSink:
        if self.mode == "upsert" and not self.key:
            raise PydanticCustomError(INPUT_ERROR, "mode 'upsert' needs 'key': the conflict columns, e.g. ['id']")
        if self.mode == "insert" and self.key:
            raise PydanticCustomError(INPUT_ERROR, "'key' is for mode 'upsert' only")
        return self

    @property
    def schema_name(self) -> str:
        return self.table.rpartition(".")[0] or "public"

    @property
    def table_name(self) -> str:
        return self.table.rpartition(".")[2]

    def shape(self) -> dict[str, Any]:
        """What enters the output fingerprint: a checkpoint of another table or mode is not reused."""
        table = f"{self.schema_name}.{self.table_name}"
        return {"type": "postgres", "table": table, "mode": self.mode, "key": self.key}


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


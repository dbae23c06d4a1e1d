"""Field docstrings of the data contracts are their pydantic descriptions (``s3batch.fielddocs.Documented``: the
CLI's ``--help`` and the JSON schema read them), the same as pydantic's own ``use_attribute_docstrings`` finds, and
the JSON on the wire is unchanged by it."""

from __future__ import annotations

import importlib
import json
import pkgutil

import pytest
from pydantic import BaseModel
from pydantic._internal._docs_extraction import extract_docstrings_from_cls

import s3batch
from s3batch import models
from s3batch.config import Settings
from s3batch.fielddocs import Documented
from s3batch.messages import FileResult, JobState
from s3batch.models import S3BatchInput


def documented_models() -> list[type[BaseModel]]:
    return [
        value
        for value in vars(models).values()
        if isinstance(value, type) and issubclass(value, BaseModel) and value.__module__ == models.__name__
    ]


def test_field_docstrings_are_descriptions() -> None:
    chunk = S3BatchInput.model_fields["chunk_records"]
    assert chunk.description == "Records per chunk: one output part and one checkpoint per chunk."
    # Inherited fields keep theirs (JobSpec is the job as the activities see it).
    assert models.JobSpec.model_fields["chunk_records"].description == chunk.description
    schema = S3BatchInput.model_json_schema()
    assert schema["properties"]["chunk_records"]["description"] == chunk.description
    slots = Settings.model_fields["max_concurrent_files"].description
    assert slots == (
        "Activity slots of this worker (the whole container): files it processes at once. With several\n"
        "worker processes they are shared out between them."
    )


def contracts() -> list[type[BaseModel]]:
    """Every documented model of the package (its modules imported, as a CLI command or a worker imports them)."""
    for info in pkgutil.walk_packages(s3batch.__path__, "s3batch."):
        if not info.name.startswith(("s3batch.dev", "s3batch.cli", "s3batch.workflows", "s3batch.activities")):
            importlib.import_module(info.name)
    found: list[type[BaseModel]] = []
    pending = list(Documented.__subclasses__())
    while pending:
        model = pending.pop()
        pending.extend(model.__subclasses__())
        if issubclass(model, BaseModel) and model.__module__.startswith("s3batch.") and model not in found:
            found.append(model)
    return sorted(found, key=lambda m: (m.__module__, m.__qualname__))


def test_every_model_of_the_contract_modules_is_documented() -> None:
    assert {m.__name__ for m in documented_models()} <= {m.__name__ for m in contracts()}
    assert {"S3BatchInput", "JobSpec", "JobState", "FileResult", "Settings", "PostgresSink"} <= {
        m.__name__ for m in contracts()
    }


@pytest.mark.parametrize("model", contracts(), ids=lambda m: f"{m.__module__}.{m.__qualname__}")
def test_descriptions_are_what_pydantic_reads_from_the_docstrings(model: type[BaseModel]) -> None:
    # Differential: pydantic's own reading of the class's source (inspect), field by field (no field of the package
    # has a description of its own, Field(description=...)); inherited fields keep their class's.
    theirs = extract_docstrings_from_cls(model, use_inspect=True)
    for name in model.__annotations__:
        if name in model.model_fields:
            assert model.model_fields[name].description == theirs.get(name), name


def test_the_json_on_the_wire_is_unchanged() -> None:
    # Captured before descriptions were added: the same bytes, key order included.
    job = S3BatchInput(bucket="incoming", output_bucket="processed", output_prefix="runs/1/")
    assert job.model_dump_json() == (
        '{"bucket":"incoming","prefix":"","output_bucket":"processed","output_prefix":"runs/1/","format":"auto",'
        '"handler":"passthrough","chunk_records":10000,"max_concurrent_files":8,"heartbeat_timeout_seconds":30,'
        '"max_attempts":10,"max_failed_files":0,"max_record_bytes":8388608,"group_max_files":100,'
        '"group_max_bytes":4194304,"only_failed_of":null}'
    )
    assert json.loads(JobState().model_dump_json()) == {
        "indexed": False, "run": 0, "continuation_token": None, "listing_done": False, "pending": [],
        "totals": {
            "files_listed": 0, "files_succeeded": 0, "files_failed": 0, "files_cancelled": 0,
            "files_not_started": 0, "records": 0, "records_written": 0, "rejected": 0, "dropped": 0, "bytes_read": 0,
        },
        "report_segments": 0, "files_per_run": 500, "solo": [], "paused": False, "max_concurrent_files": None,
        "listed_digest": None, "done_digest": None, "last_listed_key": None,
    }  # fmt: skip
    result = FileResult(key="a.csv", etag="e", status="failed", error="x")
    assert result.model_dump_json() == (
        '{"key":"a.csv","etag":"e","status":"failed","records":0,"records_written":0,"rejected":0,"dropped":0,'
        '"bytes_read":0,"chunks":0,"attempts":1,"resumed_from_record":0,"error":"x"}'
    )

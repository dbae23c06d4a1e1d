"""The reference pages of the documentation site say what the code does, and all of it: their tables are
generated from the code when the site is built (``s3batch/dev/docs.py``), and what is written by hand around
them names every variable the code reads and every error type it raises."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from s3batch.config import Settings
from s3batch.dev import docs
from s3batch.models import S3BatchInput

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "docs" / "reference"
CODE = ["s3batch", "workflows", "activities", "deploy", "Dockerfile", "docker-compose.yml", ".env.example"]


def page(name: str) -> str:
    """A reference page as the site shows it: its markers replaced by what they generate."""
    return docs.expand((REFERENCE / name).read_text())


def test_every_marker_of_every_page_has_a_generator() -> None:
    for path in (ROOT / "docs").rglob("*.md"):
        for name in docs.MARKER.findall(path.read_text()):
            assert name in docs.GENERATORS, f"{path.relative_to(ROOT)}: no generator {name!r}"


def test_the_job_input_page_has_every_field_with_its_docstring() -> None:
    text = page("job-input.md")
    for name, info in S3BatchInput.model_fields.items():
        row = next((line for line in text.splitlines() if line.startswith(f"| `{name}` |")), None)
        assert row is not None, name
        assert docs.table_text(info.description)[:60] in row, name
    assert "| `chunk_records` | integer | `10,000` |" in text and "(>= 1; <= 1,000,000)" in text


def _variables_in_the_code() -> set[str]:
    found: set[str] = set()
    for part in CODE:
        path = ROOT / part
        for file in [path] if path.is_file() else path.rglob("*"):
            if file.is_file() and file.suffix in ("", ".py", ".yml", ".yaml", ".example", ".sh", ".json"):
                found |= set(re.findall(r"\bS3BATCH_[A-Z0-9_]*[A-Z0-9]\b", file.read_text(errors="replace")))
    # A connection's variables are S3BATCH_POSTGRES_<NAME>_*: the page names them for the connection "warehouse".
    return {v for v in found if v != "S3BATCH_POSTGRES" and (not v.startswith("S3BATCH_POSTGRES_") or "WAREHOUSE" in v)}


def test_the_environment_page_names_every_variable_the_code_reads() -> None:
    text = page("environment.md")
    variables = _variables_in_the_code()
    assert {"S3BATCH_TASK_QUEUE", "S3BATCH_HEALTH_FILE", "S3BATCH_WORKER_PROCESSES"} <= variables
    missing = sorted(v for v in variables if f"`{v}`" not in text)
    assert not missing, f"variables the code reads that docs/reference/environment.md does not name: {missing}"
    for name in Settings.model_fields:
        if name not in ("postgres_dsns", "postgres_connections"):
            assert f"`S3BATCH_{name.upper()}`" in text or name in ("deployment_name", "build_id"), name


def test_the_errors_page_says_what_to_do_about_every_error_type() -> None:
    text = page("errors.md")
    types = [cls.type_name for cls in docs.error_types()]
    assert {"SourceChanged", "TooManyRejects", "WorkerShutdown", "S3Error"} <= set(types)
    missing = [t for t in types if f"\n### {t}\n" not in text]
    assert not missing, f"error types without a 'what to do' section in docs/reference/errors.md: {missing}"
    for other in ("JobFailed", "EmptyPrefix", "UnknownEncryptionKey"):
        assert f"`{other}`" in text, other


@pytest.mark.parametrize("name", ["cli.md", "formats.md", "observability.md"])
def test_the_generated_sections_are_filled(name: str) -> None:
    text = page(name)
    assert "<!-- generated:" not in text
    if name == "cli.md":
        assert "### `s3batch start`" in text and "--output-prefix" in text and "### `s3batch-worker`" in text
        assert "Exit codes" in text
    elif name == "formats.md":
        assert "#### `FileResult`" in text and "| `resumed_from_record` |" in text and "| `next_record` |" in text
    else:
        assert "| `s3batch_checkpoint_age_seconds` | histogram | s |" in text


def test_the_workflow_section_is_read_from_its_temporal_definition() -> None:
    # Before, a hand-written table: a query or update added to the workflow would have been missing from it.
    from s3batch.workflows.batch import S3BatchWorkflow
    from temporalio import workflow

    defn = workflow._Definition.must_from_class(S3BatchWorkflow)
    text = page("python-api.md")
    assert "<!-- generated:" not in text
    for kind, names in (("query", defn.queries), ("update", defn.updates), ("signal", defn.signals)):
        for name in names:
            assert f"| {kind} | `{name}` |" in text, (kind, name)
    assert "| run | `run` | `job`: The job, as an `S3BatchInput` or its JSON;" in text
    assert "| update | `set_concurrency` | `n`: integer, 1-1,000" in text

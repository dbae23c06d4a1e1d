"""``s3batch start --help``: one flag per field of S3BatchInput, documented by the field's own
docstring (its pydantic description), with its default."""

from __future__ import annotations

from typing import get_args

from s3batch.cli.parser import flag
from s3batch.models import Format, S3BatchInput
from tests.helpers import run


async def test_start_help_documents_every_job_field_with_its_docstring_and_default():
    r = await run("s3batch", "start", "--help")
    assert r.code == 0, r
    text = " ".join(r.stdout.split())  # argparse wraps long help lines
    bucket = 'Source bucket (unless manifest names the objects: then it is left out, and is ""). (required)'
    assert f"--bucket BUCKET {bucket}" in text
    chunk = "Records per chunk: one output part and one checkpoint per chunk. (default: 10000)"
    assert f"--chunk-records RECORDS {chunk}" in text
    # reST literal quotes are dropped, whitespace of multi-line docstrings folded.
    prefix = "Prefix of every output key: {output_prefix}{key}/part-00000.jsonl. (default: '')"
    assert f"--output-prefix PREFIX {prefix}" in text
    assert "--format {" + ",".join(get_args(Format)) + "} csv (RFC 4180" in text
    for name, info in S3BatchInput.model_fields.items():
        assert info.description, name  # every field has a docstring to show
        assert flag(name) in text, name

"""Job fields that are not plain text reach ``s3batch start`` as a user would type them: a list
field is a repeatable flag, an object (or a value that may be a list) is JSON text, and a tab
delimiter can be written ``'\\t'``. Every flag still goes through the model's strict checks."""

from __future__ import annotations

import pytest

from s3batch.cli import build_parser
from s3batch.cli.output import CliError
from s3batch.cli.start import job_from_args

BASE = ["start", "--bucket", "incoming", "--output-bucket", "processed"]


def job(*flags: str):
    return job_from_args(build_parser().parse_args([*BASE, *flags]))


def test_list_fields_are_repeatable_flags() -> None:
    spec = job("--include", "*.csv", "--include", "*.tsv", "--exclude", "*/tmp/*")
    assert spec.include == ["*.csv", "*.tsv"] and spec.exclude == ["*/tmp/*"]


def test_object_fields_are_json_text() -> None:
    spec = job("--sink", '{"type": "s3", "format": "parquet"}')
    assert spec.sink is not None and spec.sink.type == "s3" and spec.sink.format == "parquet"


def test_a_field_that_may_be_a_list_takes_json_or_its_text() -> None:
    assert job("--header", '["id", "name"]').header == ["id", "name"]
    assert job("--header", "none").header == "none"


def test_a_tab_delimiter_can_be_typed_as_backslash_t() -> None:
    assert job("--delimiter", "\\t").delimiter == "\t"
    assert job("--delimiter", ";").delimiter == ";"


def test_bad_json_objects_are_refused_naming_the_field() -> None:
    with pytest.raises(CliError) as err:
        job("--sink", '{"type": "nosuch"}')
    assert "sink" in str(err.value)

"""A file in flight without a byte offset says why (its compression, or Parquet's row groups),
instead of calling every such file gzip."""

from __future__ import annotations

import pytest

from s3batch.client import InFlightFile


@pytest.mark.parametrize(
    ("key", "label"),
    [("a/b.csv.gz", "gzip"), ("b.jsonl.ZST", "zstd"), ("c.csv.bz2", "bzip2"), ("d.parquet", "parquet"),
     ("e.pq", "parquet"), ("f.csv", "compressed"), (None, "compressed")],
)  # fmt: skip
def test_the_reason_a_file_has_no_byte_offset(key: str | None, label: str) -> None:
    f = InFlightFile(key=key, activity_id="1", attempt=1, state="started", last_heartbeat=None, checkpoint=None,
                     last_failure=None)  # fmt: skip
    assert f.offsetless == label

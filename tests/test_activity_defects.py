"""The output layout and the job input's checks on it, without servers: how source keys appear in
output keys (issue 18.1), and job inputs whose own keys would fall under what they list (issue 9.9)."""

from __future__ import annotations

import re
import urllib.parse

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from s3batch import layout
from s3batch.models import S3BatchInput

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")

# Keys made of the characters that matter ("/", ".", "%", hex digits, controls) and some others.
keys = st.text(alphabet=st.sampled_from("/.%2Ea1Fz -_\x00\x01\x1f\x7f\x85é日"), min_size=1, max_size=30) | st.text(
    min_size=1, max_size=60
)


def segments_of(output_key: str) -> list[str]:
    return output_key.split("/")


@settings(max_examples=2000, deadline=None)
@given(keys)
@example("h/../../escape.csv")
@example("/leading//doubled/trailing/")
@example("%2E%2E/x")
def test_encoding_is_reversible_and_never_yields_unsafe_segments(key: str) -> None:
    encoded = layout.encode_key(key)
    assert layout.decode_key(encoded) == key
    for output_key in (layout.part_key("run/", key, 0), layout.rejects_key("", key, 12), layout.file_dir("a-", key)):
        assert not _CONTROL.search(output_key), output_key
        # the last segment is the part's own name or empty (the folder's trailing "/")
        inner = segments_of(output_key)[:-1]
        assert all(seg not in ("", ".", "..") for seg in inner), output_key


@settings(max_examples=2000, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cc", "Cs")), min_size=1, max_size=60))
def test_ordinary_keys_map_exactly_as_before(key: str) -> None:
    # Before the encoding, output keys were output_prefix + key + "/part-NNNNN.jsonl": unchanged for
    # every key without a control character, a "%XX"-like sequence, or an empty, "." or ".." segment.
    unsafe_segment = any(seg in ("", ".", "..") for seg in key.split("/"))
    if unsafe_segment or re.search(r"%[0-9A-Fa-f]{2}", key):
        return
    assert layout.encode_key(key) == key
    assert layout.part_key("run/", key, 3) == f"run/{key}/part-00003.jsonl"
    assert layout.rejects_key("run/", key, 3) == f"run/{key}/rejects-00003.jsonl"


@pytest.mark.parametrize(
    ("key", "encoded"),
    [
        ("h/../../escape.csv", "h/%2E%2E/%2E%2E/escape.csv"),
        ("a/./b.csv", "a/%2E/b.csv"),
        ("a//b.csv", "a/%2Fb.csv"),
        ("/abs.csv", "%2Fabs.csv"),
        ("dir/", "dir%2F"),
        ("tab\there.csv", "tab%09here.csv"),
        ("nl\nx.csv", "nl%0Ax.csv"),
        ("del\x7f.csv", "del%7F.csv"),
        ("c1\x85.csv", "c1%C2%85.csv"),
        ("url%41.csv", "url%2541.csv"),
        ("100%.csv", "100%.csv"),
        ("a/.hidden/..x/...", "a/.hidden/..x/..."),
        ("données é 日本.csv", "données é 日本.csv"),
    ],
)
def test_encoding_examples(key: str, encoded: str) -> None:
    assert layout.encode_key(key) == encoded
    assert layout.decode_key(encoded) == key == urllib.parse.unquote(encoded)


def test_output_index_reads_only_our_names() -> None:
    assert layout.output_index("part-00012.jsonl") == 12
    assert layout.output_index("rejects-123456.jsonl") == 123456
    assert layout.output_index("xpart-00012.jsonl") is None
    assert layout.output_index("part-00012.jsonl.tmp") is None
    assert layout.output_kind("rejects-00001.jsonl") == ("rejects", 1)


# ------------------------------------------------------------------ the job's own keys (issue 9.9)

SAME = {"bucket": "shared-bucket", "output_bucket": "shared-bucket"}


@pytest.mark.parametrize(
    ("prefix", "output_prefix", "clash"),
    [
        ("exports_", "exports", "its report exports_report.*"),  # the audit's case: report, state, write check
        ("exports_s3batch/", "exports", "its state and write check exports_s3batch/*"),
        ("exports_s3batch/report-0", "exports", "its state and write check"),
        ("runs/1/_", "runs/1/", "its report runs/1/_report.*"),
        ("", "out/", "the files' outputs"),
        ("in/", "in/out/", "the files' outputs"),
    ],
)
def test_job_input_whose_own_keys_fall_under_its_listing_is_refused(
    prefix: str, output_prefix: str, clash: str
) -> None:
    with pytest.raises(ValidationError) as info:
        S3BatchInput.model_validate({**SAME, "prefix": prefix, "output_prefix": output_prefix})
    message = str(info.value)
    assert f"output_prefix {output_prefix!r} writes under the source prefix {prefix!r}" in message
    assert clash in message
    # Every key the job writes is what the layout functions give; at least one of them is listed.
    written = [
        layout.part_key(output_prefix, prefix + "x.csv", 0),
        layout.report_key(output_prefix),
        layout.segment_key(output_prefix, 0),
        layout.write_check_key(output_prefix),
    ]
    if prefix != "exports_s3batch/report-0":  # segment 0 is not under it, but segments 0xxxx are
        assert any(k.startswith(prefix) for k in written)


@pytest.mark.parametrize(
    ("prefix", "output_prefix"),
    [("in/", "out/"), ("exports/", "exports"), ("a", "b/"), ("data/2026/", "data/processed/"), ("x_", "y")],
)
def test_job_input_writing_outside_its_listing_is_accepted(prefix: str, output_prefix: str) -> None:
    job = S3BatchInput.model_validate({**SAME, "prefix": prefix, "output_prefix": output_prefix})
    for key in (
        layout.part_key(output_prefix, prefix + "f.csv", 0),
        layout.rejects_key(output_prefix, prefix + "f.csv", 99),
        layout.report_key(output_prefix),
        layout.segment_key(output_prefix, 3),
        layout.write_check_key(output_prefix),
        layout.report_copy_key(output_prefix, "redrive-1"),
    ):
        assert not key.startswith(job.prefix), key


def test_other_output_bucket_is_never_a_clash() -> None:
    job = {"bucket": "src-b", "output_bucket": "out-b", "prefix": "exports_", "output_prefix": "exports"}
    assert S3BatchInput.model_validate(job).output_prefix == "exports"

"""Properties of the reject tally and the limits on rejects (s3batch.rejects), searched by hypothesis.

No stack needed: the module is pure (the workflow sandbox imports it). The real file, workflow and
CLI behaviour is in tests/test_rejects.py.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from s3batch import rejects
from s3batch.checkpoint import CHECKPOINT_MAC_METADATA, CHECKPOINT_METADATA, Checkpoint
from s3batch.rejects import RATIO_MIN_RECORDS, DelimiterProbe, FileLimits, crossed, merge, reason_key

REASONS = [f"field_{i}: Input should be a valid integer" for i in range(9)]

chunks = st.lists(st.dictionaries(st.sampled_from(REASONS), st.integers(1, 50), max_size=6), max_size=30)


def fold(parts: list[dict[str, int]]) -> list[tuple[str, int]]:
    tally: list[tuple[str, int]] = []
    for part in parts:
        tally = merge(tally, Counter(part)) if part else tally
    return tally


@given(chunks)
def test_the_tally_is_bounded_ranked_and_never_counts_more_than_happened(parts: list[dict[str, int]]) -> None:
    tally = fold(parts)
    true = Counter[str]()
    for part in parts:
        true.update(part)
    assert len(tally) <= rejects.MAX_REASONS
    assert tally == sorted(tally, key=lambda item: (-item[1], item[0]))
    assert all(count <= true[reason] for reason, count in tally)
    assert sum(count for _, count in tally) <= sum(true.values())
    # A checkpoint round trip (heartbeat details, part metadata) keeps it as it is.
    cp = Checkpoint(etag="e", fingerprint="f", rejected=sum(true.values()), reject_reasons=tally)
    assert Checkpoint.model_validate_json(cp.model_dump_json()).reject_reasons == tally


@given(st.lists(st.dictionaries(st.sampled_from(REASONS[:5]), st.integers(1, 50), max_size=5), max_size=30))
def test_with_at_most_five_reasons_the_tally_is_exact(parts: list[dict[str, int]]) -> None:
    true = Counter[str]()
    for part in parts:
        true.update(part)
    assert dict(fold(parts)) == dict(true)


@given(st.text(max_size=400))
def test_a_reason_is_short_ascii_and_the_same_on_every_line(text: str) -> None:
    key = reason_key(text)
    assert key.isascii() and len(key) <= rejects.REASON_CHARS
    assert reason_key(f"malformed CSV ({text[:20]}) in lines 3-4") == reason_key(
        f"malformed CSV ({text[:20]}) in lines 1200-1203"
    )
    assert reason_key(None) == rejects.HANDLER_REASON


@settings(max_examples=60)
@given(st.lists(st.text(min_size=200, max_size=300), min_size=5, max_size=5), st.integers(0, 10**15))
def test_a_checkpoint_with_the_longest_reasons_fits_s3_user_metadata(texts: list[str], big: int) -> None:
    # S3 allows 2 KB of user metadata (names and values); a checkpoint secret adds its HMAC.
    worst = ["\\" * 200, *texts[1:]]  # a backslash doubles in JSON
    tally = [(reason_key(t), big) for t in worst]
    cp = Checkpoint(
        next_record=big, byte_offset=big, line=big, chunk=big, etag="f" * 32 + "-10000", version_id="v" * 64,
        fingerprint="0" * 16, records_written=big, rejected=big, dropped=big, reject_reasons=tally,
        delimiter_hint="\t",
    )  # fmt: skip
    size = len(CHECKPOINT_METADATA) + len(cp.model_dump_json().encode()) + len(CHECKPOINT_MAC_METADATA) + 64
    assert size <= 2048, size


def test_an_old_checkpoint_without_the_new_fields_still_loads() -> None:
    old = {"next_record": 5, "byte_offset": 80, "line": 7, "chunk": 1, "etag": "e", "version_id": None,
           "fingerprint": "f", "records_written": 4, "rejected": 1, "done": False}  # fmt: skip
    cp = Checkpoint.model_validate_json(json.dumps(old))
    assert cp.reject_reasons == [] and cp.delimiter_hint is None and cp.rejected == 1


limits = st.builds(
    FileLimits,
    max_rejected_records=st.none() | st.integers(0, 3000),
    max_rejected_ratio=st.none() | st.floats(0.0, 1.0),
)


@given(limits, st.lists(st.booleans(), max_size=3000), st.integers(1, 700))
def test_a_file_stops_at_the_first_boundary_over_a_limit_and_only_there(
    lim: FileLimits, bad: list[bool], chunk_records: int
) -> None:
    """The chunk loop's check, simulated: at each committed boundary ``crossed`` sees the counts so far."""
    n = len(bad)
    boundaries = [*range(chunk_records, n, chunk_records), n]
    stopped_at = None
    for end in boundaries:
        rejected = sum(bad[:end])
        if crossed(lim, rejected, end, done=end == n) is not None:
            stopped_at = end
            break
    total = sum(bad)
    over_count = lim.max_rejected_records is not None and total > lim.max_rejected_records
    over_ratio = lim.max_rejected_ratio is not None and n > 0 and total / n > lim.max_rejected_ratio
    if over_count or over_ratio:
        # A file over a limit at its end never succeeds.
        assert stopped_at is not None
    if stopped_at is not None:
        rejected = sum(bad[:stopped_at])
        assert (lim.max_rejected_records is not None and rejected > lim.max_rejected_records) or (
            lim.max_rejected_ratio is not None
            and rejected / stopped_at > lim.max_rejected_ratio
            and (stopped_at >= RATIO_MIN_RECORDS or stopped_at == n)
        )


@given(st.integers(RATIO_MIN_RECORDS, 50_000), st.integers(1, 5), st.integers(1, 2000))
def test_a_few_bad_first_rows_of_a_big_file_never_fail_it_on_the_ratio(n: int, bad: int, chunk: int) -> None:
    # The ratio limit at or above the share of the bad rows among the first 1,000 records.
    lim = FileLimits(max_rejected_ratio=bad / RATIO_MIN_RECORDS)
    for end in [*range(chunk, n, chunk), n]:
        assert crossed(lim, min(bad, end), end, done=end == n) is None


@given(st.integers(0, 100), st.integers(0, 100))
def test_the_count_limit_is_exact(limit: int, rejected: int) -> None:
    over = crossed(FileLimits(max_rejected_records=limit), rejected, max(rejected, 1), done=False)
    assert (over is not None) == (rejected > limit)
    assert over is None or over == f"max_rejected_records={limit}"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=10,
)


@given(st.dictionaries(st.sampled_from(["records", "rejected", "chunks", "reject_reasons", "x"]), json_values))
def test_counts_carried_by_a_failure_are_read_or_ignored_never_raised(detail: dict[str, Any]) -> None:
    # The workflow reads them from an activity failure's details: a bad value must not fail its task.
    counts = rejects.counts_of(detail)
    assert set(counts) <= {"records", "rejected", "chunks", "reject_reasons"}


@given(st.sampled_from(rejects.DELIMITERS), st.integers(1, 6), st.integers(1, 80))
def test_a_one_column_header_whose_data_splits_evenly_gives_the_delimiter(d: str, cuts: int, rows: int) -> None:
    name = d.join(f"c{i}" for i in range(cuts + 1))
    probe = DelimiterProbe(True)
    probe.see([name], [{name: d.join(str(r) for _ in range(cuts + 1))} for r in range(rows)])
    assert probe.hint == d
    assert f'"delimiter": "{json.dumps(d)[1:-1]}"' in rejects.delimiter_warning(d)


@given(st.sampled_from(rejects.DELIMITERS), st.integers(1, 6), st.integers(0, 49))
def test_no_hint_when_a_data_line_does_not_split_evenly(d: str, cuts: int, odd: int) -> None:
    name = d.join(f"c{i}" for i in range(cuts + 1))
    values = [{name: d.join("x" for _ in range(cuts + 1))} for _ in range(50)]
    values[odd] = {name: "x" + d * (cuts + 1)}
    probe = DelimiterProbe(True)
    probe.see([name], values)
    assert probe.hint is None
    multi = DelimiterProbe(True)
    multi.see([name, "other"], [{name: "a", "other": "b"}])
    assert multi.hint is None

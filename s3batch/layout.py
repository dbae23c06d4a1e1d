"""Where s3batch writes: the output layout, in one place.

For a source key ``K``: records at ``{output_prefix}{encode_key(K)}/part-{chunk:05d}.jsonl``, rejects
at ``{output_prefix}{encode_key(K)}/rejects-{chunk:05d}.jsonl``; a big file processed as byte-range splits
(``S3BatchInput.split_bytes``) has ``part-{split:03d}-{chunk:05d}.jsonl`` and ``rejects-{split:03d}-{chunk:05d}.jsonl``
instead, so that the names, sorted, are in the file's order either way; the job report at
``{output_prefix}_report.json``; the job's own state (report segments, the write check) under
``{output_prefix}_s3batch/``. Every output key starts with ``output_prefix``.

**Source keys in output keys.** ``encode_key`` is the identity for ordinary keys, so their output
keys are plain concatenations. It percent-encodes only what would make an output key unsafe for
the tools that map keys to paths (``aws s3 sync``, rclone, mounting tools):

- a ``.`` or ``..`` segment: each dot as ``%2E`` (``h/../x.csv`` -> ``h/%2E%2E/x.csv``);
- a ``/`` that would leave an empty segment (leading, trailing, or doubled): as ``%2F``
  (``a//b.csv`` -> ``a/%2Fb.csv``, ``dir/`` -> ``dir%2F``);
- control characters (U+0000-U+001F, U+007F-U+009F): as the ``%XX`` of their UTF-8 bytes;
- a ``%`` followed by two hex digits (which would otherwise read as an escape): as ``%25``.

``decode_key`` (``urllib.parse.unquote``) gives the source key back. Another ``%`` (``100%.csv``)
is kept as it is.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

MAX_KEY_BYTES = 1024
"""S3's limit on the length of a key (UTF-8 bytes)."""

_OUTPUT_RE = re.compile(r"(part|rejects)-(?:(\d{3})-)?(\d{5,})\.(?:jsonl|parquet)")
_PART_NAME = "part-{}{:05d}{}"
JSONL = ".jsonl"
"""Suffix of JSONL parts (the default sink) and of every rejects file."""
PARQUET = ".parquet"
"""Suffix of Parquet parts (``{"type": "s3", "format": "parquet"}``)."""
_REJECTS_NAME = "rejects-{}{:05d}.jsonl"
MAX_SPLITS = 100
"""The most byte-range splits of one file (their index has 3 digits in output names)."""

# What encode_key changes: control characters, a "%" that reads as an escape, and (checked per
# segment) "/" that would leave an empty segment and "." / ".." segments.
_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f]|%(?=[0-9A-Fa-f]{2})|//|^/|/$|(?:^|/)\.\.?(?:/|$)")
_CHARS = re.compile(r"[\x00-\x1f\x7f-\x9f]|%(?=[0-9A-Fa-f]{2})")


def _escape(match: re.Match[str]) -> str:
    return "".join(f"%{b:02X}" for b in match.group().encode())


def encode_key(key: str) -> str:
    """The source key as it appears in output keys (see the module docstring); the identity for
    ordinary keys. Never yields an empty, ``.`` or ``..`` segment or a control character."""
    if not _UNSAFE.search(key):
        return key
    segments = [_CHARS.sub(_escape, seg) for seg in key.split("/")]
    segments = [seg.replace(".", "%2E") if seg in (".", "..") else seg for seg in segments]
    # Join, escaping each "/" that follows an empty segment (a leading or doubled "/") or precedes
    # an empty last one (a trailing "/"): no segment of the result is empty.
    last = len(segments) - 1
    out: list[str] = [segments[0]]
    for i in range(1, last + 1):
        empty_around = not segments[i - 1] or (i == last and not segments[i])
        out.append(("%2F" if empty_around else "/") + segments[i])
    return "".join(out)


def decode_key(encoded: str) -> str:
    """The source key of ``encode_key(key)``."""
    return unquote(encoded, errors="strict")


def file_dir(output_prefix: str, key: str) -> str:
    """Folder of one source file's output (ends with ``/``)."""
    return f"{output_prefix}{encode_key(key)}/"


def _split_infix(split: int | None) -> str:
    return "" if split is None else f"{split:03d}-"


def part_name(chunk: int, suffix: str = JSONL, split: int | None = None) -> str:
    """The name of a part in its file's folder (``split``: the byte-range split writing it, if any)."""
    return _PART_NAME.format(_split_infix(split), chunk, suffix)


def rejects_name(chunk: int, split: int | None = None) -> str:
    return _REJECTS_NAME.format(_split_infix(split), chunk)


def rejects_uri(output: str, key: str) -> str:
    """The prefix of every rejects object of source ``key`` (the whole file's and its splits'), under the job's
    output ``s3://bucket/output_prefix``: list it to find them (the report's ``rejects_prefix``)."""
    return f"{file_dir(output, key)}{_REJECTS_NAME.split('{', 1)[0]}"


def part_key(output_prefix: str, key: str, chunk: int, suffix: str = JSONL) -> str:
    return file_dir(output_prefix, key) + part_name(chunk, suffix)


def rejects_key(output_prefix: str, key: str, chunk: int) -> str:
    return file_dir(output_prefix, key) + rejects_name(chunk)


def longest_output_key(output_prefix: str, key: str, max_chunks: int, split: int | None = None) -> str:
    """The longest key a file of at most ``max_chunks`` chunks can write (its last rejects; ``split``: of
    the byte-range split writing them, whose names are 4 bytes longer)."""
    return file_dir(output_prefix, key) + rejects_name(max(max_chunks - 1, 0), split)


def report_key(output_prefix: str) -> str:
    return f"{output_prefix}_report.json"


def report_copy_key(output_prefix: str, new_id: str) -> str:
    """Where ``s3batch redrive`` keeps the report it redrives (the new job overwrites ``_report.json``)."""
    return f"{output_prefix}_report.before-redrive-{new_id}.json"


def job_dir(output_prefix: str) -> str:
    """Folder of the job's own objects: report segments, the write check."""
    return f"{output_prefix}_s3batch/"


def segment_key(output_prefix: str, segment: int) -> str:
    return f"{job_dir(output_prefix)}report-{segment:05d}.jsonl"


def write_check_key(output_prefix: str) -> str:
    """Empty object written at the start of a job to prove the output is writable."""
    return f"{job_dir(output_prefix)}write-check"


def job_key_stems(output_prefix: str) -> dict[str, str]:
    """Every key the job itself writes (besides the files' outputs) starts with one of these."""
    return {
        "its report": f"{output_prefix}_report.",
        "its state and write check": job_dir(output_prefix),
    }


def keys_listed_by(prefix: str, output_prefix: str) -> list[str]:
    """What the job would write under the listing of ``prefix`` in its own bucket (the output bucket
    being the source bucket): names of the kinds of keys, empty when none.

    A file's outputs start with ``output_prefix`` + its key (a key under ``prefix``); the job's own
    keys with one of :func:`job_key_stems`. Two key ranges given by their prefixes overlap when one
    prefix starts with the other.
    """
    clashes = []
    if (output_prefix + prefix).startswith(prefix):
        clashes.append("the files' outputs")
    for what, stem in job_key_stems(output_prefix).items():
        if stem.startswith(prefix) or prefix.startswith(stem):
            clashes.append(f"{what} {stem}*")
    return clashes


def output_index(name: str) -> int | None:
    """Chunk index of a part or rejects object name of a whole file (not a split), or None for anything else."""
    kind = output_kind(name)
    return kind[1] if kind is not None else None


def output_kind(name: str) -> tuple[str, int] | None:
    """``("part" | "rejects", chunk)`` of an output object name of a whole file (not a split) in its
    folder, or None."""
    found = output_of(name)
    return (found[0], found[2]) if found is not None and found[1] is None else None


def output_of(name: str) -> tuple[str, int | None, int] | None:
    """``("part" | "rejects", split or None, chunk)`` of any output object name in a file's folder, or None."""
    match = _OUTPUT_RE.fullmatch(name)
    if match is None:
        return None
    split = match.group(2)
    return match.group(1), None if split is None else int(split), int(match.group(3))


def removable(name: str, split: int | None, splits: int) -> bool:
    """Whether output object ``name``, found in a file's folder and not expected there, is to be removed by
    the output of split ``split`` of ``splits`` (None: of the whole file).

    A whole file's output removes every other output object (the parts of splits, too: left by a job that
    split the file); a split removes its own only, and split 0 also those of the whole file and of splits past
    the last (left by a job that did not split the file, or split it in more pieces)."""
    found = output_of(name)
    if found is None:
        return False
    other = found[1]
    if split is None or other == split:
        return True
    return split == 0 and (other is None or other >= splits)


def split_words(split: int | None) -> str:
    """``", split N"`` for messages about a split's output ("" for a whole file's)."""
    return "" if split is None else f", split {split}"

"""The job's own books: counts and key digests that must add up, checked by the code itself.

A job that loses or repeats a file must fail loudly, never report success. The workflow keeps an
order-independent digest of every key it listed and of every key it recorded a result for; at the
end of each run and in the final report they must agree, together with the counts:

    files listed = succeeded + failed + cancelled + pending + in flight

The digest is the sum, modulo 2**63, of the first 8 bytes of each key's SHA-256: adding and removing
keys commutes, so it can be carried across continue-as-new in one integer, and a dropped file, a
file processed twice or a file swapped for another changes it (with overwhelming probability).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

_MOD = 2**63


def key_digest(keys: Iterable[str]) -> int:
    """Order-independent digest of ``keys`` (a multiset: a key counted twice counts twice)."""
    total = 0
    for key in keys:
        total += int.from_bytes(hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()[:8], "big")
    return total % _MOD


def combine(*digests: int) -> int:
    return sum(digests) % _MOD

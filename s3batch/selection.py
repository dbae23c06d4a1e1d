"""Which objects a job takes: the filters on keys and modification times, and manifest locations.

Pure (no I/O): the workflow sandbox and the models import this module.

**Filters** (job options, applied while listing, to a prefix's listing and to a manifest's rows):

- ``include``: globs; a key is taken only when it matches at least one (none given: every key);
- ``exclude``: globs; a key matching any of them is left out (exclude wins over include);
- ``modified_after`` / ``modified_before``: ISO 8601 times; an object is taken when
  ``modified_after <= LastModified < modified_before`` (a time without a zone is UTC).

A glob is matched against the whole key (not the part after the prefix) with ``fnmatch``,
case-sensitive: ``*`` and ``?`` also match ``/``, ``[abc]`` is a set. ``"*.csv"`` takes every CSV
at any depth; ``"2026/11/*/part-*"`` the parts of November's days.

Objects left out by a filter are not *listed*: they are never in the job's books or its report
(like keys outside the prefix), so the books add up over the objects taken.
"""

from __future__ import annotations

import datetime
import fnmatch
from typing import NamedTuple


def parse_time(value: str) -> datetime.datetime:
    """An ISO 8601 date or time (``2026-11-30``, ``2026-11-30T08:00:00Z``, ``...+01:00``), aware
    (UTC when it has no zone).

    Raises:
        ValueError: ``value`` is not ISO 8601.
    """
    moment = datetime.datetime.fromisoformat(value)
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=datetime.UTC)


class KeyFilter(NamedTuple):
    """The job's filters (see the module docstring); every field empty or None: takes everything."""

    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    modified_after: str | None = None
    modified_before: str | None = None

    @property
    def active(self) -> bool:
        return bool(self.include or self.exclude or self.modified_after or self.modified_before)

    def takes_key(self, key: str) -> bool:
        """Whether ``key`` passes the globs."""
        if self.include and not any(fnmatch.fnmatchcase(key, g) for g in self.include):
            return False
        return not any(fnmatch.fnmatchcase(key, g) for g in self.exclude)

    def takes(self, key: str, modified: datetime.datetime | None) -> bool:
        """Whether the object ``key``, last modified at ``modified`` (None: unknown, not filtered on
        time), is taken."""
        if not self.takes_key(key):
            return False
        if modified is None:
            return True
        if self.modified_after is not None and modified < parse_time(self.modified_after):
            return False
        return not (self.modified_before is not None and modified >= parse_time(self.modified_before))


def split_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/key`` as ``(bucket, key)`` (validated by the models' pattern)."""
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return bucket, key

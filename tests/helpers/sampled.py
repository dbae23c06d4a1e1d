"""Coverage's tracing over the first examples of a property test only (``TracedExamples``).

A property test runs its body on tens to thousands of generated examples, and under coverage every line of
the product it runs is traced, example after example: the record parsers' loops cost 2.4 times their CPU
traced, and the property tests were about a tenth of the suite's CPU. What the later examples add is mostly the
search for a counterexample, not coverage: they run paths already traced (the 55 lines of the parsers that only
later examples reached, in the property modules run alone, are reached by other tests: the suite's total did not
move, and it is checked against the floor in pyproject.toml either way). So a property test is traced until
:data:`PATIENCE` examples in a row have reached no line or branch not reached before, and the rest (generation
and shrinking included) run with tracing paused in this process; every example still runs, and fails the test
as before. Measured over the whole suite: the total stayed 93.3 %; the property modules' CPU under coverage
fell from 302 to 222 core-s (184 untraced) for the @given modules.

``tests/conftest.py`` applies it to every ``@given`` test (through ``hypothesis.inner_test``, the hook
hypothesis offers plugins). The PostgreSQL state machine is not sampled: its CPU is the database's and its
child processes', not tracing in the test's process.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import coverage

PATIENCE = 10
"""Examples in a row that reach nothing new after which a property test's tracing is paused."""


class TracedExamples:
    """Counts a property test's examples and pauses coverage once :data:`PATIENCE` examples in a row have
    reached no line or branch not reached before (in this process), until :meth:`end`."""

    def __init__(self, patience: int = PATIENCE) -> None:
        self.patience = patience
        self._reached = -1
        self._dry = 0
        self._paused: coverage.Coverage | None = None

    def example(self) -> None:
        """Called as an example starts."""
        cov = coverage.Coverage.current()
        if cov is None or self._paused is not None:
            return
        reached = _reached(cov)
        if reached is None:
            return
        self._dry = 0 if reached > self._reached else self._dry + 1
        self._reached = reached
        if self._dry >= self.patience:
            cov.stop()
            self._paused = cov

    def end(self) -> None:
        """Called when the test ends (passed or not): tracing as before the test."""
        if self._paused is not None:
            self._paused.start()
            self._paused = None

    def wrap(self, inner: Callable[..., Any]) -> Callable[..., Any]:
        """``inner`` (a ``@given`` test's body), counting its calls."""

        @functools.wraps(inner)
        def example(*args: Any, **kwargs: Any) -> Any:
            self.example()
            return inner(*args, **kwargs)

        return example


def _reached(cov: coverage.Coverage) -> int | None:
    """How many lines or branches the tracers hold (every file's set of them), or None where that cannot be
    read. Coverage's public ``get_data()`` would say it too, but it saves the data and walks the source tree
    for unexecuted files at each call: half a second per example, more than tracing the example costs. So this
    reads the collector's sets (coverage is pinned in pyproject.toml; without them, tracing is never paused).
    The sets only grow between saves (coverage saves at the end of the process): a fall, after a save, only
    makes the test wait longer to pause."""
    data = getattr(getattr(cov, "_collector", None), "data", None)
    if not isinstance(data, dict):
        return None
    return sum(len(found) for found in data.copy().values())

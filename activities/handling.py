"""Running the job's handler on a chunk's records, and keeping the chunk's books.

The handler's outputs and rejects are encoded to JSON here, inside the guard that turns any handler
error into a ``HandlerError`` naming the lines, never the record. Before a chunk is committed every
record read must be accounted for (see :meth:`HandlerRun.check_chunk`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import ValidationError

from s3batch.checkpoint import Checkpoint
from s3batch.columns import encoder_of
from s3batch.errors import AccountingError, BadFile, HandlerError
from s3batch.formats.common import Record
from s3batch.handlers import ChunkContext, ChunkHandler, HandlerResult, Reject, in_chunk
from s3batch.jsonvalues import encode_json
from s3batch.rejects import reason_key
from s3batch.validation import describe_validation_error

_JSON_TYPE_ERRORS = ("Type is not JSON serializable: ", "Dict key must be str", "Integer exceeds", "Recursion limit")
"""Beginnings of the TypeErrors of ``encode_json`` that name a type or a limit, never a value."""


class HandlerRun:
    """The job's handler over one file's chunks, with the books of the chunk being built.

    Args:
        handler: The registered handler.
        name: Its name (in error messages).
        where: ``s3://bucket/key`` of the file.
    """

    def __init__(self, handler: ChunkHandler, name: str, where: str) -> None:
        self.handler = handler
        self.name = name
        self.where = where
        self.one_to_one: bool | None = None
        """Every chunk so far came from a handler that accounts for each record it was given (None: no
        chunk processed)."""
        self.dropped = 0
        """Records the handler dropped in the chunk being built."""
        self._handed = self._handler_rejects = 0
        self._free_form = False
        self.reasons: Counter[str] = Counter()
        """Reasons of the rejects of the chunk being built (see ``s3batch.rejects``; taken at its commit)."""
        self.context: ChunkContext | None = None
        """The chunk being built, as the handler sees it (``s3batch.handlers.chunk_context``)."""
        self.encoder = encoder_of(handler)
        """The handler's block encoder (``s3batch.columns``), or None."""

    def handle(
        self,
        batch: list[Record],
        output: list[bytes],
        rejects: list[tuple[int, bytes]],
        lines: list[int] | None = None,
    ) -> int:
        """Run the handler on the parsed records of ``batch``; append JSON-encoded outputs and rejects
        (as ``(line, JSON line)``), and to ``lines`` the source line of each output (see
        ``HandlerResult.lines``). Returns the bytes appended."""
        good = batch
        before = len(rejects)
        if any(r.error is not None for r in batch):
            good = []
            parser_rejects = []
            for r in batch:
                if r.error is None:
                    good.append(r)
                else:
                    parser_rejects.append(Reject(r.line, r.error, summary=r.error))  # the parsers' own words
            self._add_rejects(parser_rejects, rejects)
        if not good:
            return _size(rejects, before)
        try:
            result = self._counted(good)
        except Exception as err:  # noqa: BLE001 - any handler error fails the attempt, without its text
            # The message reaches workflow history and the report: name the error, never its text,
            # which may quote record contents (pydantic errors are listed by field, without input).
            reason = describe_validation_error(err) if isinstance(err, ValidationError) else type(err).__name__
            raise HandlerError(
                f"handler {self.name!r} raised {reason} on {self.where} lines "
                f"{good[0].line}-{good[-1].line}; the whole chunk is retried. Reproduce it locally on "
                "those lines to see the record."
            ) from None
        encoded = result.output if result.encoded else self._encoded(result.output, "returned a value")
        output.extend(encoded)
        if lines is not None:
            lines.extend(_output_lines(result, good))
        self._add_rejects(result.rejects, rejects)
        return sum(map(len, encoded)) + _size(rejects, before)

    def passed_through(self, records: int) -> None:
        """Count ``records`` written at once by the fast CSV path, as ``passthrough`` or the handler's block
        encoder writes them (one output each, no reject: ``s3batch.formats.fastcsv.FastCsvParser.take_json``)."""
        self._handed += records

    def _add_rejects(self, found: list[Reject], rejects: list[tuple[int, bytes]]) -> None:
        documents = ({"line": r.line, "reason": r.reason, "record": r.value} for r in found)
        lines = self._encoded(documents, "rejected a record")
        rejects.extend(zip((r.line for r in found), lines, strict=True))
        self.reasons.update(reason_key(getattr(r, "summary", None)) for r in found)

    def _encoded(self, values: Iterable[Any], what: str) -> list[bytes]:
        """``values`` as JSON documents; a value that is not JSON fails the file (``BadFile``), naming
        its type, never the value."""
        try:
            return [encode_json(v) for v in values]
        except TypeError as err:
            text = str(err)
            reason = text if text.startswith(_JSON_TYPE_ERRORS) else type(err).__name__
            raise BadFile(
                f"handler {self.name!r} {what} that is not JSON-serialisable for {self.where} ({reason})"
            ) from None

    def _counted(self, records: Sequence[Record]) -> HandlerResult:
        """The job's handler, counting what it was given, rejected and dropped (for ``check_chunk``).

        Its outputs and rejects are read here, inside ``handle``'s guard: a lazy iterator that
        raises while it is consumed fails like a handler that raised (its error never quoted)."""
        with in_chunk(self.context):
            result = self.handler(records)
        result = HandlerResult(
            list(result.output),
            list(result.rejects),
            getattr(result, "encoded", False),
            getattr(result, "dropped", None),
            getattr(result, "lines", None),
        )
        self._handed += len(records)
        self._handler_rejects += len(result.rejects)
        dropped = getattr(result, "dropped", None)
        if dropped is None:
            self._free_form = True
        else:
            self.dropped += dropped
        return result

    def take_reasons(self) -> Counter[str]:
        """The reasons of the chunk's rejects (then the next chunk's count from zero)."""
        reasons, self.reasons = self.reasons, Counter()
        return reasons

    def check_chunk(self, cp: Checkpoint, taken: int, outputs: int, rejects: int) -> None:
        """Before a chunk is committed: every record read is accounted for (then the books start over).

        Records read = parser rejects + records given to the handler. A handler that reports its
        ``dropped`` count (record handlers, ``passthrough``, ``customers``) must account for each
        record it was given: outputs + its rejects + dropped = given. A chunk handler that does not
        (``dropped`` None: fan-out, aggregation) may emit any number of outputs; only its rejects are
        checked, at most one per record given.
        """
        handed, handler_rejects, dropped, free = self._handed, self._handler_rejects, self.dropped, self._free_form
        self._handed = self._handler_rejects = self.dropped = 0
        self._free_form = False
        parser_rejects = rejects - handler_rejects
        problem = None
        if parser_rejects < 0 or parser_rejects + handed != taken:
            problem = f"{taken} records read, {parser_rejects} rejected by the parser, {handed} given to the handler"
        elif free:
            if handler_rejects > handed:
                problem = f"the handler rejected {handler_rejects} of the {handed} records it was given"
        elif outputs + handler_rejects + dropped != handed:
            problem = (
                f"the handler was given {handed} records but returned {outputs} outputs + {handler_rejects} "
                f"rejects + {dropped} dropped"
            )
        if problem:
            raise self.accounting_error(f"chunk {cp.chunk} (lines from {cp.line}): {problem}")
        self.one_to_one = not free and self.one_to_one is not False

    def check_records(self, cp: Checkpoint) -> None:
        """Records read = written + rejected + dropped, for handlers that account for each record."""
        if self.one_to_one and cp.next_record != cp.records_written + cp.rejected + cp.dropped:
            raise self.accounting_error(
                f"{cp.next_record} records read, but {cp.records_written} written + {cp.rejected} rejected + "
                f"{cp.dropped} dropped = {cp.records_written + cp.rejected + cp.dropped}"
            )

    def accounting_error(self, what: str) -> AccountingError:
        return AccountingError(
            f"accounting error in {self.where} (handler {self.name!r}): {what}. A handler returning "
            "HandlerResult(..., dropped=n) must account for every record it is given (outputs + rejects + "
            "dropped); otherwise this is a bug in s3batch, please report it."
        )


def _size(rejects: list[tuple[int, bytes]], before: int) -> int:
    """The bytes of the rejects appended from ``before`` on."""
    return sum(len(b) for _, b in rejects[before:]) if len(rejects) > before else 0


def _output_lines(result: HandlerResult, given: Sequence[Record]) -> Sequence[int]:
    """The source line of each of ``result``'s outputs (see ``HandlerResult.lines``)."""
    if result.lines is not None and len(result.lines) == len(result.output):
        return result.lines
    if len(result.output) == len(given):
        return [r.line for r in given]
    return [given[0].line] * len(result.output)

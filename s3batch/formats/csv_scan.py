"""The csv module's reader state machine over raw bytes, as far as it decides where a record ends.

Used to skip a record longer than ``max_record_bytes`` without holding it (see
:class:`s3batch.formats.csv.CsvParser`): its bytes are scanned for the dialect's delimiter, quote and
escape character (as bytes of the stream) line by line, and the record ends where the csv module
would end it.
"""

from __future__ import annotations

# States of the csv module's reader (doublequote, strict), as far as they decide where a record ends.
START, IN_FIELD, QUOTED, QUOTE_IN_QUOTED, ERROR, ESCAPED, ESCAPED_IN_QUOTED = range(7)

Tokens = tuple[bytes, bytes, "bytes | None"]
"""``(delimiter, quotechar, escapechar)`` as bytes of the stream."""


def scan(state: int, data: bytes, pos: int, end: int, tokens: Tokens) -> int:
    """Run the csv reader's state machine over ``data[pos:end]`` (no line terminator inside)."""
    delim, quote, esc = tokens
    find = data.find
    startswith = data.startswith
    while pos < end:
        if state == QUOTED:
            q = find(quote, pos, end)
            e = find(esc, pos, end if q < 0 else q) if esc is not None else -1
            if e >= 0:
                state, pos = ESCAPED_IN_QUOTED, e + len(esc)  # type: ignore[arg-type]
            elif q < 0:
                return QUOTED
            else:
                state, pos = QUOTE_IN_QUOTED, q + len(quote)
        elif state == IN_FIELD:
            d = find(delim, pos, end)
            e = find(esc, pos, end if d < 0 else d) if esc is not None else -1
            if e >= 0:
                state, pos = ESCAPED, e + len(esc)  # type: ignore[arg-type]
            elif d < 0:
                return IN_FIELD
            else:
                state, pos = START, d + len(delim)
        elif state in (ESCAPED, ESCAPED_IN_QUOTED):
            # The escaped character is data whatever it is (a token, or one byte: in UTF-8 the rest of
            # a character never starts a token).
            state = IN_FIELD if state == ESCAPED else QUOTED
            pos += next((len(t) for t in tokens if t is not None and startswith(t, pos)), 1)
        elif state == QUOTE_IN_QUOTED:
            if startswith(quote, pos):
                state, pos = QUOTED, pos + len(quote)  # an escaped quote
            elif startswith(delim, pos):
                state, pos = START, pos + len(delim)
            else:
                return ERROR  # text after a closing quote: csv raises, the line ends the record
        elif startswith(quote, pos):
            state, pos = QUOTED, pos + len(quote)
        elif startswith(delim, pos):
            pos += len(delim)
        elif esc is not None and startswith(esc, pos):
            state, pos = ESCAPED, pos + len(esc)
        else:
            state, pos = IN_FIELD, pos + 1
    return state


def after_line_end(state: int, terminator: bytes) -> int | None:
    """The state on the next line when the record goes on past ``terminator``; None when it ends there."""
    if state in (QUOTED, ESCAPED_IN_QUOTED):
        return QUOTED  # a line break inside a quoted field (escaped or not) is data
    if state == ESCAPED and terminator != b"\r\n":
        return IN_FIELD  # an escaped line break (of a CRLF, only the CR is escaped: the LF ends the record)
    return None


def with_nulls(row: list[str], text: str, delimiter: str, quote: str, escape: str | None) -> list[str | None]:
    """``row`` (a record as the csv module read it from ``text``, every line of it) with its unquoted empty fields
    None: the csv module reads ``a,,b`` and ``a,"",b`` alike, PostgreSQL's ``COPY ... (FORMAT csv)`` does not.

    Which fields were quoted is told from where each starts in ``text``. Without an escape character a field's
    length there follows from its value (quoted: the quotes, and each quote inside doubled); with one, the field is
    walked as the reader's state machine walks it (``strict``: a closing quote is followed by a delimiter or the
    line end). A record without a quote has none quoted."""
    if quote not in text:
        return [value or None for value in row]
    out: list[str | None] = list(row)
    pos = 0
    for i, value in enumerate(row):
        quoted = text.startswith(quote, pos)
        if not quoted and not value:
            out[i] = None
        if escape is None:
            pos += len(value) + (2 + value.count(quote) if quoted else 0) + 1
        else:
            pos = _field_end(text, pos, quoted, delimiter, quote, escape) + 1
    return out


def _field_end(text: str, pos: int, quoted: bool, delimiter: str, quote: str, escape: str) -> int:
    """Where the field starting at ``pos`` ends (at its delimiter or line end), with an escape character."""
    end = len(text)
    if quoted:
        pos += 1
        while pos < end:
            c = text[pos]
            if c == escape:
                pos += 2
            elif c != quote:
                pos += 1
            elif text.startswith(quote, pos + 1):
                pos += 2  # a doubled quote
            else:
                return pos + 1
        return pos
    while pos < end:
        c = text[pos]
        if c == escape:
            pos += 2
        elif c == delimiter or c in "\r\n":
            return pos
        else:
            pos += 1
    return pos

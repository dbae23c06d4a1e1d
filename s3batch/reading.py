"""How a file is read: the CSV dialect, its header and the text encoding (issue 14), checked at start.

The job options ``delimiter``, ``quotechar``, ``escapechar``, ``header`` and ``encoding`` (top-level
fields of ``S3BatchInput``, None when not given) become one :class:`Reading` per file:

- ``delimiter``: any single character but a line break (``,`` by default; a tab for ``.tsv`` keys);
- ``quotechar``: ``"`` by default; a doubled quote inside a quoted field is one quote, as always;
- ``escapechar``: none by default; when given, it takes the next character literally (a delimiter,
  a quote, a line break, itself), as Python's csv module does;
- ``header``: ``first_row`` (default: the first row names the columns), ``none`` (the columns are
  ``col_1``, ``col_2``..., as many as the first row has), or a list of names (every row is data);
- ``encoding``: ``utf-8`` by default (a BOM is skipped; undecodable bytes make the record a reject,
  never replaced), ``utf-16`` (its BOM says the byte order; little-endian without one),
  ``utf-16-le``/``utf-16-be``, ``latin-1``, ``cp1252`` or any Python codec that writes ASCII as ASCII
  without shift states (the line ends and the dialect characters must be the ASCII bytes they are in
  ASCII). UTF-32 and stateful codecs (``utf-7``, ``iso2022_*``, ``hz``) are refused at start.

For a UTF-16 file, ``max_record_bytes`` counts a record's bytes as UTF-8 (what the parser reads).
The options shape CSV only: JSON and JSON Lines are UTF-8 (RFC 8259), Parquet is typed.

Byte offsets stay exact: files in an ASCII-compatible encoding are split into lines on their bytes
and each line decoded; UTF-16 is transcoded to UTF-8 on the way in, the source position of every
line end kept (``s3batch.formats.transcode``). A record longer than ``max_record_bytes`` is skipped
by a byte-level scan of the dialect characters; in the East Asian multi-byte codecs whose second
bytes can be ASCII (``shift_jis``, ``cp932``, ``big5``, ``gbk``, ``gb18030``...) that scan may end
such a record early when a second byte equals the quote, delimiter or escape character.

Pure Python (no I/O): the workflow validates the job input with it.
"""

from __future__ import annotations

import codecs
import csv
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

HeaderOption = Literal["first_row", "none"] | list[str]

READ_OPTIONS = frozenset({"delimiter", "quotechar", "escapechar", "header", "encoding"})
"""The job options that say how files are read (None: the default)."""

WIDE_ENCODINGS = frozenset({"utf-16", "utf-16-le", "utf-16-be"})
"""Encodings whose line ends are not single ASCII bytes: transcoded to UTF-8 while read."""

_ASCII = bytes(range(128))
_TSV_SUFFIXES = (".tsv", ".tab")
MAX_COLUMNS = 10_000
"""At most this many names in a ``header`` list."""


def normalize_encoding(name: str) -> str:
    """The codec's canonical name (``latin-1`` -> ``iso8859-1``), checked to be readable exactly.

    Raises:
        ValueError: Not a Python text codec, or one s3batch cannot read with exact byte offsets.
    """
    try:
        info = codecs.lookup(name)
    except LookupError:
        raise ValueError(
            f"unknown encoding {name!r}: give a Python codec name such as 'utf-8', 'utf-16', 'latin-1' or 'cp1252'"
        ) from None
    canonical = info.name
    if not getattr(info, "_is_text_encoding", True):
        raise ValueError(f"{name!r} is not a text encoding")
    if canonical in ("utf-8", "utf-8-sig"):
        return "utf-8"  # utf-8 skips a BOM anyway
    if canonical in WIDE_ENCODINGS:
        return canonical
    if canonical.startswith("utf-32"):
        raise ValueError(f"{name!r} (UTF-32) is not read by s3batch: convert the files to UTF-8 or UTF-16")
    if canonical.startswith(("iso2022", "hz")) or canonical == "utf-7":
        raise ValueError(
            f"{name!r} is a stateful encoding (its shift sequences carry over lines), which s3batch cannot resume "
            "in the middle of a file: convert the files to UTF-8"
        )
    try:
        ascii_same = _ASCII.decode(canonical) == _ASCII.decode("ascii") and _ASCII.decode().encode(canonical) == _ASCII
    except (UnicodeError, LookupError):
        ascii_same = False
    if not ascii_same:
        raise ValueError(
            f"{name!r} does not write ASCII characters and line ends as ASCII bytes (EBCDIC, UTF-32...), so "
            "s3batch cannot find the line ends of such a file exactly: convert the files to UTF-8 or UTF-16"
        )
    return canonical


def check_dialect(delimiter: str, quotechar: str, escapechar: str | None) -> None:
    """Raises ValueError naming the option when the characters cannot make a CSV dialect."""
    chars = {"delimiter": delimiter, "quotechar": quotechar, "escapechar": escapechar}
    for option, char in chars.items():
        if char is None:
            continue
        if len(char) != 1:
            raise ValueError(f"{option}: must be exactly one character, got {len(char)}")
        if char in "\r\n":
            raise ValueError(f"{option}: a line break cannot be the {option}")
    given = [(option, char) for option, char in chars.items() if char is not None]
    for i, (a, ca) in enumerate(given):
        for b, cb in given[i + 1 :]:
            if ca == cb:
                raise ValueError(f"{a} and {b}: must be different characters, both are {ca!r}")
    try:
        csv.reader([], delimiter=delimiter, quotechar=quotechar, escapechar=escapechar, strict=True)
    except (TypeError, csv.Error) as err:
        raise ValueError(f"delimiter, quotechar, escapechar: not a CSV dialect ({err})") from None


def check_header(header: Any) -> None:
    """Raises ValueError when a ``header`` list of names cannot name columns."""
    if isinstance(header, str):
        return
    if not header:
        raise ValueError("header: a list of column names needs at least one name")
    if len(header) > MAX_COLUMNS:
        raise ValueError(f"header: at most {MAX_COLUMNS} column names")
    seen: dict[str, int] = {}
    for number, name in enumerate(header, 1):
        if not name:
            raise ValueError(f"header: name {number} is empty; every column needs a distinct, non-empty name")
        if name in seen:
            raise ValueError(f"header: names {seen[name]} and {number} are the same; give every column a distinct name")
        seen[name] = number


@dataclass(frozen=True)
class Reading:
    """How one file is read: the resolved reading options (defaults filled in)."""

    delimiter: str = ","
    quotechar: str = '"'
    escapechar: str | None = None
    header_row: bool = True
    """The first row names the columns (``header: first_row``)."""
    names: tuple[str, ...] | None = None
    """The column names given in the job (``header: [...]``); None: from the file."""
    encoding: str = "utf-8"
    """The canonical codec name (see :func:`normalize_encoding`)."""
    empty_null: bool = False
    """An unquoted empty field is None (as PostgreSQL's ``COPY ... (FORMAT csv)`` reads it; a quoted empty field
    ``""`` stays ``''``); False: both are ``''``. Set by the job's sink (``PostgresSink.empty_as``), which carries
    it in the fingerprint: not a reading option of its own."""

    @classmethod
    def of(cls, key: str, options: Mapping[str, Any]) -> Reading:
        """The reading of ``key`` under the job's reading options (``READ_OPTIONS``; None: default).

        Raises:
            ValueError: An option is invalid (the job input is validated before, so only for an input
                that did not go through ``S3BatchInput``).
        """
        base = key.lower()
        for suffix in (".gz", ".zst", ".bz2"):
            base = base.removesuffix(suffix)
        delimiter = options.get("delimiter") or ("\t" if base.endswith(_TSV_SUFFIXES) else ",")
        quotechar = options.get("quotechar") or '"'
        escapechar = options.get("escapechar")
        check_dialect(delimiter, quotechar, escapechar)
        header = options.get("header") or "first_row"
        check_header(header)
        given = options.get("encoding") or "utf-8"
        encoding = normalize_encoding(given)
        reading = cls(
            delimiter=delimiter,
            quotechar=quotechar,
            escapechar=escapechar,
            header_row=header == "first_row",
            names=tuple(header) if isinstance(header, list) else None,
            encoding=encoding,
        )
        try:
            reading.tokens()  # every dialect character must be written in the encoding
        except ValueError as err:
            raise ValueError(f"{err} {given!r}") from None
        return reading

    @property
    def wide(self) -> bool:
        """Transcoded to UTF-8 while read (UTF-16)."""
        return self.encoding in WIDE_ENCODINGS

    @property
    def byte_encoding(self) -> str:
        """The encoding of the bytes the CSV parser splits into lines."""
        return "utf-8" if self.wide else self.encoding

    def tokens(self) -> tuple[bytes, bytes, bytes | None]:
        """``(delimiter, quotechar, escapechar)`` as bytes of :attr:`byte_encoding`.

        Raises:
            ValueError: A dialect character cannot be written in the encoding.
        """
        out: list[bytes | None] = []
        chars = (("delimiter", self.delimiter), ("quotechar", self.quotechar), ("escapechar", self.escapechar))
        for option, char in chars:
            if char is None:
                out.append(None)
                continue
            try:
                out.append(char.encode(self.byte_encoding))
            except UnicodeEncodeError:
                raise ValueError(f"{option}: {char!r} cannot be written in the encoding") from None
        delimiter, quote, escape = out
        assert delimiter is not None and quote is not None
        return delimiter, quote, escape

    def changed(self) -> dict[str, Any]:
        """The options that differ from the defaults (part of the output fingerprint); {} for the defaults."""
        default = Reading()
        out: dict[str, Any] = {}
        for name in ("delimiter", "quotechar", "escapechar", "header_row", "encoding"):
            if getattr(self, name) != getattr(default, name):
                out[name] = getattr(self, name)
        if self.names is not None:
            out["names"] = list(self.names)
        return out

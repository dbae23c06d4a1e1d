"""Logging set-up for the worker: plain text, or one JSON object per line for log pipelines.

JSON lines carry the job (workflow ID), the activity, its attempt and the file key when known.
Messages never contain record contents or credentials: the activities log keys, offsets and
counters only.

Object keys are chosen by whoever writes the source bucket and may hold control characters: in text
logs every unprintable character is written as an escape (``\\x1b``, ``\\n``), so a key can neither
forge a log line nor send escape sequences to a terminal; JSON logs quote them already.
"""

from __future__ import annotations

import datetime
import json
import logging
import re
from typing import Any

_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")
"""Characters a terminal acts on or that hide or reorder text: C0/C1 controls (ESC starts escape
sequences, CR and LF start or overwrite lines), zero-width characters and bidirectional overrides."""


def printable(value: object, *, keep: str = "") -> str:
    """``value`` as text that shows what it is in a log or on a terminal: every unprintable character
    (but those in ``keep``) written as a Python escape (``\\x1b``, ``\\u202e``). Object keys, error
    messages and anything read from a report go through here before they are shown."""
    return _UNPRINTABLE.sub(
        lambda m: m.group() if m.group() in keep else m.group().encode("unicode_escape").decode("ascii"), str(value)
    )


class TextFormatter(logging.Formatter):
    """``time level logger message``, with the message escaped (see :func:`printable`): one record
    is one line. A traceback keeps its line breaks, its other control characters are escaped."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = printable(record.message)
        return super().formatMessage(record)

    def formatException(self, ei: Any) -> str:
        return printable(super().formatException(ei), keep="\n")

    def formatStack(self, stack_info: str) -> str:
        return printable(super().formatStack(stack_info), keep="\n")


_ACTIVITY_FIELDS = {"workflow_id": "job_id", "activity_type": "activity", "attempt": "attempt"}
_WORKFLOW_FIELDS = {"workflow_id": "job_id", "run_id": "run_id", "attempt": "attempt"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for attr, fields in (("temporal_activity", _ACTIVITY_FIELDS), ("temporal_workflow", _WORKFLOW_FIELDS)):
            details = getattr(record, attr, None)
            if isinstance(details, dict):
                for src, dst in fields.items():
                    if src in details:
                        data[dst] = details[src]
        key = getattr(record, "s3_key", None)
        if key is not None:
            data["key"] = key
        if record.exc_info:
            data["error"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str)


def configure(level: str, fmt: str) -> None:
    handler = logging.StreamHandler()
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())

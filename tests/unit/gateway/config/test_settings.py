"""The settings declaration (gateway.settings) against what the parser (gateway.config) actually reads.

A key added to the parser and not declared, one declared and never read, or a type, default, minimum or
required-ness that differs fails here, naming the key: the reference, the JSON Schema, ``config show``
and the environment overrides all come from the declaration.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from effectgate.gateway import config
from effectgate.gateway.config import reader, settings
from tests.unit.gateway.config.full_config import ENV, FULL, LEGACY

KINDS: dict[Any, str] = {
    str: "string",
    int: "integer",
    (int, float): "number",
    bool: "boolean",
    list: "strings",
    dict: "table",
    (int, float, str): "days",
    (str, bool): "header",
}


def parser_reads() -> list[reader.Read]:
    found = []
    for text in (FULL, LEGACY):
        with reader.reads() as seen:
            try:
                config.parse(text, env=ENV)
            except config.ConfigError as exc:
                # tracing without the otel extra is refused after every key was read; nothing else may be
                assert all("tracing" in p for p in exc.problems), exc.problems
        found += seen
    return found


def declared_path(read: reader.Read) -> str:
    prefix = re.sub(r"\[\d+\]", "[]", read.prefix).replace("NAME0", "*")
    key = "*" if read.key == "NAME0" else read.key
    return f"{prefix}.{key}" if prefix else key


def test_every_key_the_parser_reads_is_declared_and_every_declared_key_is_read() -> None:
    reads = parser_reads()
    tables = set(settings.tables())
    read_keys = set()
    undeclared = []
    for read in reads:
        path = declared_path(read)
        setting = settings.BY_PATH.get(path)
        if setting is None and (
            path in tables or path.rstrip("[]") in {t.removesuffix("[]") for t in tables}
        ):
            continue  # a table: its keys are checked one by one
        if setting is None:
            undeclared.append(path)
            continue
        read_keys.add(path)
    assert not undeclared, (
        f"keys the parser reads that gateway/config/settings.py does not declare: {sorted(set(undeclared))}. Declare "
        "them there; for a new kind of table, add one such table to FULL (full_config.py) so its keys are checked too"
    )
    never_read = sorted(set(settings.BY_PATH) - read_keys)
    assert not never_read, (
        f"declared in gateway/config/settings.py but never read by the parser: {never_read}"
    )


def test_declared_types_defaults_minimums_and_required_match_the_parser() -> None:
    wrong = []
    for read in parser_reads():
        setting = settings.BY_PATH.get(declared_path(read))
        if setting is None:
            continue
        kind = KINDS.get(read.kind)
        if kind != setting.kind:
            wrong.append(f"{setting.path}: declared {setting.kind}, the parser reads {kind or read.kind}")
        if setting.required != read.required:
            wrong.append(f"{setting.path}: declared required={setting.required}, the parser {read.required}")
        if setting.default_text is None and setting.kind not in ("days", "table") and not setting.required:
            if setting.default != read.default:
                wrong.append(
                    f"{setting.path}: declared default {setting.default!r}, the parser {read.default!r}"
                )
        if read.minimum is not None and setting.minimum != pytest.approx(read.minimum):
            wrong.append(f"{setting.path}: declared minimum {setting.minimum!r}, the parser {read.minimum!r}")
    assert not wrong, "\n".join(wrong)


def test_an_undeclared_key_in_the_parser_is_caught() -> None:
    # What another branch adding `gw.number("new_key", …)` without declaring it would see.
    reads = parser_reads()
    reads.append(reader.Read("gateway", "new_key", (int, float), 1.0, False, 0))
    assert [declared_path(r) for r in reads if declared_path(r) not in settings.BY_PATH][
        -1
    ] == "gateway.new_key"


def test_every_table_has_a_description_and_every_setting_a_doc() -> None:
    assert {s.table for s in settings.SETTINGS} <= set(settings.TABLES) <= set(settings.tables())
    assert all(s.doc for s in settings.SETTINGS)
    assert len(settings.BY_PATH) == len(settings.SETTINGS)

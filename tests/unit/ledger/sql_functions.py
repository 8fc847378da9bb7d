"""The project's SQL functions read from the files alone: which ones the migrations create (and drop), and which
ones the named blocks of ledger/sql call. The versioning rule (docs/adr/0017-versioned-sql-functions.md) is checked
on these by tests/unit/ledger/test_sql_function_versions.py and against a migrated database by
tests/integration/ledger/test_sql_function_versions.py."""

from __future__ import annotations

import re

from effectgate.ledger.migrate import discover
from effectgate.ledger.queries import load

VERSIONED = re.compile(r"_v[0-9]+$")
_CREATE = re.compile(r"\bCREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION\s+([a-z_][a-z0-9_]*)\s*\(", re.IGNORECASE)
_DROP = re.compile(r"\bDROP\s+FUNCTION\s+(?:IF\s+EXISTS\s+)?([a-z_][a-z0-9_]*)", re.IGNORECASE)
_CALL = re.compile(r"\b([a-z_][a-z0-9_]*)\s*\(", re.IGNORECASE)
_LITERAL = re.compile(r"'(?:[^']|'')*'")
_LINE_COMMENT = re.compile(r"--[^\n]*")


def defined_functions() -> tuple[set[str], set[str]]:
    """(every function a migration ever created, those still defined after the last migration)."""
    ever: set[str] = set()
    live: set[str] = set()
    for migration in discover():
        text = _LINE_COMMENT.sub("", migration.sql)
        for match in re.finditer(f"{_CREATE.pattern}|{_DROP.pattern}", text, re.IGNORECASE):
            created, dropped = match.group(1), match.group(2)
            if created:
                ever.add(created.lower())
                live.add(created.lower())
            else:
                live.discard(dropped.lower())
    return ever, live


def creations() -> dict[str, list[str]]:
    """{function: the migration files that create it, in order}."""
    made: dict[str, list[str]] = {}
    for migration in discover():
        for name in _CREATE.findall(_LINE_COMMENT.sub("", migration.sql)):
            made.setdefault(name.lower(), []).append(migration.name)
    return made


def called_names(sql: str) -> set[str]:
    """Every identifier written as ``name(`` outside string literals (the blocks come without comments)."""
    return {name.lower() for name in _CALL.findall(_LITERAL.sub("''", sql))}


def project_calls() -> dict[str, set[str]]:
    """{function the migrations define: the ledger/sql blocks that call it}."""
    ever, _ = defined_functions()
    calls: dict[str, set[str]] = {}
    for block, sql in load().items():
        for name in called_names(sql) & ever:
            calls.setdefault(name, set()).add(block)
    return calls

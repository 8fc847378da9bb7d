"""Named SQL blocks from ``ledger/sql/*.sql``, loaded once.

A block starts with ``-- name: noun_verb_guard`` and one comment line saying what it does; the name is
the only way Python code reaches SQL, so a reader can grep one name from call to query.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from importlib.resources import files
from importlib.resources.abc import Traversable
from typing import LiteralString

# Read as package data, so an installed wheel finds them wherever it is installed.
SQL_DIR: Traversable = files("effectgate.ledger").joinpath("sql")
_NAME = re.compile(r"^-- name: ([a-z][a-z0-9_]*)\s*$", re.MULTILINE)


def parse(text: str, origin: str = "<sql>") -> dict[str, str]:
    """Split one SQL file into {name: query}; a repeated name is an error."""
    blocks: dict[str, str] = {}
    parts = _NAME.split(text)
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in blocks:
            raise ValueError(f"{origin}: query name {name!r} appears twice")
        # Whole-line comments are for the reader of the file; the driver is sent the statement alone. It
        # keeps long statements under psycopg's cache limit for converted queries (4096 characters), which
        # the batched claim passed with its comments and paid a parse of its placeholders on every batch.
        lines = (line for line in body.splitlines() if not line.lstrip().startswith("--"))
        query = "\n".join(lines).strip().rstrip(";").strip()
        if not query:
            raise ValueError(f"{origin}: query {name!r} is empty")
        blocks[name] = query
    return blocks


def load(directory: Traversable = SQL_DIR) -> dict[str, str]:
    """Load every named block of every ``*.sql`` file in ``directory``; names are unique across files."""
    queries: dict[str, str] = {}
    for path in sorted((p for p in directory.iterdir() if p.name.endswith(".sql")), key=lambda p: p.name):
        for name, query in parse(path.read_text(encoding="utf-8"), str(path)).items():
            if name in queries:
                raise ValueError(f"{path}: query name {name!r} is already defined in another file")
            queries[name] = query
    return queries


def without_cte(query: LiteralString, name: str) -> LiteralString:
    """``query`` with its CTE ``name`` (``, name AS (…)``, up to the matching parenthesis) cut out, for a
    statement that one planner must be sent without one of its parts (Citus: ledger/jobs/leases.py's routed fetch).
    The CTE must not be referenced by the rest; ``ValueError`` if ``query`` has no such CTE."""
    start = re.search(rf",\s*{re.escape(name)} AS \(", query)
    if start is None:
        raise ValueError(f"no CTE {name!r} in the query")
    depth = 0
    for at in range(start.end() - 1, len(query)):
        depth += {"(": 1, ")": -1}.get(query[at], 0)
        if depth == 0:
            return query[: start.start()] + query[at + 1 :]
    raise ValueError(f"CTE {name!r} is not closed")


class _Queries(Mapping[str, LiteralString]):
    def __init__(self, queries: dict[str, str]) -> None:
        self._queries = queries

    def __getitem__(self, name: str) -> LiteralString:
        # The text comes from files shipped with the package, never from input: it is as literal as a
        # string in the source, which is what psycopg's typing asks for.
        return self._queries[name]

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._queries)

    def __len__(self) -> int:
        return len(self._queries)


Q: Mapping[str, LiteralString] = _Queries(load())

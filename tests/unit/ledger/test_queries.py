"""Named SQL blocks: every name unique, every name used by the ledger, every use names a real block."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from effectgate.ledger.queries import SQL_DIR, Q, parse, without_cte

LEDGER = Path(__file__).resolve().parents[3] / "ledger"
# A query is reached as Q["name"], or by name through a helper such as reports._fetch(conn, "name", …).
USE = re.compile(r"""(?:Q\[\s*|_fetch\(\s*\w+,\s*)["']([a-z0-9_]+)["']""")
LITERAL = re.compile(r"""["']([a-z][a-z0-9_]+)["']""")


def ledger_sources() -> list[str]:
    return [path.read_text() for path in LEDGER.rglob("*.py")]


def test_every_named_query_is_used_and_every_use_exists() -> None:
    # Used: named anywhere in the ledger's code (directly, or in a table of names such as a sort map).
    mentioned = {m.group(1) for text in ledger_sources() for m in LITERAL.finditer(text)}
    assert sorted(set(Q) - mentioned) == [], "named queries nothing uses"
    looked_up = {m.group(1) for text in ledger_sources() for m in USE.finditer(text)}
    assert sorted(looked_up - set(Q)) == [], "uses of names no SQL file defines"


def test_names_are_unique_within_and_across_files() -> None:
    with pytest.raises(ValueError, match="appears twice"):
        parse("-- name: a_get\nSELECT 1;\n-- name: a_get\nSELECT 2;\n", "x.sql")
    seen: dict[str, str] = {}
    for path in sorted((p for p in SQL_DIR.iterdir() if p.name.endswith(".sql")), key=lambda p: p.name):
        for name in parse(path.read_text(), str(path)):
            assert name not in seen, f"{name} in {path.name} and {seen[name]}"
            seen[name] = path.name


def test_every_block_says_what_it_does() -> None:
    for path in sorted((p for p in SQL_DIR.iterdir() if p.name.endswith(".sql")), key=lambda p: p.name):
        text = path.read_text()
        for match in re.finditer(r"^-- name: (\w+)\n(.*)$", text, re.MULTILINE):
            assert match.group(2).startswith("-- "), f"{path.name}: {match.group(1)} has no comment line"


def test_no_sql_strings_in_the_ledgers_python() -> None:
    pattern = re.compile(r"""["'](\s*)(SELECT|INSERT|UPDATE|DELETE|WITH)\s""")
    offenders = [
        str(path.relative_to(LEDGER))
        for path in LEDGER.rglob("*.py")
        if path.name != "queries.py" and pattern.search(path.read_text())
    ]
    assert offenders == []


def test_a_cte_is_cut_out_whole_and_only_it() -> None:
    query = (
        "WITH a AS (SELECT (1)), b AS (INSERT INTO t SELECT f((2)) FROM a), c AS (SELECT 3) SELECT * FROM c"
    )
    assert without_cte(query, "b") == "WITH a AS (SELECT (1)), c AS (SELECT 3) SELECT * FROM c"
    with pytest.raises(ValueError, match="no CTE 'd'"):
        without_cte(query, "d")
    # The routed fetch (ledger/jobs/leases.py): the attempts insert goes, every other part stays.
    fetch = Q["job_fetch_and_lease"]
    routed = without_cte(fetch, "attempt")
    assert "job_attempts" in fetch and "job_attempts" not in routed
    assert routed.count("UPDATE jobs") == fetch.count("UPDATE jobs") == 2 and routed.endswith("ORDER BY l.id")

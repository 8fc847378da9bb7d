"""Against a migrated ledger: every function ledger/sql calls that is not Postgres's own is one of the project's
versioned functions (tests/unit/test_sql_function_versions.py reads the files; this asks the database, so a
function that came from anywhere else — an extension, a hand-made helper — is caught too)."""

from __future__ import annotations

import pytest

from effectgate.ledger import db
from effectgate.ledger.queries import load
from tests.unit.test_sql_function_versions import VERSIONED, called_names, defined_functions

pytestmark = pytest.mark.anyio


async def test_every_non_builtin_function_ledger_sql_calls_is_a_versioned_project_function(
    conn: db.Conn,
) -> None:
    called: dict[str, set[str]] = {}
    for block, sql in load().items():
        for name in called_names(sql):
            called.setdefault(name, set()).add(block)
    rows = await (
        await conn.execute(
            "SELECT DISTINCT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
            " WHERE n.nspname NOT IN ('pg_catalog', 'information_schema') AND p.proname = ANY(%s)",
            (sorted(called),),
        )
    ).fetchall()
    ours = {r["proname"] for r in rows}
    _, live = defined_functions()
    assert ours == {
        "job_release_verdict_v1",
        "job_release_count_v1",
        "history_partition_create_v1",
        "history_partition_drop_v1",
    }
    assert {
        name: sorted(called[name]) for name in ours if not VERSIONED.search(name) or name not in live
    } == {}

"""Against a migrated ledger: every function ledger/sql calls that is not Postgres's own is one of the project's
versioned functions (tests/unit/ledger/test_sql_function_versions.py reads the files; this asks the database, so a
function that came from anywhere else — an extension, a hand-made helper — is caught too)."""

from __future__ import annotations

import re

import pytest

from effectgate.ledger import db
from effectgate.ledger.queries import Q, load
from tests.unit.ledger.sql_functions import VERSIONED, called_names, defined_functions

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
        "history_partition_create_v2",
        "history_partition_drop_v2",
        "effect_claim_tenant_v1",
        "job_attempt_outcome_v1",
    }
    assert {
        name: sorted(called[name]) for name in ours if not VERSIONED.search(name) or name not in live
    } == {}


def statements(body: str) -> list[str]:
    return [line.strip() for line in body.splitlines() if line.strip() and not line.strip().startswith("--")]


async def test_each_v1_is_its_unversioned_original_unchanged(conn: db.Conn) -> None:
    # 0017 renames by copying: same arguments, result, body, volatility and parallel safety, so the release rule
    # still inlines and the previous release's processes and this one's decide alike during the roll.
    rows = await (
        await conn.execute(
            "SELECT proname, proargtypes::text AS args, prorettype::regtype::text AS returns, prosrc,"
            " provolatile, proparallel, proconfig::text AS config, prolang::text AS lang FROM pg_proc"
            " WHERE proname = ANY(%s) ORDER BY proname",
            (
                [
                    f"{base}{suffix}"
                    for base in (
                        "job_release_verdict",
                        "job_release_count",
                        "history_partition_create",
                        "history_partition_drop",
                    )
                    for suffix in ("", "_v1")
                ],
            ),
        )
    ).fetchall()
    by_name = {r.pop("proname"): r for r in rows}
    assert len(by_name) == 8
    for name in (
        "job_release_verdict",
        "job_release_count",
        "history_partition_create",
        "history_partition_drop",
    ):
        old, new = by_name[name], by_name[f"{name}_v1"]
        # The partition verbs' comments were left out of the copies; the statements are the same.
        assert statements(new.pop("prosrc")) == statements(old.pop("prosrc")), name
        assert new == old, name
    assert by_name["job_release_verdict_v1"]["provolatile"] == "i"


async def test_the_release_rule_is_still_inlined_into_both_statements_that_call_it(conn: db.Conn) -> None:
    # Inlined, the call costs what the CASE it stands for costs: the plan shows the CASE, never the function.
    params = {
        "job_rescue_expired_batch": {
            "now": None,
            "limit": 10,
            "poison_threshold": 3,
            "kinds": ["k"],
            "poison_thresholds": [2],
            "tenant": None,
        },
        "job_hand_back_if_leased": {
            "job_id": 1,
            "lease_token": 1,
            "poison_threshold": 3,
            "by": "w",
            "now": None,
            "tenant": None,
        },
    }
    for name, values in params.items():
        rows = await (await conn.execute(b"EXPLAIN (VERBOSE) " + Q[name].encode(), values)).fetchall()
        plan = "\n".join(r["QUERY PLAN"] for r in rows)
        assert "job_release_verdict" not in plan and "job_release_count" not in plan, plan
        assert re.search(r"CASE WHEN \w+\.cancel_requested THEN 'cancelled'", plan), plan


async def test_the_attempt_outcome_rule_is_inlined_into_the_three_statements_that_close_an_attempt(
    conn: db.Conn,
) -> None:
    # Migration 0028 as 0006: the call costs what the CASE it replaced cost, and on Citus the plan sent to a
    # node is the CASE over the enum (no STABLE cast of the column), as it was before the function.
    fence = {"lease_token": 1, "now": None, "tenant": None}
    params = {
        "job_finish_if_leased": {
            "job_ids": [1],
            "tenants": ["t"],
            "lease_tokens": [1],
            "states": ["succeeded"],
            "bys": ["w"],
            "reasons": [None],
            "errors": [None],
            "unrecoverables": [False],
            "now": None,
            "tenant": None,
        },
        "job_retry_if_leased": {**fence, "job_id": 1, "delay": 1.0, "error": None},
        "job_hand_back_if_leased": {**fence, "job_id": 1, "poison_threshold": 3, "by": "w"},
    }
    for name, values in params.items():
        rows = await (await conn.execute(b"EXPLAIN (VERBOSE) " + Q[name].encode(), values)).fetchall()
        plan = "\n".join(r["QUERY PLAN"] for r in rows)
        assert "job_attempt_outcome" not in plan, plan
        assert re.search(r"CASE WHEN \(\w+\.state = 'succeeded'::job_state\) THEN 'succeeded'", plan), plan


async def test_the_attempt_outcome_of_each_state(conn: db.Conn) -> None:
    # The table the three statements spelled out before 0028; the requeued outcome is the caller's word.
    got = {
        state: await (
            await conn.execute("SELECT job_attempt_outcome_v1(%s::job_state, 'retry') AS o", (state,))
        ).fetchone()
        for state in ("pending", "running", "succeeded", "failed", "cancelled", "parked")
    }
    assert {state: row["o"] if row else None for state, row in got.items()} == {
        "pending": "retry",
        "running": None,
        "succeeded": "succeeded",
        "failed": "failed",
        "cancelled": "cancelled",
        "parked": "parked",
    }

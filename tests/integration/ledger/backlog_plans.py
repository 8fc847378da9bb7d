"""A backlog to plan against and the plans of what code sends on it. ``JOBS`` fills ``jobs`` from the effects a fill
left: mostly pending and due over the kinds ``KINDS``, a few running under leases (some holding lock keys that pending
jobs wait on), the rest finished. ``plans_of`` runs a call on a connection that EXPLAINs (FORMAT JSON) each statement
before running it, in a transaction rolled back afterwards, and gives each plan under its query's name; ``nodes``
walks a plan. The plan tests with statistics and without, and the fetch-cost bench, read the same backlog."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from psycopg import sql

from effectgate.ledger import db
from effectgate.ledger.queries import Q

KINDS = {f"kind-{i}": 30.0 for i in range(5)}

# The jobs of this ledger: mostly pending and due (a backlog after an outage), a few running under leases
# (some holding lock keys that pending jobs wait on), the rest finished a while ago.
JOBS = """
INSERT INTO jobs (effect_id, tenant, kind, state, attempt, max_attempts, orphan_policy, run_at, lease_token,
                  lease_owner, lease_expires_at, terminal_reason, terminal_by, created_at, updated_at,
                  finished_at, lock_key)
SELECT id, tenant, handler, st, (st <> 'pending')::int, 5, 'redrive', first_seen_at, (st <> 'pending')::int,
       CASE WHEN st = 'running' THEN 'plan-worker' END,
       CASE WHEN st = 'running' THEN now() + interval '1 minute' END,
       CASE WHEN st NOT IN ('pending', 'running') THEN st::text END,
       CASE WHEN st NOT IN ('pending', 'running') THEN 'plans' END,
       first_seen_at, first_seen_at,
       CASE WHEN st NOT IN ('pending', 'running') THEN first_seen_at + interval '1 second' END,
       -- One job in four names the lock key of its hundred's running job (id % 100 = 84).
       CASE WHEN st = 'running' OR id % 4 = 0 THEN 'order-' || (id / 100) END
FROM (
    SELECT e.*, (CASE WHEN id % 100 < 84 THEN 'pending' WHEN id % 100 = 84 THEN 'running'
                      WHEN id % 100 < 88 THEN 'failed' WHEN id % 100 = 88 THEN 'parked'
                      WHEN id % 100 = 89 THEN 'cancelled' ELSE 'succeeded' END)::job_state AS st
    FROM effects e
) s
"""


class ExplainingConn:
    """A connection that EXPLAINs each statement before it runs it, keeping each plan under the name of
    its query; anything else is the real connection's."""

    def __init__(self, conn: db.Conn, *, analyze: bool = False) -> None:
        self.conn = conn
        self.analyze = analyze
        self.plans: list[tuple[str, dict[str, Any]]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)

    async def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        text = query if isinstance(query, str) else query.as_string(self.conn)
        name = _NAMES.get(text.strip(), text.split()[0] if text.split() else "?")
        if not text.lstrip().upper().startswith(("LISTEN", "SET", "SELECT PG_TRY_ADVISORY")):
            prefix = "EXPLAIN (ANALYZE, FORMAT JSON) " if self.analyze else "EXPLAIN (FORMAT JSON) "
            explain = sql.SQL(prefix) + (sql.SQL(query) if isinstance(query, str) else query)  # type: ignore[arg-type]
            row = await (await self.conn.execute(explain, params, prepare=False)).fetchone()
            assert row is not None
            plan = row["QUERY PLAN"]
            plan = plan if isinstance(plan, list) else json.loads(plan)
            self.plans.append((name, plan[0]["Plan"]))
        return await self.conn.execute(query, params, **kwargs)


_NAMES = {text.strip(): name for name, text in Q.items()}


def nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


class _Rollback(Exception):
    pass


async def plans_of(
    conn: db.Conn, call: Callable[[Any], Awaitable[Any]], *, analyze: bool = False
) -> list[tuple[str, dict[str, Any]]]:
    """The plan of every statement ``call`` sends, its writes rolled back."""
    explaining = ExplainingConn(conn, analyze=analyze)
    try:
        async with conn.transaction():
            await call(explaining)
            raise _Rollback
    except _Rollback:
        pass
    assert explaining.plans, "the call sent no statement"
    return explaining.plans

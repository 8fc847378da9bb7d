"""A hot tenant beside its neighbours on the cluster: the tenant (``HOT``), its jobs' kind and lease, a neighbour in its
shard and a tenant in another (``tenants``), its backlog written in two statements (``hot_backlog``), a neighbour's
job claimed as the gateway claims it (``claim``), and every node of a plan, into Citus's remote plans (``nodes``).
The test of the plans and the bench that times them build the same scene."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

from effectgate.ledger import db
from effectgate.ledger.claims import Accepted, EffectRequest, claim_delivery

from .ledger import delivery

KIND = "hot-work"
HOT = "hot-tenant"
TTL = 30.0


async def shard_of(conn: db.Conn, tenant: str) -> int:
    row = await (
        await conn.execute("SELECT get_shard_id_for_distribution_column('jobs', %s::text) AS s", (tenant,))
    ).fetchone()
    assert row is not None
    return int(row["s"])


async def tenants(conn: db.Conn) -> tuple[str, str]:
    """A neighbour in the hot tenant's shard, and a tenant in another shard."""
    hot = await shard_of(conn, HOT)
    near = far = None
    for n in range(5000):
        tenant = f"cool-{n}"
        shard = await shard_of(conn, tenant)
        if shard == hot and near is None:
            near = tenant
        elif shard != hot and far is None:
            far = tenant
        if near and far:
            return near, far
    raise AssertionError("no tenant shares the hot tenant's shard")


async def hot_backlog(conn: db.Conn, tenant: str, n: int, due: datetime) -> None:
    """``n`` pending jobs of ``tenant``, all due at ``due`` (earlier than anyone's claims)."""
    await conn.execute(
        "INSERT INTO effects (tenant, effect_key, source, handler, event_id, event_type, fingerprint,"
        " first_seen_at, last_seen_at)"
        " SELECT %(t)s, 'hot-' || g, 'stripe', 'h', 'e' || g, 't', 'f', now(), now()"
        " FROM generate_series(1, %(n)s) g",
        {"t": tenant, "n": n},
    )
    await conn.execute(
        "INSERT INTO jobs (effect_id, tenant, kind, max_attempts, orphan_policy, run_at, created_at, updated_at)"
        " SELECT id, tenant, %(k)s, 5, 'redrive', %(due)s, now(), now() FROM effects WHERE tenant = %(t)s",
        {"t": tenant, "k": KIND, "due": due},
    )
    await conn.execute("ANALYZE jobs")


async def claim(conn: db.Conn, tenant: str, key: str) -> int:
    [outcome] = await claim_delivery(conn, delivery(tenant, key), [EffectRequest(key, KIND, 5, "redrive")])
    assert isinstance(outcome, Accepted), outcome
    return outcome.job_id


def nodes(plan: Any) -> Iterator[dict[str, Any]]:
    """Every plan node of an EXPLAIN (FORMAT JSON), into Citus's remote plans."""
    if isinstance(plan, dict):
        if "Node Type" in plan:
            yield plan
        for value in plan.values():
            yield from nodes(value)
    elif isinstance(plan, list):
        for value in plan:
            yield from nodes(value)

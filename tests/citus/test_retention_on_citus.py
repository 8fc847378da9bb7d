"""Retention on the cluster: what outlived its window goes, tenant by tenant, each batch routed to the tenant's
shard group; nothing that is still inside a window goes with it (deploy/README.md, "Past one Postgres").

Before the keeper went per tenant, every statement was a multi-shard ``FOR UPDATE`` and Citus refused it: the
reconciler logged ``reconciler.failed`` each tick and nothing was ever purged on a cluster.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any

import pytest

from effectgate.ledger import db, jobs
from effectgate.ledger.claims import Accepted, Duplicate, EffectRequest, Rejected, claim_deliveries
from effectgate.ledger.jobs.finishes import Finish, finish_many
from effectgate.ledger.maintenance.retention import (
    TENANT_STATEMENTS_PER_BATCH,
    RetentionConfig,
    RetentionKeeper,
)
from effectgate.ledger.maintenance.scheduler import Reconciler, ReconcilerConfig
from effectgate.ledger.vocabulary import JobState
from tests.topologies import CITUS

from .ledger import delivery, explain, nodes_holding, rows

pytestmark = pytest.mark.anyio

KIND = "keep"
DAY = timedelta(days=1)


def tenants(prefix: str, n: int = 12) -> list[str]:
    return [f"{prefix}-{i}" for i in range(n)]


async def claim(conn: db.Conn, tenant: str, key: str, amount: int = 100, *, matched: bool = True) -> Any:
    effects = [EffectRequest(key, KIND, 5, "redrive")] if matched else []
    [answer] = await claim_deliveries(conn, [(delivery(tenant, key, amount), effects)], topology=CITUS)
    return answer[0] if answer else None


async def finish_all(conn: db.Conn, names: list[str]) -> None:
    """Lease and finish every pending job of ``names``' tenants, as a worker would."""
    while leases := await jobs.fetch_and_lease(
        conn, owner="keeper-test", kinds={KIND: 30.0}, limit=50, topology=CITUS
    ):
        done = [
            Finish(lease.job_id, lease.lease_token, JobState.SUCCEEDED, "ok", tenant=lease.tenant)
            for lease in leases
        ]
        assert all(r is not None for r in await finish_many(conn, done, topology=CITUS))
    left = await rows(
        conn, "SELECT count(*) AS n FROM jobs WHERE tenant = ANY(%s) AND finished_at IS NULL", names
    )
    assert left[0]["n"] == 0


async def held(conn: db.Conn, names: list[str]) -> dict[str, int]:
    """What the ledger still holds for ``names``, per table (and payloads still kept)."""
    counts = {}
    for label, query in {
        "effects": "SELECT count(*) AS n FROM effects WHERE tenant = ANY(%s)",
        "payloads": "SELECT count(*) AS n FROM effects WHERE tenant = ANY(%s) AND payload IS NOT NULL",
        "jobs": "SELECT count(*) AS n FROM jobs WHERE tenant = ANY(%s)",
        "attempts": "SELECT count(*) AS n FROM job_attempts WHERE tenant = ANY(%s)",
        "rejects": "SELECT count(*) AS n FROM effect_rejects WHERE tenant = ANY(%s)",
        "reject_payloads": "SELECT count(*) AS n FROM effect_rejects WHERE tenant = ANY(%s)"
        " AND rejected_payload IS NOT NULL",
        "deliveries": "SELECT count(*) AS n FROM deliveries WHERE tenant = ANY(%s)",
        "unmatched": "SELECT count(*) AS n FROM unmatched_deliveries WHERE tenant = ANY(%s)",
    }.items():
        [row] = await rows(conn, query, names)
        counts[label] = row["n"]
    return counts


async def clock(conn: db.Conn) -> datetime:
    [row] = await rows(conn, "SELECT now() AS now")
    return row["now"]  # type: ignore[no-any-return]


async def drain(keeper: RetentionKeeper, conn: db.Conn, now: datetime | None) -> None:
    for _ in range(100):
        if not any((await keeper.run_once(conn, now=now)).purged.values()):
            return
    raise AssertionError("retention never finished: every pass purged something")


async def finished_long_ago(conn: db.Conn, names: list[str]) -> None:
    """Moves ``names``' finished jobs 40 days back (past the payload window, inside history), so a pass on the
    server's own clock finds them due and nothing the other tests left (finished minutes ago)."""
    long_ago = await clock(conn) - 40 * DAY
    await conn.execute("UPDATE jobs SET finished_at = %s WHERE tenant = ANY(%s)", (long_ago, names))


async def fill(conn: db.Conn, names: list[str]) -> None:
    """Per tenant: two effects run to success, a key conflict on one of them, one unmatched delivery."""
    for tenant in names:
        for key in ("a", "b"):
            assert isinstance(await claim(conn, tenant, f"{tenant}-{key}"), Accepted)
        assert isinstance(await claim(conn, tenant, f"{tenant}-a", amount=999), Rejected)
        assert await claim(conn, tenant, f"{tenant}-u", matched=False) is None
    await finish_all(conn, names)


async def test_the_keeper_purges_every_tenants_expired_rows_on_every_node(
    conn: db.Conn, citus_schema: str
) -> None:
    names = tenants("keep")
    await fill(conn, names)
    assert await nodes_holding(conn, citus_schema, names) >= 2  # the keeper has more than one node to reach
    before = await held(conn, names)
    assert before["effects"] == 24 and before["payloads"] == 24 and before["rejects"] == 12
    now = await clock(conn)

    # Past the payload window (30 days), inside history (90): payloads go, rows stay as tombstones.
    # Passes until one purges nothing: the schema holds the other tests' rows too, older than these.
    keeper = RetentionKeeper(RetentionConfig(batch=5), topology=CITUS)
    await drain(keeper, conn, now + 40 * DAY)
    mid = await held(conn, names)
    assert mid["payloads"] == 0 and mid["reject_payloads"] == 0 and mid["unmatched"] == 0, mid
    assert mid["effects"] == 24 and mid["jobs"] == 24 and mid["rejects"] == 12, mid
    # A late retry still meets its tombstone: answered duplicate, never run again.
    assert isinstance(await claim(conn, names[0], f"{names[0]}-a"), Duplicate)

    # Past history (90 days) and an opted-in dedupe window: everything of these tenants goes.
    keeper = RetentionKeeper(
        RetentionConfig(batch=5, history=90 * 86400.0, tombstones=100 * 86400.0), topology=CITUS
    )
    await drain(keeper, conn, now + 200 * DAY)
    assert set((await held(conn, names)).values()) == {0}, await held(conn, names)


async def test_a_pass_spends_the_same_budget_in_rows_on_many_tenants_as_on_one_node(conn: db.Conn) -> None:
    names = tenants("budget")
    await fill(conn, names)
    await finished_long_ago(conn, names)
    keeper = RetentionKeeper(RetentionConfig(batch=5, batches_per_pass=2), topology=CITUS)
    # 24 payloads due over 12 tenants (two each). A pass may purge 2 batches of 5: 10 rows, no more, though it
    # takes a statement per tenant (five tenants) to get them.
    first = await keeper.run_once(conn)
    assert first.purged["effects.payload"] == 10, first.purged
    assert (await held(conn, names))["payloads"] == 14
    await drain(keeper, conn, None)
    assert (await held(conn, names))["payloads"] == 0


async def test_rows_spread_thin_over_tenants_cost_a_bounded_number_of_statements(conn: db.Conn) -> None:
    names = tenants("thin", 30)
    for tenant in names:
        assert isinstance(await claim(conn, tenant, f"{tenant}-only"), Accepted)
    await finish_all(conn, names)
    await finished_long_ago(conn, names)
    keeper = RetentionKeeper(RetentionConfig(batch=100, batches_per_pass=1), topology=CITUS)
    # One due payload in each of 30 tenants; a budget of one batch (100 rows) may send TENANT_STATEMENTS_PER_BATCH
    # routed statements, so this pass purges 10 of the 30.
    first = await keeper.run_once(conn)
    assert first.purged["effects.payload"] == TENANT_STATEMENTS_PER_BATCH == 10, first.purged
    await drain(keeper, conn, None)
    assert (await held(conn, names))["payloads"] == 0


async def test_the_reconciler_runs_retention_on_the_cluster_without_a_failure(conn: db.Conn) -> None:
    names = tenants("reco", 4)
    await fill(conn, names)
    # On the database's own clock, as in production (no clock passed in: every now() is the server's).
    await finished_long_ago(conn, names)
    reconciler = Reconciler(ReconcilerConfig(retention=RetentionConfig(batch=10)), topology=CITUS)
    result = await reconciler.run_once(conn)
    assert result.service_errors == {}, result.service_errors
    assert RetentionKeeper.name not in result.skipped
    left = await held(conn, names)
    assert left["payloads"] == 0 and left["effects"] == 8, left


async def test_each_part_of_a_tenants_retention_batch_reaches_one_shard(conn: db.Conn) -> None:
    params = {
        "now": None,
        "limit": 10,
        "tenant": "acme",
        "window": 30 * 86400.0,
        "sources": [],
        "windows": [],
        "before": datetime(2000, 1, 1),
    }
    for name in (
        "effect_payloads_purge_expired",
        "jobs_delete_expired",
        "effect_tombstones_delete_expired",
        "deliveries_delete_expired",
        "unmatched_seen_purge_expired",
        "reject_payloads_purge_expired",
    ):
        text = await explain(conn, name, params)
        # Citus plans the CTEs as subplans; every one of them, and the statement, reaches one shard.
        counts = re.findall(r"Task Count: (\d+)", text)
        assert counts and set(counts) == {"1"}, f"{name}:\n{text}"

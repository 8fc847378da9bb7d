"""The operator's reports on the cluster: cross-tenant reads over every shard, bounded and paged by keyset, that
answer as on one node: every duplicate and every key conflict once, over tenants on both worker nodes
(deploy/README.md, "Past one Postgres")."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest

from effectgate.ledger import db
from effectgate.ledger.claims import Accepted, Duplicate, Rejected, claim_deliveries
from effectgate.ledger.reports import BY_NAME, views
from effectgate.ledger.reports.spec import ReportQuery, run
from tests.topologies import CITUS

from .ledger import delivery, effect, nodes_holding, rows

pytestmark = pytest.mark.anyio


async def every_page(conn: db.Conn, report: str, sort: str, **filters: Any) -> list[dict[str, Any]]:
    """Every row of ``report`` in ``sort`` over the last hour, three at a time, following the keyset cursor."""
    [clock] = await rows(conn, "SELECT now() AS now")
    since, until = clock["now"] - timedelta(hours=1), clock["now"] + timedelta(minutes=1)
    spec, found, after = BY_NAME[report], [], None
    while True:
        query = ReportQuery(since=since, until=until, sort=sort, limit=3, after=after, filters=filters)
        page = await run(conn, spec, query)
        found += page.items
        if page.next_after is None:
            return found
        after = page.next_after


async def test_duplicates_and_key_conflicts_are_reported_once_each_across_nodes(
    conn: db.Conn, citus_schema: str
) -> None:
    run_id = uuid.uuid4().hex[:6]
    names = [f"rep-{run_id}-{n}" for n in range(10)]
    for tenant in names:
        for key in ("a", "b"):
            k = f"{tenant}-{key}"
            [[first]] = await claim_deliveries(conn, [(delivery(tenant, k), [effect(k)])], topology=CITUS)
            [[again]] = await claim_deliveries(conn, [(delivery(tenant, k), [effect(k)])], topology=CITUS)
            assert isinstance(first, Accepted) and isinstance(again, Duplicate)
        k = f"{tenant}-a"
        [[other]] = await claim_deliveries(
            conn, [(delivery(tenant, k, amount=7), [effect(k)])], topology=CITUS
        )
        assert isinstance(other, Rejected)
    assert await nodes_holding(conn, citus_schema, names) >= 2

    for sort in ("-last_seen", "first_seen", "-deliveries"):
        dup = [r for r in await every_page(conn, "duplicates", sort) if r["tenant"] in names]
        assert sorted((r["tenant"], r["effect_key"]) for r in dup) == sorted(
            (t, f"{t}-{k}") for t in names for k in ("a", "b")
        ), sort
        assert {r["delivery_count"] for r in dup} == {2}
    conflicts = [r for r in await every_page(conn, "key_conflicts", "received") if r["tenant"] in names]
    assert sorted(r["tenant"] for r in conflicts) == sorted(names)
    assert all(r["diff"] for r in conflicts)  # the field-level diff, read from the held effect's shard
    # A tenant filter makes it one tenant's report.
    [only] = await every_page(conn, "key_conflicts", "received", tenant=names[0])
    assert only["tenant"] == names[0]
    # The effect view, by tenant and key: the delivery, the reject and the job, from one shard group.
    view = await views.effect_view(conn, f"{names[0]}-a", tenant=names[0])
    # Three deliveries name the effect (the first, its duplicate and the rejected one), one of them a reject.
    assert view is not None and len(view.deliveries) == 3 and len(view.rejects) == 1 and view.job is not None

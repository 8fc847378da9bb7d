"""The partition keeper on the cluster: its DDL (``CREATE TABLE … PARTITION OF`` and ``DROP TABLE`` inside the
``SECURITY DEFINER`` functions of migration 0021, run on the coordinator) makes and drops time partitions of the
distributed tables as distributed, colocated partitions, and a delivery lands in its day's partition on its
tenant's node (deploy/README.md, "Past one Postgres")."""

from __future__ import annotations

from datetime import timedelta

import pytest

from effectgate.ledger import db
from effectgate.ledger.claims import Accepted, claim_deliveries
from effectgate.ledger.maintenance.partitions import PartitionConfig, PartitionKeeper
from effectgate.ledger.maintenance.retention import RetentionConfig
from tests.topologies import CITUS

from .ledger import delivery, effect, rows

pytestmark = pytest.mark.anyio


async def citus_tables(conn: db.Conn, schema: str, like: str) -> dict[str, tuple[str, int]]:
    """The Citus tables of ``schema`` named ``like`` (a LIKE pattern): name -> (type, colocation group)."""
    found = await rows(
        conn,
        "SELECT c.relname AS name, t.citus_table_type AS kind, t.colocation_id FROM public.citus_tables t"
        " JOIN pg_class c ON c.oid = t.table_name JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.relname LIKE %s",
        schema,
        like,
    )
    return {r["name"]: (r["kind"], r["colocation_id"]) for r in found}


async def test_time_partitions_are_made_distributed_and_dropped_on_the_cluster(
    conn: db.Conn, citus_schema: str
) -> None:
    [[now]] = [list((await rows(conn, "SELECT now() AS now"))[0].values())]
    keeper = PartitionKeeper(PartitionConfig(), RetentionConfig(history=2 * 86400.0, payloads=86400.0))
    made = await keeper.run_once(conn, now=now)
    days = [name for name in made.created if name.startswith(("deliveries_p", "effect_rejects_p"))]
    assert len(days) >= 6, made
    effects_group = (await citus_tables(conn, citus_schema, "effects"))["effects"][1]
    tables = await citus_tables(conn, citus_schema, "%_p2%")
    for name in days:
        assert tables[name] == ("distributed", effects_group), (name, tables.get(name))
    # signature_failures stays on the coordinator, and so do its partitions.
    assert not [name for name in tables if name.startswith("signature_failures")]

    # A delivery received tomorrow lands in tomorrow's partition, in its shard on the tenant's node (tableoid,
    # read on that node, names the shard: the partition's name and the shard's id).
    tomorrow = now + timedelta(days=1)
    [[outcome]] = await claim_deliveries(
        conn, [(delivery("part-t", "part-1"), [effect("part-1")])], now=tomorrow, topology=CITUS
    )
    assert isinstance(outcome, Accepted)
    [row] = await rows(
        conn, "SELECT tableoid::regclass::text AS part FROM deliveries WHERE tenant = %s", "part-t"
    )
    day = f"deliveries_p{tomorrow:%Y%m%d}_000000"
    assert row["part"].split(".")[-1].startswith(f"{day}_"), (row, day)

    # Past the history window the keeper drops them whole: the rows go with them, on every node.
    later = await keeper.run_once(conn, now=now + timedelta(days=30))
    gone = [name for name in later.dropped if name in days]
    assert sorted(gone) == sorted(days), later
    left = await citus_tables(conn, citus_schema, "%_p2%")
    assert not set(days) & set(left)
    assert await rows(conn, "SELECT 1 FROM deliveries WHERE tenant = %s", "part-t") == []

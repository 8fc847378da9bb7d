"""A fresh ledger on the cluster, the way the guide sets one up: `effectgate migrate` on the coordinator, which
distributes it by tenant (deploy/README.md, "Past one Postgres"); moving shards and nodes under it; and what the
tests write and read there: a delivery and an effect of a key, the claim statement's parameters, rows, a statement's
plan and the nodes holding tenants' effects. Shared by the tests and the run scripts."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest

from effectgate.ledger import db
from effectgate.ledger.claims import Delivery, EffectRequest
from effectgate.ledger.fingerprints import fingerprint
from effectgate.ledger.migrate import migrate
from effectgate.ledger.queries import Q


async def distributed_ledger(url: str, schema: str) -> None:
    """Migrate ``schema`` on the coordinator at ``url``: the runner distributes it by tenant, finding Citus."""
    conn = await db.connect(url, schema=schema)
    async with conn:
        await migrate(conn, schema=schema)


@contextmanager
def own_ledger(url: str, prefix: str) -> Iterator[str]:
    """A fresh schema named after ``prefix``, migrated (so distributed) on the cluster at ``url``; dropped after."""
    schema = f"effectgate_{prefix}_{uuid.uuid4().hex[:8]}"
    asyncio.run(distributed_ledger(url, schema))
    try:
        yield schema
    finally:
        with psycopg.connect(url, autocommit=True) as c:
            c.execute(f'DROP SCHEMA "{schema}" CASCADE')  # type: ignore[arg-type]


def own_ledger_fixtures(
    prefix: str,
) -> tuple[Callable[..., Iterator[str]], Callable[..., AsyncIterator[db.Conn]]]:
    """A test module's own ledger: the fixtures ``own_schema`` (module-scoped, ``own_ledger(prefix)``) and ``conn`` (a
    connection to it), for a module whose tests change the cluster or read a ledger no other module writes to::

        own_schema, conn = own_ledger_fixtures("hot")
    """

    @pytest.fixture(scope="module")
    def own_schema(citus_url: str) -> Iterator[str]:
        with own_ledger(citus_url, prefix) as schema:
            yield schema

    @pytest.fixture
    async def conn(citus_url: str, own_schema: str) -> AsyncIterator[db.Conn]:
        c = await db.connect(citus_url, schema=own_schema)
        async with c:
            yield c

    return own_schema, conn


# How a shard moves (``shard_transfer_mode``): ``block_writes`` copies it with writes to it blocked for the whole
# copy; ``force_logical`` copies it by logical replication, writes flowing until a short switch-over; ``auto`` is
# logical when every table has a replica identity and refuses the move otherwise. Logical needs
# ``wal_level = logical`` on every node (``logical_wal``).
TRANSFER_MODES = ("auto", "force_logical", "block_writes")


def rebalance_onto(
    url: str, schema: str, node: str, *, mode: str = "block_writes"
) -> tuple[float, dict[int, int]]:
    """Adds ``node`` to the cluster and rebalances, moving shards by ``mode``, while the run goes on; the seconds
    it took and effects' shards per node."""
    host, port = node.rsplit(":", 1)
    started = time.monotonic()
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("SELECT citus_add_node(%s, %s)", (host, int(port)))
        c.execute(
            "SELECT citus_rebalance_start(shard_transfer_mode => %s::citus.shard_transfer_mode)", (mode,)
        )
        c.execute("SELECT citus_rebalance_wait()")
        took = time.monotonic() - started
        placement = c.execute(
            "SELECT nodeport, count(*) FROM citus_shards WHERE table_name = %s::regclass GROUP BY 1 ORDER BY 1",
            (f'"{schema}".effects',),
        ).fetchall()
    return took, {int(p): int(n) for p, n in placement}


def remove_node(url: str, node: str, *, mode: str = "block_writes") -> None:
    """Moves every shard off ``node`` (by ``mode``) and removes it: the cluster as it was before ``rebalance_onto``.
    The moved shards' old copies are deleted first (Citus defers that): removed with them still on it, the node
    could not be added again (a later move onto it fails on "the orphaned shard … could not be cleaned up")."""
    host, port = node.rsplit(":", 1)
    with psycopg.connect(url, autocommit=True) as c:
        c.execute(
            "SELECT citus_drain_node(%s, %s, shard_transfer_mode => %s::citus.shard_transfer_mode)",
            (host, int(port), mode),
        )
        c.execute("CALL citus_cleanup_orphaned_resources()")
        c.execute("SELECT citus_remove_node(%s, %s)", (host, int(port)))


def logical_wal(url: str, *also: str) -> list[str]:
    """The nodes (the cluster's, and ``also`` as ``host:port``) whose ``wal_level`` is not ``logical``: a logical
    move needs it on both ends, and setting it takes a restart (ALTER SYSTEM SET wal_level = logical)."""
    with psycopg.connect(url, autocommit=True) as c:
        nodes = [
            f"{h}:{p}" for h, p in c.execute("SELECT nodename, nodeport FROM pg_dist_node ORDER BY nodeport")
        ]
    behind = []
    for node in dict.fromkeys([*nodes, *also]):
        host, port = node.rsplit(":", 1)
        with psycopg.connect(host=host, port=int(port), user="postgres", dbname="postgres") as n:
            [(level,)] = n.execute("SHOW wal_level").fetchall()
        if level != "logical":
            behind.append(node)
    return behind


def preferred_transfer_mode(url: str, *also: str) -> str:
    """``auto`` (a logical move: every table of the ledger has a primary key, so a replica identity) when every
    node runs ``wal_level = logical``, else ``block_writes``, the only mode those nodes allow."""
    return "block_writes" if logical_wal(url, *also) else "auto"


def delivery(tenant: str, key: str, amount: int = 100, request: str = "r") -> Delivery:
    payload = {"type": "charge.succeeded", "key": key, "amount": amount}
    return Delivery(
        f"{request}-{key}",
        tenant,
        "stripe",
        f"evt-{key}",
        "charge.succeeded",
        payload,
        fingerprint(payload),
        0,
    )


def effect(key: str) -> EffectRequest:
    return EffectRequest(key, "charge", 5, "redrive")


async def rows(conn: db.Conn, query: str, *params: Any) -> list[dict[str, Any]]:
    return await (await conn.execute(query, params or None)).fetchall()  # type: ignore[arg-type]


async def nodes_holding(conn: db.Conn, schema: str, tenants: list[str]) -> int:
    """How many worker nodes hold the effects shards of ``tenants``."""
    [row] = await rows(
        conn,
        "SELECT count(DISTINCT s.nodeport) AS nodes FROM effects e"
        " JOIN citus_shards s ON s.shardid = get_shard_id_for_distribution_column(%s::regclass, e.tenant)"
        " WHERE e.tenant = ANY(%s)",
        f'"{schema}".effects',
        tenants,
    )
    return int(row["nodes"])


def claim_params(tenant: str, key: str) -> dict[str, Any]:
    """``effect_claim_batch``'s parameters for one new key, as ledger/claims.py sends them."""
    return {
        "ord": [0],
        "request_id": ["r"],
        "tenant": [tenant],
        "effect_key": [key],
        "source": ["stripe"],
        "handler": ["charge"],
        "event_id": ["e"],
        "event_type": ["charge.succeeded"],
        "fingerprint": ["f"],
        "payload_ix": [1],
        "max_attempts": [5],
        "orphan_policy": ["redrive"],
        "lock_key": [None],
        "secret_index": [0],
        "version": [None],
        "trace_parent": [None],
        "payloads": ['{"a": 1}'],
        "now": None,
    }


async def explain(conn: db.Conn, name: str, params: dict[str, Any]) -> str:
    async with conn.transaction(force_rollback=True):
        cur = await conn.execute("EXPLAIN " + Q[name], params)  # type: ignore[operator]
        plan = await cur.fetchall()
    return "\n".join(next(iter(r.values())) for r in plan)

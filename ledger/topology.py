"""Is the ledger distributed by tenant, and how statements route: asked once, kept once.

On Citus (distributed by ``effectgate migrate``, ledger/distribution.py), ``jobs`` is a distributed table and every job statement that names no
tenant either fans out to every shard or is refused (a multi-shard ``FOR UPDATE``). So the worker leases,
heartbeats and finishes tenant by tenant, the rescuer and the waker read the tenants first, retention purges per
tenant, and the operator's writes by id find the job's tenant before they write. Claims go per tenant only where
the claim function was distributed with the table too (``claims_routed``); a distributed ledger without it
(the hand-run distribute.sql of a release before 0023) claims through the coordinator, correctly, and says so in
the log until the next ``effectgate migrate`` distributes the function.

A ledger is distributed before its processes start and stays so while they run, so the answer is read once per
connection pool (``of_pool``) or, for code that is handed only a connection, once per connection (``of``):
a pooled connection lives as long as its pool, so a process asks as many times as its pools hold connections,
not once per statement. ``read`` asks the catalog afresh (tests, and tools run once).
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass

from .db import Conn, Pool
from .queries import Q

log = logging.getLogger("effectgate.ledger")


@dataclass(frozen=True, slots=True)
class Topology:
    """What the database under a ledger is, each fact a service acts on named on its own.

    On a real cluster ``distributed`` implies ``citus``. A test may build ``Topology(citus=False,
    distributed=True, claims_routed=True)`` to run the distributed statements' shapes on one Postgres: every
    statement goes tenant by tenant, and the tenants with work are read by the one-node statement instead of
    node by node.
    """

    # The Citus extension is installed: its catalog can be read, and tenants with work are read node by node
    # (ledger/shards.py), so a lost worker node is skipped instead of failing the read whole.
    citus: bool
    # jobs is a distributed table: every job statement names its tenant (leases, heartbeats, finishes, steps,
    # retries, the operator's writes by id, the maintenance passes), and a wake-up is sent from the coordinator.
    distributed: bool
    # effect_claim_tenant_v1 is distributed with it: one tenant's batch of claims is one call routed to its node.
    claims_routed: bool


SINGLE_NODE = Topology(citus=False, distributed=False, claims_routed=False)

_by_pool: weakref.WeakKeyDictionary[Pool, Topology] = weakref.WeakKeyDictionary()
_by_connection: weakref.WeakKeyDictionary[Conn, Topology] = weakref.WeakKeyDictionary()


async def read(conn: Conn) -> Topology:
    """The catalog's answer now: one statement on a single node, three on Citus."""
    row = await (await conn.execute(Q["jobs_distributed_citus"])).fetchone()
    if row is None or not row["citus"]:
        return SINGLE_NODE
    row = await (await conn.execute(Q["jobs_distributed_table"])).fetchone()
    if row is None or not row["distributed"]:
        return Topology(citus=True, distributed=False, claims_routed=False)
    row = await (await conn.execute(Q["claim_tenant_distributed"])).fetchone()
    claims_routed = row is not None and bool(row["distributed"])
    if not claims_routed:
        log.warning(
            "claims.not_routed",
            extra={"hint": "effect_claim_tenant_v1 is not distributed: run `effectgate migrate`"},
        )
    return Topology(citus=True, distributed=True, claims_routed=claims_routed)


async def of(conn: Conn) -> Topology:
    """This connection's ledger, read at its first question and kept for the connection's life."""
    known = _by_connection.get(conn)
    if known is None:
        known = _by_connection[conn] = await read(conn)
    return known


async def of_pool(pool: Pool) -> Topology:
    """The pool's ledger, read at its first question and kept for the pool's life. A failed read raises and
    is asked again by the next caller."""
    known = _by_pool.get(pool)
    if known is None:
        async with pool.connection() as conn:
            known = _by_pool[pool] = await read(conn)
    return known

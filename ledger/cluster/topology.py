"""What the database under a ledger is, and how statements route: the catalog asked in this one module.

On Citus (distributed by ``effectgate migrate``, ledger/cluster/distribution.py), ``jobs`` is a distributed table and every job statement that names no
tenant either fans out to every shard or is refused (a multi-shard ``FOR UPDATE``). So the worker leases,
heartbeats and finishes tenant by tenant, the rescuer and the waker read the tenants first, retention purges per
tenant, and the operator's writes by id find the job's tenant before they write (everywhere: one read by id). Claims go per tenant only where
the claim function was distributed with the table too (``claims_routed``); a distributed ledger without it
(the hand-run distribute.sql of a release before 0023) claims through the coordinator, correctly, and says so in
the log until the next ``effectgate migrate`` distributes the function.

``read`` asks the catalog afresh. A process asks it once and keeps the answer on its ledger handle
(``ledger/handle.py``), which every service that routes is given; a tool run once reads it once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ..db import Conn
from ..queries import Q

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
    # (ledger/cluster/shards.py), so a lost worker node is skipped instead of failing the read whole.
    citus: bool
    # jobs is a distributed table: every job statement names its tenant (leases, heartbeats, finishes, steps,
    # retries, the maintenance passes), and a wake-up is sent from the coordinator.
    distributed: bool
    # effect_claim_tenant_v1 is distributed with it: one tenant's batch of claims is one call routed to its node.
    claims_routed: bool


SINGLE_NODE = Topology(citus=False, distributed=False, claims_routed=False)


async def read(conn: Conn) -> Topology:
    """The catalog's answer now: one statement on a single node, three on Citus."""
    if not await citus_installed(conn):
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


async def citus_installed(conn: Conn) -> bool:
    """Whether the Citus extension is installed in this database."""
    row = await (await conn.execute(Q["jobs_distributed_citus"])).fetchone()
    return row is not None and bool(row["citus"])

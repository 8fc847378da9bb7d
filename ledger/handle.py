"""``Ledger``: one ledger as a process holds it, handed to every service that needs more than a connection.

A process opens its pools once (the gateway's lifespan, the worker's run) and wraps them in one handle: the
pool for its own statements, the claim path's pool (the gateway: its lock and statement timeouts bound claims
and nothing else) and the running jobs' pool (the worker: no handler can hold the connection a heartbeat waits
for), each the first where it has none of its own. The handle also knows what the database is (``Topology``):
asked once, at the first question, and kept for the handle's life, so the answer is carried on one object
rather than cached beside the pools in a module (River keeps its capability answers on the driver every
service holds; Procrastinate's connector is the answer).

Why at the first question and not at construction: a gateway whose database is down still starts and answers
503, rather than crash-looping behind its load balancer, so nothing may wait for the database while a process
opens. A ledger is distributed before its processes start and stays so while they run (``effectgate migrate``
distributes it; a process started before then waits for the migration, gateway/cli/migrate.py), so one answer
holds for the process's life. Tests hand the handle a topology instead, to run the distributed statements'
shapes on one Postgres (tests/topologies.py).
"""

from __future__ import annotations

import asyncio

from .cluster.topology import SINGLE_NODE, Topology, read
from .db import Conn, Pool


class Ledger:
    """A process's pools on one ledger and what that ledger is; see the module docstring.

    ``topology`` given: the handle never asks the database (tests, and tools that already read it).
    """

    def __init__(
        self,
        pool: Pool,
        *,
        claim_pool: Pool | None = None,
        handler_pool: Pool | None = None,
        topology: Topology | None = None,
    ) -> None:
        self.pool = pool
        self.claim_pool = pool if claim_pool is None else claim_pool
        self.handler_pool = pool if handler_pool is None else handler_pool
        self._topology = topology
        # One read at a time: the first batch of a busy gateway must not send one catalog read per request.
        self._reading = asyncio.Lock()

    @property
    def known_topology(self) -> Topology:
        """The topology as far as it is known without asking: read (or given), else ``SINGLE_NODE``. For the
        writes that only follow a fetch (heartbeats, finishes, retries, steps): the fetch asked first, so
        a process holding a lease knows."""
        return SINGLE_NODE if self._topology is None else self._topology

    async def topology(self, conn: Conn | None = None) -> Topology:
        """What the database is: read at the first question and kept for the handle's life, on ``conn`` when
        the caller holds one (a caller holding a pooled connection must not wait for a second one), else on
        a connection of ``pool``. A failed read raises and is asked again by the next caller."""
        if self._topology is not None:
            return self._topology
        async with self._reading:
            if self._topology is None:
                if conn is not None:
                    self._topology = await read(conn)
                else:
                    async with self.pool.connection() as own:
                        self._topology = await read(own)
            return self._topology

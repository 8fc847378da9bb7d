"""The topologies the tests give a ledger's functions, named once.

``ROUTED_ON_ONE_NODE`` runs the distributed statements' shapes on one Postgres (tenant by tenant, claims by the
routed function, tenants with work read by the one-node statement); ``CITUS`` is what ``topology.read`` answers
on a cluster that ``effectgate migrate`` distributed (tests/citus/).
"""

from __future__ import annotations

from effectgate.ledger.cluster.topology import Topology

ROUTED_ON_ONE_NODE = Topology(citus=False, distributed=True, claims_routed=True)
CITUS = Topology(citus=True, distributed=True, claims_routed=True)

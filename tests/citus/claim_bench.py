"""The claim on the cluster: the statement through the coordinator beside the function routed to the tenant's node.

    CITUS_URL=... python -m tests.citus.claim_bench [--seconds 10] [--clients 16] [--tenants 40] [--rounds 2]

A fresh schema is migrated and distributed (which distributes the claim function for one tenant). Then,
alternating ``statement`` and ``per_tenant`` for ``--rounds`` rounds, ``--clients`` connections each claim new keys
(one delivery, one effect, spread over ``--tenants``) through ``ledger.claims.claim_deliveries`` for
``--seconds``: ``statement`` the one statement through the coordinator, as on one node; ``per_tenant`` one routed call per tenant,
as the gateway's batcher does on Citus. The figure is the effects rows each phase left in the database,
per second, and the ratio of the two in the same run; the schema is dropped at the end. Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
import uuid

from effectgate.ledger import db
from effectgate.ledger.claims import Delivery, EffectRequest, claim_deliveries
from effectgate.ledger.cluster import topology
from effectgate.ledger.cluster.topology import SINGLE_NODE
from effectgate.ledger.fingerprints import fingerprint
from tests.topologies import CITUS

from .ledger import distributed_ledger


async def client(
    url: str, schema: str, phase: str, n: int, tenants: int, routed: bool, until: float
) -> list[float]:
    latencies: list[float] = []
    conn = await db.connect(url, schema=schema)
    async with conn:
        i = 0
        while time.monotonic() < until:
            key = f"{phase}-c{n}-{i}"
            payload = {"key": key}
            d = Delivery(
                f"r-{key}",
                f"tenant-{(n + i) % tenants}",
                "stripe",
                f"evt-{key}",
                "charge.succeeded",
                payload,
                fingerprint(payload),
                0,
            )
            started = time.perf_counter()
            await claim_deliveries(
                conn,
                [(d, [EffectRequest(key, "charge", 5, "redrive")])],
                topology=CITUS if routed else SINGLE_NODE,
            )
            latencies.append(time.perf_counter() - started)
            i += 1
    return latencies


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--tenants", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    url = os.environ["CITUS_URL"]
    schema = f"effectgate_bench_{uuid.uuid4().hex[:8]}"
    await distributed_ledger(url, schema)
    conn = await db.connect(url, schema=schema)
    async with conn:
        assert (await topology.read(conn)).claims_routed, "migrate did not distribute the claim function"
        rates: dict[str, list[float]] = {"statement": [], "per_tenant": []}
        try:
            for r in range(args.rounds):
                for mode in ("statement", "per_tenant"):
                    phase = f"{mode}{r}"
                    until = time.monotonic() + args.seconds
                    started = time.monotonic()
                    per_client = await asyncio.gather(
                        *(
                            client(
                                url,
                                schema,
                                phase,
                                n,
                                args.tenants,
                                mode == "per_tenant",
                                until,
                            )
                            for n in range(args.clients)
                        )
                    )
                    took = time.monotonic() - started
                    row = await (
                        await conn.execute(
                            "SELECT count(*) AS n FROM effects WHERE effect_key LIKE %s", (f"{phase}-%",)
                        )
                    ).fetchone()
                    assert row is not None
                    latencies = sorted(x for c in per_client for x in c)
                    rate = row["n"] / took
                    rates[mode].append(rate)
                    print(
                        f"{phase}: {row['n']} effects in {took:.1f}s = {rate:.0f}/s;"
                        f" p50 {statistics.median(latencies) * 1000:.1f} ms,"
                        f" p99 {latencies[int(len(latencies) * 0.99)] * 1000:.1f} ms",
                        flush=True,
                    )
        finally:
            await conn.execute(f'DROP SCHEMA "{schema}" CASCADE')  # type: ignore[arg-type]
    statement, per_tenant = statistics.median(rates["statement"]), statistics.median(rates["per_tenant"])
    print(
        f"median effects/s: statement {statement:.0f}, per tenant {per_tenant:.0f};"
        f" per tenant / statement {per_tenant / statement:.2f}x"
    )


if __name__ == "__main__":
    asyncio.run(main())

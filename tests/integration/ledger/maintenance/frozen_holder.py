"""A process that takes one of effectgate's locks the way the project takes it, says so, and then holds it.

Run by tests/integration/ledger/maintenance/test_frozen_holders.py as ``python -m tests.integration.ledger.maintenance.frozen_holder PLACE URL TIMEOUT
[KEY]``: it opens a pool through ``ledger.db.make_pool`` (so the session is configured as every effectgate
connection is, with ``idle_in_transaction_timeout=TIMEOUT`` seconds, 0 for none), does the project's own work
for PLACE, prints ``ready`` and its backend's pid at the point where the lock or transaction is held, and waits there forever. The test
then freezes it (SIGSTOP) or cuts its connection (a proxy that stops forwarding) and measures how long another
process is kept waiting.

PLACE:
- ``lease_rescuer``, ``pending_waker``: the service's pass inside ``run_locked`` (its transaction-scoped lock),
  held after the pass, before the commit;
- ``partitions``, ``retention``: the keeper's pass inside ``run_session_locked`` (its session-level lock), held
  after the pass's own transactions committed: idle, outside any transaction;
- ``claim``: a claim of KEY inside a transaction, as the claim batch holds its rounds (the key's unique index
  entry is held until commit);
- ``fetch``: a fetch and lease inside a transaction, as a finish batch's refill holds it (the leased rows are
  locked until commit).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable

from effectgate.ledger import db, jobs
from effectgate.ledger.maintenance.scheduler import Reconciler, service_lock_id
from effectgate.ledger.maintenance.service import run_locked, run_session_locked
from tests.integration.jobs_and_workers import claim


async def _hold(conn: db.Conn) -> None:
    # The backend's pid, so the test can see the server end this session.
    print(f"ready {conn.info.backend_pid}", flush=True)
    await asyncio.Event().wait()


async def main(place: str, url: str, idle_bound: float, key: str | None) -> None:
    pool = db.make_pool(url, min_size=1, max_size=1, idle_in_transaction_timeout=idle_bound or None)
    await pool.open(wait=True)
    reconciler = Reconciler()
    services: dict[str, Callable[[db.Conn], Awaitable[object]]] = {
        "lease_rescuer": lambda c: reconciler.rescuer.run_once(c),
        "pending_waker": lambda c: reconciler.waker.run_once(c),
        "partitions": lambda c: reconciler.partitioner.run_once(c),
        "retention": lambda c: reconciler.keeper.run_once(c),
    }
    async with pool.connection() as conn:
        if place in services:
            run = services[place]

            async def work() -> None:
                await run(conn)
                await _hold(conn)

            locked = run_session_locked if place in ("partitions", "retention") else run_locked
            owned, _ = await locked(conn, service_lock_id(place), work)
            raise SystemExit(f"{place}: lock not owned" if not owned else f"{place}: returned")
        async with conn.transaction():
            if place == "claim":
                await claim(conn, key)
            elif place == "fetch":
                await jobs.fetch_and_lease(conn, owner="frozen", kinds={"k": 30.0}, limit=10)
            else:
                raise SystemExit(f"unknown place {place!r}")
            await _hold(conn)


if __name__ == "__main__":
    place, url, idle_bound = sys.argv[1], sys.argv[2], float(sys.argv[3])
    asyncio.run(main(place, url, idle_bound, sys.argv[4] if len(sys.argv) > 4 else None))

"""``TestLedger``: a migrated throwaway ledger on real Postgres, and one job run through the real worker.

``deliver`` claims an event exactly as the ingress would (``handlers.plan.plan_event``, then
``ledger.claims.claim_delivery``); ``run_job`` leases one due job and runs it with ``Worker.run_job``,
the code path a production worker takes (recorded steps replayed, the outcome recorded under the lease,
``on_transition`` hooks in the same transaction), and reads back what the ledger then holds.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from effectgate.handlers.context import Services
from effectgate.handlers.event import Event
from effectgate.handlers.plan import plan_event
from effectgate.handlers.registry import REGISTRY, Registry
from effectgate.handlers.worker.config import WorkerConfig
from effectgate.handlers.worker.runtime import Worker
from effectgate.ledger import db, jobs
from effectgate.ledger.claims import ClaimOutcome, Delivery, claim_delivery
from effectgate.ledger.fingerprints import canonical_json, fingerprint
from effectgate.ledger.handle import Ledger
from effectgate.ledger.jobs import steps
from effectgate.ledger.jobs.steps import RecordedStep

from .events import Handler, handler_name


@dataclass(frozen=True, slots=True)
class JobRun:
    """One job after ``TestLedger.run_job``: its row as ``effectgate jobs show`` reads it (``state``,
    ``attempt``, ``last_error``…), and the steps its effect has recorded, by name."""

    job_id: int
    effect_key: str
    state: str
    job: Mapping[str, Any]
    steps: Mapping[str, RecordedStep]


class TestLedger:
    """A migrated ledger of this test's own at ``url``; see the module docstring."""

    __test__ = False  # not a test class, whatever pytest's collector makes of its name

    def __init__(self, url: str, *, registry: Registry | None = None, services: Services | None = None):
        self.url = url
        self.registry = registry
        self.services = services

    async def deliver(self, event: Event, *, registry: Registry | None = None) -> list[ClaimOutcome]:
        """Claim ``event``'s effects as the ingress would; one ``Accepted | Duplicate | Rejected | Superseded``
        each."""
        planned = plan_event(registry or self.registry or REGISTRY, event)
        canonical = canonical_json(event.payload)
        delivery = Delivery(
            request_id=uuid.uuid4().hex,
            tenant=event.tenant,
            source=event.source,
            event_id=event.id,
            event_type=event.type,
            payload=event.payload,
            fingerprint=fingerprint(event.payload),
            payload_text=canonical.decode(),
        )
        conn = await db.connect(self.url)
        async with conn:
            return await claim_delivery(conn, delivery, planned.effects)

    async def run_job(
        self,
        handler: Handler | None = None,
        *,
        registry: Registry | None = None,
        services: Services | None = None,
    ) -> JobRun:
        """Lease one due job (of ``handler``, a registered handler or its name, or of any registered
        handler) and run it once through
        the worker; ``LookupError`` when none is due. A retried job is pending again afterwards with its
        backoff switched off, so calling ``run_job`` again runs its next attempt."""
        reg = registry or self.registry or REGISTRY
        kind = None if handler is None else handler_name(handler, reg)
        ttls = {k.name: k.lease_ttl for k in reg.kinds() if kind is None or k.name == kind}
        if not ttls:
            raise LookupError(f"no handler named {kind!r} is registered")
        pool = db.make_pool(self.url, min_size=1, max_size=4, name="effectgate-testing")
        await pool.open(wait=True)
        try:
            worker = Worker(
                Ledger(pool),
                reg,
                config=WorkerConfig(backoff_base=0.0, run_reconciler=False),
                services=services or self.services,
                owner=f"effectgate-testing-{uuid.uuid4().hex[:6]}",
            )
            async with db.connection(pool) as conn:
                leases = await jobs.fetch_and_lease(conn, owner=worker.owner, kinds=ttls, limit=1)
            if not leases:
                raise LookupError(f"no due job of {', '.join(sorted(ttls))} to run")
            [lease] = leases
            await worker.run_job(lease)
            async with db.connection(pool) as conn:
                row = await jobs.get(conn, lease.job_id)
                recorded = await steps.for_effect(conn, lease.effect_id)
        finally:
            await pool.close()
        assert row is not None
        return JobRun(lease.job_id, lease.effect_key, str(row["state"]), row, recorded)

"""Maintenance wired to a registry: the reconciler with the registry's sweeps, per-kind settings and
transition hooks, and the loop that ticks it. The gateway and the worker both run it from here, so
neither imports the other."""

from __future__ import annotations

import asyncio
import logging

from effectgate.ledger import db
from effectgate.ledger.cluster.topology import SINGLE_NODE, Topology
from effectgate.ledger.handle import Ledger
from effectgate.ledger.maintenance.scheduler import (
    KindPolicy,
    Reconciler,
    ReconcilerConfig,
    ReconcileResult,
    Repaired,
)
from effectgate.ledger.maintenance.service import maintain_forever
from effectgate.ledger.vocabulary import JobState

from ..event import Transition
from ..observe import WorkerObserver
from ..registry import Registry

log = logging.getLogger("effectgate.reconciler")


def make_reconciler(
    registry: Registry, config: ReconcilerConfig | None = None, *, topology: Topology = SINGLE_NODE
) -> Reconciler:
    """A reconciler wired to ``registry``: its sweeps, each kind's pending TTL and poison threshold, and
    each kind's ``on_transition`` run inside the terminal transitions the lease rescuer makes; on a ledger
    of ``topology``."""

    async def on_transition(conn: db.Conn, repaired: Repaired) -> None:
        kind = registry.get(repaired.kind)
        if kind is not None and kind.on_transition is not None:
            await kind.on_transition(
                conn, Transition(repaired.job_id, repaired.effect_key, repaired.state, repaired.reason)
            )

    policies = {k.name: KindPolicy(k.pending_ttl, k.poison_threshold) for k in registry.kinds()}
    return Reconciler(
        config, registry.sweeps(), kinds=policies, on_transition=on_transition, topology=topology
    )


async def reconcile_forever(
    ledger: Ledger,
    registry: Registry,
    config: ReconcilerConfig,
    stopping: asyncio.Event,
    *,
    observer: WorkerObserver | None = None,
) -> None:
    """Run a reconciler pass every ``config.tick`` until ``stopping`` is set; logs only what it did.

    Workers and gateways both run it: each service takes an advisory lock, so however many processes
    tick, one runs each service, and a process that dies takes no repair with it. ``observer`` hears of
    each job a pass of this process reclaimed. The registry is read on every pass, so kinds and sweeps
    registered after start are picked up.
    """

    def reported(result: ReconcileResult) -> None:
        if observer is not None:
            observer.reconciled(result)
        for repaired in result.repaired:
            if repaired.state == JobState.PARKED:
                log.error(
                    "reconciler.parked",
                    extra={
                        "job_id": repaired.job_id,
                        "kind": repaired.kind,
                        "effect_key": repaired.effect_key,
                        "reason": repaired.reason,
                    },
                )
        if result.errors:
            # A failure is not a repair: its own name, at error level, so an alert can key on it.
            log.error(
                "reconciler.failed",
                extra={
                    "service_errors": result.service_errors,
                    "sweep_errors": result.sweep_errors,
                    "hook_errors": result.hook_errors,
                },
            )
        if _repaired_something(result):
            # JSON values, not the dataclass's repr: the log line is read by machines.
            log.info("reconciler.repaired", extra={"result": result.summary()})

    async def reconcile(conn: db.Conn) -> ReconcileResult:
        reconciler = make_reconciler(registry, config, topology=await ledger.topology(conn))
        return await reconciler.run_once(conn)

    await maintain_forever(
        ledger.pool,
        reconcile,
        tick=config.tick,
        stopping=stopping,
        on_result=reported,
    )


def _repaired_something(result: ReconcileResult) -> bool:
    # ``changed`` counts a failed service, sweep or hook too; those are reported as failures, not repairs.
    return (
        bool(result.rescue.repaired)
        or any(r.changed for r in (result.wake, result.partitions, result.retention))
        or any(result.sweep.acted.values())
    )

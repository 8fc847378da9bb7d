"""The worker's heartbeat: one task keeps every lease the worker holds alive, one statement per beat.

A lease found held by someone else fences its slice off and stops its handler; a cancel an operator
asked for reaches the slice's context. The task ends when the worker holds no lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Any

from effectgate.ledger import db, jobs
from effectgate.ledger.errors import LedgerError
from effectgate.ledger.handle import Ledger
from effectgate.ledger.jobs import heartbeats

from ..context import EffectContext
from ..effect_kind import EffectKind

log = logging.getLogger("effectgate.worker")

# A heartbeat skips a job whose row another transaction holds locked (lease_extend_if_held), and asks again
# for it after this (or a tenth of its TTL, if shorter) instead of at the next third of its TTL.
HEARTBEAT_BUSY_RETRY = 0.2
# A heartbeat that failed (the database lost: a restart, a failover) is tried again after this (or a tenth of its
# TTL, if shorter).
HEARTBEAT_FAILED_RETRY = 1.0


@dataclass(slots=True)
class Beat:
    """A lease the worker's heartbeat keeps alive, and what to tell when it is lost or cancelled."""

    lease: jobs.Lease
    kind: EffectKind
    ctx: EffectContext
    handler: asyncio.Task[Any]
    due: float


class Heartbeat:
    """The leases a worker holds, each extended at a third of its own kind's TTL, all in one statement."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger
        self.pool = ledger.pool
        # One heartbeat for every lease this worker holds, one statement per beat.
        self._beats: dict[int, Beat] = {}
        self._beat_changed = asyncio.Event()
        self._beat_task: asyncio.Task[None] | None = None

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The running heartbeat task, if any (the worker cancels it when it stops)."""
        return self._beat_task

    def beat(self, beat: Beat) -> None:
        self._beats[beat.lease.job_id] = beat
        self._beat_changed.set()
        if self._beat_task is None or self._beat_task.done():
            self._beat_task = asyncio.create_task(self._heartbeats(), name="heartbeats")

    async def _heartbeats(self) -> None:
        """Extend every lease due within half its interval, all in one statement, each at a third of
        its own kind's TTL; a lease whose row was locked is asked for again shortly. Returns when this
        worker holds no lease."""
        loop = asyncio.get_running_loop()
        while self._beats:
            self._beat_changed.clear()
            now = loop.time()
            wait = min(beat.due for beat in self._beats.values()) - now
            if wait > 0:
                # A new lease (perhaps of a shorter-TTL kind) recomputes the wait.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._beat_changed.wait(), wait)
                continue
            due = [b for b in self._beats.values() if b.due <= now + b.kind.lease_ttl / 6]
            for beat in due:
                beat.due = now + beat.kind.lease_ttl / 3
            try:
                async with db.connection(self.pool) as conn:
                    beat_result = await heartbeats.extend_leases(
                        conn,
                        [(b.lease.job_id, b.lease.lease_token, b.kind.lease_ttl) for b in due],
                        tenants=[b.lease.tenant for b in due]
                        if self._ledger.known_topology.distributed
                        else None,
                    )
            except LedgerError as exc:
                log.warning(
                    "worker.heartbeat_failed",
                    extra={"job_ids": [b.lease.job_id for b in due], "error": str(exc)},
                )
                # Asked again soon, not a third of the TTL later: two beats lost to a failover would
                # otherwise let the lease run out just as the new primary comes up.
                for beat in due:
                    beat.due = loop.time() + min(HEARTBEAT_FAILED_RETRY, beat.kind.lease_ttl / 10)
                continue
            for beat in due:
                if self._beats.get(beat.lease.job_id) is not beat:
                    continue  # its slice ended while the beat was in flight: the answer is not about it
                if beat.lease.job_id in beat_result.busy:
                    # Its row is locked by another transaction (its own fenced write, an operator's bulk
                    # action): not extended, not lost. Ask again soon, well inside the lease.
                    beat.due = loop.time() + min(HEARTBEAT_BUSY_RETRY, beat.kind.lease_ttl / 10)
                    continue
                cancel = beat_result.held.get(beat.lease.job_id)
                if cancel is None:
                    # Someone else holds the job now: refuse every later write from this slice, and stop
                    # it — nothing it does from here on could be committed.
                    beat.ctx.fenced_off = True
                    beat.handler.cancel()
                    del self._beats[beat.lease.job_id]
                    log.warning(
                        "worker.lease_lost",
                        extra={"job_id": beat.lease.job_id, "lease_token": beat.lease.lease_token},
                    )
                elif cancel:
                    beat.ctx.cancel_requested = True

    def forget(self, job_id: int) -> None:
        """The slice of ``job_id`` ended: its lease needs no more beats."""
        if self._beats.pop(job_id, None) is not None:
            self._beat_changed.set()  # the last lease gone ends the heartbeat task now, not a beat later

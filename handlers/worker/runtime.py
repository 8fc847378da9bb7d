"""The worker runtime: lease due jobs, run their handlers in slices, record every outcome.

One loop fetches jobs (``FOR UPDATE SKIP LOCKED``, woken by LISTEN/NOTIFY, polling as a fallback),
one task per leased job runs its handler under heartbeats, a soft slice budget and a hard deadline,
and one task runs the reconciler on a tick. While the loop runs, each batch of terminal transitions also
leases the jobs for the slots it frees, in its own transaction: one commit per batch, not two. On ``stop()`` the worker drains: it stops fetching,
asks running slices to yield, waits up to ``drain_timeout``, and leaves whatever did not hand back to
lease expiry — nothing is lost either way.

549 lines (``wc -l``), on purpose: what is left here is one class, ``Worker``, one state machine over its slots
(running tasks, their leases and contexts, the slots a refill offered, the fetch lock, the wake-up) that the
run loop, a fetch, a finish batch's refill, a job's end and the drain all read and write. Split further, that
state would be passed from module to module. What works beside it is in modules of its own: the settings
(``config``), the wake-up (``listen``), the heartbeat (``heartbeat``), a slice's end (``slices``), the
recording of outcomes (``recorder``), the finish batches (``finishes``) and the reconciler it ticks
(``maintenance``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from effectgate.ledger import db, error_kinds, jobs
from effectgate.ledger.errors import LeaseLost, LedgerError
from effectgate.ledger.handle import Ledger
from effectgate.ledger.jobs import heartbeats, steps
from effectgate.ledger.maintenance.scheduler import ReconcileResult

from .. import tracing
from ..actions import control
from ..context import EffectContext, Services
from ..event import Event
from ..observe import WorkerObserver
from ..outcomes import SliceOutcome
from ..registry import Registry
from .config import WorkerConfig
from .finishes import FinishBatcher
from .heartbeat import Beat, Heartbeat
from .listen import listen_for_jobs
from .maintenance import make_reconciler, reconcile_forever
from .recorder import OutcomeRecorder
from .slices import Ended, await_slice, call, log_settled

__all__ = ["HEALTHZ_STALE_AFTER", "Worker"]

log = logging.getLogger("effectgate.worker")

# GET /healthz on the worker's metrics port answers 503 once the run loop has not ticked for this long
# beyond its poll interval. One tick is a fetch (bounded by the pool's wait for a connection, 5 s) and a
# wait of at most poll_interval, so a loop older than this is stuck, not waiting for a database.
HEALTHZ_STALE_AFTER = 60.0


class Worker:
    """Runs registered effect handlers for leased jobs until stopped.

    ``observer``, when given, hears of every slice's end, every retry and every reclaim by this worker's
    reconciler (metrics); without one the worker reports nothing.

    The handle's ``pool`` carries the worker's own statements (fetch, heartbeat, finish batch, reconciler);
    the running jobs' writes go on its ``handler_pool``, so that with pools of their own no handler can hold
    the connection a heartbeat waits for (``config.worker_connections``). What the ledger is (distributed by
    tenant or not) is the handle's answer, asked at the first fetch.
    """

    def __init__(
        self,
        ledger: Ledger,
        registry: Registry,
        *,
        url: str | None = None,
        config: WorkerConfig | None = None,
        services: Services | None = None,
        owner: str | None = None,
        observer: WorkerObserver | None = None,
    ) -> None:
        self.ledger = ledger
        self.pool = ledger.pool
        self.handler_pool = ledger.handler_pool
        self.registry = registry
        self.url = url
        self.config = config or WorkerConfig()
        self.services = services or Services()
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.observer = observer
        # Set while the LISTEN connection is subscribed (readiness checks, tests).
        self.listening = asyncio.Event()
        self._running: dict[int, asyncio.Task[None]] = {}
        self._contexts: dict[int, EffectContext] = {}
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        # Set by a second stop(): the drain gives up at once instead of at its deadline.
        self._stop_now = asyncio.Event()
        self._leases: dict[int, jobs.Lease] = {}
        # One heartbeat for every lease this worker holds, one statement per beat.
        self._heartbeat = Heartbeat(ledger)
        # Terminal transitions of many jobs, one statement (and one commit) per batch.
        self._finishes = FinishBatcher(ledger)
        self._recorder = OutcomeRecorder(ledger, self.owner, self.config, observer, self._finishes)
        # Held from a fetch's free-slot count until its jobs' tasks are started: the run loop's fetch and a
        # finish batch's refill must not both fill the same free slots.
        self._fetching = asyncio.Lock()
        # Jobs whose slot a committed refill has already offered to a fetch: their end wakes no other one.
        self._offered: set[int] = set()
        # Wake-ups from the LISTEN connection so far: a refill compares it before its fetch and after its
        # commit, to tell whether a job claimed meanwhile was left for the slots it offered (_refilled).
        self._notifies = 0
        # time.monotonic() of the run loop's last tick: what /healthz answers from (None: not running yet).
        self.last_tick: float | None = None
        # The clock of a run_until_idle(now=…) (tests): what is due, and when a retry is due again. None: the
        # database's.
        self._now: datetime | None = None

    # -- lifecycle -------------------------------------------------------------------------------

    def stop(self) -> None:
        """Begin draining: stop fetching, ask running slices to yield, and log what is draining until when.

        Called again while draining (a second SIGTERM or Ctrl-C), stop now: every running slice is fenced
        off and cancelled, and its lease given up at once (``heartbeats.abandon_leases``), so the reconciler of
        any process hands the job on by its orphan policy at its next tick instead of after the lease TTL.
        """
        if self._stopping.is_set():
            if not self._stop_now.is_set():
                self._stop_now.set()
                log.warning("worker.stopping_now", extra={"owner": self.owner, **self._draining()})
            return
        self._stopping.set()
        self._wake.set()
        for ctx in self._contexts.values():
            ctx.draining = True
        deadline = datetime.now(UTC) + timedelta(seconds=self.config.drain_timeout)
        log.info(
            "worker.draining",
            extra={
                "owner": self.owner,
                **self._draining(),
                "drain_timeout": self.config.drain_timeout,
                "deadline": deadline.isoformat(timespec="seconds"),
                "hint": "stop again (SIGTERM or Ctrl-C) to hand the running jobs back now",
            },
        )

    def _draining(self) -> dict[str, Any]:
        running = [self._leases[j] for j, t in self._running.items() if not t.done() and j in self._leases]
        return {
            "jobs": len(running),
            "kinds": dict(Counter(lease.kind for lease in running)),
            "job_ids": sorted(lease.job_id for lease in running),
        }

    async def run(self) -> None:
        """Fetch and run jobs until ``stop()``; then drain and return."""
        # Which loop runs it: asyncio's, or uvloop's under `effectgate worker` (gateway/cli/loop.py).
        event_loop = type(asyncio.get_running_loop()).__module__.partition(".")[0]
        log.info(
            "worker.started", extra={"owner": self.owner, "kinds": self._ttls(), "event_loop": event_loop}
        )
        self._finishes.refill = self._refill
        background = [asyncio.create_task(self._listen())]
        if self.config.run_reconciler:
            background.append(asyncio.create_task(self._reconcile_loop()))
        try:
            while not self._stopping.is_set():
                self.last_tick = time.monotonic()
                # Cleared before the fetch, not after it: a NOTIFY landing while the fetch runs must wake
                # the wait below, or a job claimed in that window waits out a whole poll interval.
                self._wake.clear()
                free = self.config.concurrency - len(self._running)
                if free > 0:
                    try:
                        await self.fetch_and_start(free)
                    except LedgerError as exc:
                        log.warning("worker.fetch_failed", extra={"error": str(exc)})
                # Either the batch filled the free slots (a finished job wakes us, unless its finish batch's
                # refill offered its slot) or nothing more is due (a NOTIFY wakes us); polling is only the
                # fallback for a lost wake-up and for a retry whose delay ran out.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.config.poll_interval)
        finally:
            self._finishes.refill = None
            await self._drain()
            background.extend(t for t in (self._heartbeat.task, self._finishes.flusher) if t is not None)
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            log.info("worker.stopped", extra={"owner": self.owner})

    def health(self) -> tuple[bool, dict[str, Any]]:
        """Whether the run loop is alive, from this process's state alone (no database): its last tick is
        recent, or it is draining after ``stop()``. For ``GET /healthz`` on the metrics port."""
        draining = self._stopping.is_set()
        age = None if self.last_tick is None else round(time.monotonic() - self.last_tick, 3)
        state = {"loop_age_seconds": age, "running": len(self._running), "draining": draining}
        if age is None:
            return False, {"status": "starting", **state}
        if draining or age <= self.config.poll_interval + HEALTHZ_STALE_AFTER:
            return True, {"status": "ok", **state}
        return False, {"status": "stuck", **state}

    async def _drain(self) -> None:
        for ctx in self._contexts.values():
            ctx.draining = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.drain_timeout
        still: list[asyncio.Task[None]] = []
        # Again until none is left: a finish batch in flight when the worker stopped may still have leased
        # jobs for the slots it freed, and started them after the first look.
        while tasks := [t for t in self._running.values() if not t.done()]:
            remaining = deadline - loop.time()
            if self._stop_now.is_set() or remaining <= 0:
                still = tasks
                break
            now = asyncio.create_task(self._stop_now.wait())
            try:
                await asyncio.wait([*tasks, now], timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            finally:
                now.cancel()
        if not still:
            return
        ids = sorted(_task_job(t) for t in still)
        leases = [self._leases[j] for j in ids if j in self._leases]
        if not self._stop_now.is_set():
            # Left to lease expiry: each cancelled slice fences itself off and stops its handler, and the
            # reconciler redrives or parks the job by policy once the lease runs out.
            log.warning("worker.drain_timeout", extra={"left_to_lease_expiry": ids})
        for task in still:
            task.cancel()
        await asyncio.gather(*still, return_exceptions=True)
        if self._stop_now.is_set() and leases:
            # Each slice is fenced off now (its later writes refused, its handler cancelled), and a write
            # that was in flight committed whole or not at all: only then is the lease given up.
            try:
                async with db.connection(self.pool) as conn:
                    given_up = await heartbeats.abandon_leases(
                        conn,
                        [(lease.job_id, lease.lease_token) for lease in leases],
                        tenants=[lease.tenant for lease in leases]
                        if self.ledger.known_topology.distributed
                        else None,
                    )
            except LedgerError as exc:
                log.error(
                    "worker.abandon_failed",
                    extra={
                        "job_ids": ids,
                        "error": f"{type(exc).__name__}: {exc}",
                        "left_to_lease_expiry": ids,
                    },
                )
            else:
                log.warning(
                    "worker.leases_abandoned", extra={"job_ids": sorted(given_up), "owner": self.owner}
                )

    async def _listen(self) -> None:
        await listen_for_jobs(
            self.url,
            wake=self._wake,
            listening=self.listening,
            stopping=self._stopping,
            max_delay=self.config.poll_interval,
            notified=self._notified,
        )

    def _notified(self) -> None:
        self._notifies += 1

    async def _reconcile_loop(self) -> None:
        await reconcile_forever(
            self.ledger, self.registry, self.config.reconciler, self._stopping, observer=self.observer
        )

    async def reconcile_once(self, *, now: datetime | None = None) -> ReconcileResult:
        """One reconciler pass on a pooled connection, with the registry's current kinds and sweeps;
        ``now`` moves its clock (tests), as in ``Reconciler.run_once``."""
        async with db.connection(self.pool) as conn:
            reconciler = make_reconciler(
                self.registry, self.config.reconciler, topology=await self.ledger.topology(conn)
            )
            result = await reconciler.run_once(conn, now=now)
        if self.observer is not None:
            self.observer.reconciled(result)
        return result

    # -- running jobs ----------------------------------------------------------------------------

    def _ttls(self) -> dict[str, float]:
        return {k.name: k.lease_ttl for k in self.registry.kinds()}

    async def fetch_and_start(self, limit: int) -> int:
        """Lease up to ``limit`` due jobs and start a task for each; returns how many were leased."""
        ttls = self._ttls()
        if not ttls or limit < 1:
            return 0
        async with self._fetching:
            # Recounted under the lock: a finish batch's refill may have filled slots meanwhile.
            limit = min(limit, self.config.concurrency - len(self._running))
            if limit < 1:
                return 0
            to_supersede: list[int] = []
            async with db.connection(self.pool) as conn:
                # Distributed by tenant (Citus): the fetch, the heartbeat and the batched writes go one tenant
                # at a time, each routed to its shard (jobs.fetch_and_lease).
                known = await self.ledger.topology(conn)
                leases = await jobs.fetch_and_lease(
                    conn,
                    owner=self.owner,
                    kinds=ttls,
                    limit=limit,
                    hooked=self._hooked(),
                    to_supersede=to_supersede,
                    topology=known,
                    now=self._now,
                )
            self._start(leases)
        if to_supersede:
            await self._supersede(to_supersede)
            if len(leases) < limit:
                # The newer jobs that superseded them are due, and their wake-ups may already be spent.
                return len(leases) + await self.fetch_and_start(limit - len(leases))
        return len(leases)

    def _hooked(self) -> list[str]:
        return [k.name for k in self.registry.kinds() if k.on_transition is not None]

    async def _supersede(self, job_ids: list[int]) -> None:
        """Cancel, as superseded, pending jobs of kinds with an ``on_transition`` hook that a fetch found older
        than their object's newest claimed version: through the operator's cancel, which runs the hook in the
        cancel's transaction. A job another worker cancelled meanwhile is refused and changes nothing."""
        async with db.connection(self.pool) as conn:
            for job_id in job_ids:
                await control.cancel(conn, self.registry, job_id, by="ledger", reason="superseded")

    @contextlib.asynccontextmanager
    async def _refill(
        self, conn: db.Conn, finishing: list[int], guarded: bool = True
    ) -> AsyncIterator[Callable[[], None] | None]:
        """Inside a finish batch's transaction: lease jobs for the slots the batch's ``finishing`` jobs give
        back, so that one commit ends a batch and leases the next (a commit waits for the WAL flush, and two of
        them per batch bounded a drain: docs/performance.md). Yields what starts the leased jobs, to be called
        once the transaction has committed, or ``None``. Skipped while the run loop fetches or the worker
        stops; a refill that fails is logged and the batch's finishes commit without it, unless it lost the
        connection: then the batch fails with it, and each of its finishes is retried. Unguarded (no savepoint
        around the fetch, ``FinishBatcher``), a failed fetch has aborted the batch's transaction: it
        propagates, for the batch to be written again guarded."""
        ttls = self._ttls()
        free = self.config.concurrency - len(self._running) + len(finishing)
        notifies = self._notifies  # before the fetch: a job notified after it may not be seen by it
        if self._stopping.is_set() or not ttls or free < 1 or self._fetching.locked():
            yield None
            return
        await self._fetching.acquire()
        held = True
        try:
            to_supersede: list[int] = []
            try:
                leases = await jobs.fetch_and_lease(
                    conn,
                    owner=self.owner,
                    kinds=ttls,
                    limit=free,
                    hooked=self._hooked(),
                    to_supersede=to_supersede,
                    topology=self.ledger.known_topology,
                    now=self._now,
                    guarded=guarded,
                )
                if to_supersede:
                    # Cancelled by the run loop's next fetch, outside this batch's transaction.
                    self._wake.set()
            except Exception as exc:
                if not guarded:
                    raise
                log.warning("worker.fetch_failed", extra={"error": f"{type(exc).__name__}: {exc}"})
                if error_kinds.error_kind(exc) == "connection" or conn.broken:
                    raise  # the batch's transaction is lost with it: its finishes are retried, not answered
                yield functools.partial(self._start, [])  # their ends wake the run loop to fetch for them
                return
            if not leases:
                # Nothing leased, no slot to race for: a fetch woken by a NOTIFY meanwhile goes now instead of
                # waiting for this batch's commit (a WAL flush; it was ~4 ms of the wake-up under load).
                self._fetching.release()
                held = False
            yield functools.partial(self._refilled, finishing, leases, notifies)
        finally:
            if held:
                self._fetching.release()

    def _refilled(self, finishing: list[int], leases: list[jobs.Lease], notifies: int) -> None:
        """The refill's transaction committed: its leases are ours, and the finishing jobs' slots were offered
        to its fetch (anything due then was leased, up to the slots), so their ends need not wake another
        fetch. A job due since comes with its own NOTIFY; one whose retry delay runs out, with the poll.

        Unless a NOTIFY arrived since the fetch began (``notifies`` changed): its job may have been claimed
        after the fetch looked, and the run loop it woke found no free slot (the finishing jobs still held
        theirs), so nothing else would fetch for it until the poll. Then the slots are not marked offered: the
        finishing jobs' ends wake the run loop. (No wake-up now: those jobs still hold their slots until their
        batch answers them, after this.)"""
        if self._notifies == notifies:
            # Only jobs still running: an id left behind would spare a wake-up to the same job's next attempt.
            self._offered.update(j for j in finishing if j in self._running)
        self._start(leases)

    def _start(self, leases: list[jobs.Lease]) -> None:
        for lease in leases:
            self._leases[lease.job_id] = lease
            task = asyncio.create_task(self.run_job(lease), name=f"job-{lease.job_id}")
            self._running[lease.job_id] = task
            task.add_done_callback(functools.partial(self._finished, lease.job_id))

    def _finished(self, job_id: int, _task: asyncio.Task[None]) -> None:
        self._running.pop(job_id, None)
        self._leases.pop(job_id, None)
        self._contexts.pop(job_id, None)
        if job_id in self._offered:
            self._offered.discard(job_id)
        else:
            self._wake.set()

    async def run_until_idle(self, *, max_rounds: int = 1000, now: datetime | None = None) -> int:
        """Run due jobs until none is left or running (tests, one-shot CLI use); returns jobs run.

        ``now`` moves the clock, as ``reconcile_once(now=…)`` does: the jobs due by then run, and a retry is
        due again its backoff after it, so a test walks a day of retries without sleeping. Heartbeats and the
        times a finish records stay on the database's clock; a clock moved forward only lengthens a lease."""
        self._now = now
        try:
            return await self._run_until_idle(max_rounds)
        finally:
            self._now = None

    async def _run_until_idle(self, max_rounds: int) -> int:
        total = 0
        for _ in range(max_rounds):
            started = await self.fetch_and_start(self.config.concurrency - len(self._running))
            total += started
            tasks = list(self._running.values())
            if not started and not tasks:
                return total
            if tasks:
                await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        return total

    async def run_job(self, lease: jobs.Lease) -> None:
        """Run one leased job's slice to an outcome, and record it under the lease.

        Never raises but for cancellation: whatever goes wrong here (a lost lease, a database outage)
        leaves the job to lease expiry, which is where the reconciler picks it up.
        """
        started = time.monotonic()
        outcome: SliceOutcome | None = None
        try:
            outcome = await self._run_job_traced(lease)
        except asyncio.CancelledError:
            outcome = SliceOutcome.ABANDONED  # the drain gave up on it: left to lease expiry
            raise
        except LeaseLost:
            outcome = SliceOutcome.LEASE_LOST
            log.warning("worker.lease_lost", extra={"job_id": lease.job_id, "lease_token": lease.lease_token})
        except Exception as exc:
            outcome = SliceOutcome.CRASHED
            log.error(
                "worker.job_crashed",
                extra={"job_id": lease.job_id, "error": f"{type(exc).__name__}: {exc}"},
            )
        finally:
            if self.observer is not None and outcome is not None:
                self.observer.slice_ended(lease.kind, outcome, time.monotonic() - started)

    async def _run_job_traced(self, lease: jobs.Lease) -> SliceOutcome | None:
        # Current while the handler task is created, so its steps (and their downstream calls) are
        # children of this attempt's span.
        attributes: dict[str, tracing.AttributeValue] = {
            "effectgate.job_id": lease.job_id,
            "effectgate.kind": lease.kind,
            "effectgate.tenant": lease.tenant,
            "effectgate.effect_key": lease.effect_key,
            "effectgate.attempt": lease.attempt,
        }
        # A link, not a parent: the job's trace is its own (it may run hours later, many times), and leads
        # back to the delivery request that claimed it.
        links = (lease.trace_parent,) if lease.trace_parent else ()
        with tracing.span("effectgate.job", attributes, links=links) as span:
            outcome = await self._run_job(lease)
            span.set_attribute("effectgate.job.outcome", outcome or "not_run")
            return outcome

    async def _run_job(self, lease: jobs.Lease) -> SliceOutcome | None:
        """Run the slice and record it; returns how it ended, ``None`` if it never ran."""
        kind = self.registry.get(lease.kind)
        if kind is None:  # fetch only asks for registered kinds; a registry changed under us
            log.error("worker.unknown_kind", extra={"job_id": lease.job_id, "kind": lease.kind})
            return None
        recorded: dict[str, steps.RecordedStep] = {}
        if lease.has_steps:
            async with db.connection(self.handler_pool) as conn:
                recorded = await steps.for_effect(conn, lease.effect_id, tenant=lease.tenant)
        event = Event(lease.source, lease.event_id, lease.event_type, lease.payload, lease.tenant)
        ctx = EffectContext(
            pool=self.handler_pool,
            lease=lease,
            event=event,
            recorded=recorded,
            services=self.services,
            slice_budget=kind.slice_budget,
            topology=self.ledger.known_topology,
            outage_wait=kind.lease_ttl,
        )
        ctx.draining = self._stopping.is_set()
        self._contexts[lease.job_id] = ctx
        handler = asyncio.create_task(call(kind, ctx, event), name=f"handler-{lease.job_id}")
        self._heartbeat.beat(
            Beat(lease, kind, ctx, handler, asyncio.get_running_loop().time() + kind.lease_ttl / 3)
        )
        try:
            outcome, exc = await await_slice(ctx, kind, handler)
        except asyncio.CancelledError:
            # The drain gave up on this slice: refuse its writes, stop its handler, let the lease expire.
            ctx.fenced_off = True
            handler.cancel()
            handler.add_done_callback(functools.partial(log_settled, lease.job_id))
            raise
        finally:
            self._heartbeat.forget(lease.job_id)
        if outcome is Ended.ABANDONED:
            return SliceOutcome.ABANDONED
        if ctx.fenced_off:
            return SliceOutcome.LEASE_LOST
        step = ctx.step_of(exc) if exc is not None else None
        return await self._recorder.record_outcome(lease, kind, outcome, exc, step, now=self._now)


def _task_job(task: asyncio.Task[Any]) -> int:
    name = task.get_name()
    return int(name.removeprefix("job-")) if name.startswith("job-") else -1

"""The worker runtime: lease due jobs, run their handlers in slices, record every outcome.

One loop fetches jobs (``FOR UPDATE SKIP LOCKED``, woken by LISTEN/NOTIFY, polling as a fallback),
one task per leased job runs its handler under heartbeats, a soft slice budget and a hard deadline,
and one task runs the reconciler on a tick. While the loop runs, each batch of terminal transitions also
leases the jobs for the slots it frees, in its own transaction: one commit per batch, not two. On ``stop()`` the worker drains: it stops fetching,
asks running slices to yield, waits up to ``drain_timeout``, and leaves whatever did not hand back to
lease expiry — nothing is lost either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import logging
import os
import random
import socket
import time
import traceback
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from effectgate.ledger import db, jobs, steps
from effectgate.ledger.errors import LeaseLost, LedgerError, LedgerUnavailable
from effectgate.ledger.reconciler import ReconcilerConfig, ReconcileResult
from effectgate.ledger.vocabulary import JobState

from . import control, tracing
from .context import EffectContext, Services
from .errors import TerminalError, TransientError, UnrecoverableError
from .event import Event, Transition
from .maintenance import make_reconciler, reconcile_forever
from .observe import WorkerObserver
from .outcomes import HAND_BACK, SliceOutcome
from .registry import EffectKind, Registry

# Re-exported: they lived here before the maintenance loop moved to .maintenance.
__all__ = [
    "Worker",
    "WorkerConfig",
    "backoff_delay",
    "error_record",
    "make_reconciler",
    "reconcile_forever",
    "worker_pool_max",
]

log = logging.getLogger("effectgate.worker")

# Handlers wait on payment and shipping APIs: a slot spends most of a job awaiting the network, so the
# drain rate grows with the slots (measured by tests/bench/worker_sweep.py; docs/performance.md). 16 runs
# 3.5x the jobs of 4 at a 20-50 ms downstream call and keeps a worker at 21 connections (worker_pool_max).
DEFAULT_CONCURRENCY = 16
# A fallback only: LISTEN/NOTIFY wakes the loop for new jobs, and a finished job wakes it for its slot (unless
# its finish batch's refill already offered that slot to a fetch).
DEFAULT_POLL_INTERVAL = 2.0
DEFAULT_DRAIN_TIMEOUT = 30.0
DEFAULT_BACKOFF_BASE = 1.0
DEFAULT_BACKOFF_CAP = 600.0
# The worker's own statements (fetch, heartbeat, finish batch, reconciler tick) each hold at most one pooled
# connection at a time.
WORKER_OWN_CONNECTIONS = 4
# How long a step that ignored its cancellation may keep the slot before it is abandoned; never longer
# than the lease TTL, since past that the reconciler may hand the job to someone else anyway.
ABANDON_GRACE = 5.0
# Waits between tries of a terminal transition whose connection was lost (then one last try).
TRANSITION_RETRY_DELAYS = (0.05, 0.2, 0.5, 1.0)
# A lost LISTEN connection is re-opened after this, doubling up to the poll interval: a server restart
# should not cost a full poll interval of latency, a server that stays down should not be hammered.
LISTEN_RETRY_MIN = 0.05
# GET /healthz on the worker's metrics port answers 503 once the run loop has not ticked for this long
# beyond its poll interval. One tick is a fetch (bounded by the pool's wait for a connection, 5 s) and a
# wait of at most poll_interval, so a loop older than this is stuck, not waiting for a database.
HEALTHZ_STALE_AFTER = 60.0
# A heartbeat skips a job whose row another transaction holds locked (lease_extend_if_held), and asks again
# for it after this (or a tenth of its TTL, if shorter) instead of at the next third of its TTL.
HEARTBEAT_BUSY_RETRY = 0.2
LISTEN_APPLICATION_NAME = "effectgate-listen"


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """How a worker runs: concurrency, wake-ups, drain, retry backoff, reconciler.

    ``backoff_base=0`` turns retry waits off (the one switch tests use); retries then run at once.
    """

    concurrency: int = DEFAULT_CONCURRENCY
    poll_interval: float = DEFAULT_POLL_INTERVAL
    drain_timeout: float = DEFAULT_DRAIN_TIMEOUT
    backoff_base: float = DEFAULT_BACKOFF_BASE
    backoff_cap: float = DEFAULT_BACKOFF_CAP
    reconciler: ReconcilerConfig = field(default_factory=ReconcilerConfig)
    run_reconciler: bool = True

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError("worker concurrency must be >= 1")
        if not self.poll_interval > 0:
            raise ValueError("worker poll_interval must be > 0 seconds")
        if not self.drain_timeout >= 0:
            raise ValueError("worker drain_timeout must be >= 0 seconds")
        if not 0 <= self.backoff_base <= self.backoff_cap:
            raise ValueError("worker backoff needs 0 <= backoff_base <= backoff_cap")


def worker_pool_max(concurrency: int) -> int:
    """The most connections a worker's pool may open: one per slot plus the worker's own statements.

    A slot holds at most one connection at a time (a step record, a checkpoint, a fenced write; a step
    recorded inside a fenced write would wait on that write's own row lock, so none nests), and the
    worker's own statements give theirs back within a statement: every slot and every heartbeat gets a
    connection without waiting on a handler. (The LISTEN connection is not pooled.) It was
    ``concurrency * 2 + 2``, which made a worker with enough slots for network-bound handlers too dear in
    connections; measured, a worker at 64 slots held 3 (docs/performance.md).
    """
    return concurrency + WORKER_OWN_CONNECTIONS


def backoff_delay(attempt: int, base: float, cap: float, rng: random.Random | None = None) -> float:
    """Exponential backoff with jitter: a random delay in [0.5, 1] * min(cap, base * 2 ** (attempt - 1))."""
    ceiling = min(cap, base * 2.0 ** max(0, attempt - 1))
    draw = rng.random() if rng is not None else random.random()
    return ceiling * (0.5 + 0.5 * draw)


def error_record(exc: BaseException) -> dict[str, Any]:
    """How an attempt's error is stored: type, message, code (if any), traceback."""
    return {
        "type": type(exc).__name__,
        "message": _message(exc),
        "code": getattr(exc, "code", None),
        "traceback": "".join(traceback.format_exception(exc))[-8000:],
    }


def _message(exc: BaseException) -> str:
    # A handler's exception is user code: a __str__ that raises must cost the record its message, not the
    # job its terminal transition.
    try:
        return str(exc)
    except Exception:
        return f"<{type(exc).__name__}.__str__ raised>"


class Worker:
    """Runs registered effect handlers for leased jobs until stopped.

    ``observer``, when given, hears of every slice's end, every retry and every reclaim by this worker's
    reconciler (metrics); without one the worker reports nothing.
    """

    def __init__(
        self,
        pool: db.Pool,
        registry: Registry,
        *,
        url: str | None = None,
        config: WorkerConfig | None = None,
        services: Services | None = None,
        owner: str | None = None,
        observer: WorkerObserver | None = None,
    ) -> None:
        self.pool = pool
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
        # Whether the ledger is distributed by tenant (Citus): then the fetch, the heartbeat and the batched
        # writes go one tenant at a time, each routed to its shard (jobs.fetch_and_lease). Asked at the first
        # fetch; None until then.
        self._per_tenant: bool | None = None
        # One heartbeat for every lease this worker holds, one statement per beat.
        self._beats: dict[int, _Beat] = {}
        self._beat_changed = asyncio.Event()
        self._beat_task: asyncio.Task[None] | None = None
        # Terminal transitions of many jobs, one statement (and one commit) per batch.
        self._finishes = _FinishBatcher(pool)
        # Held from a fetch's free-slot count until its jobs' tasks are started: the run loop's fetch and a
        # finish batch's refill must not both fill the same free slots.
        self._fetching = asyncio.Lock()
        # Jobs whose slot a committed refill has already offered to a fetch: their end wakes no other one.
        self._offered: set[int] = set()
        # time.monotonic() of the run loop's last tick: what /healthz answers from (None: not running yet).
        self.last_tick: float | None = None

    # -- lifecycle -------------------------------------------------------------------------------

    def stop(self) -> None:
        """Begin draining: stop fetching, ask running slices to yield, and log what is draining until when.

        Called again while draining (a second SIGTERM or Ctrl-C), stop now: every running slice is fenced
        off and cancelled, and its lease given up at once (``jobs.abandon_leases``), so the reconciler of
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
        log.info("worker.started", extra={"owner": self.owner, "kinds": self._ttls()})
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
            background.extend(t for t in (self._beat_task, self._finishes.flusher) if t is not None)
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
                    given_up = await jobs.abandon_leases(
                        conn,
                        [(lease.job_id, lease.lease_token) for lease in leases],
                        tenants=[lease.tenant for lease in leases] if self._per_tenant else None,
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
        """LISTEN for new and re-queued jobs; re-established whenever the connection drops."""
        if self.url is None:
            return
        delay = LISTEN_RETRY_MIN
        while not self._stopping.is_set():
            try:
                conn = await db.connect(self.url, application_name=LISTEN_APPLICATION_NAME)
                async with conn:
                    await jobs.listen(conn)
                    delay = LISTEN_RETRY_MIN
                    self.listening.set()
                    self._wake.set()  # anything notified while we were not listening
                    async for _ in conn.notifies():
                        self._wake.set()
            except Exception as exc:
                if self._stopping.is_set():
                    return
                log.warning("worker.listen_lost", extra={"error": f"{type(exc).__name__}: {exc}"})
            finally:
                self.listening.clear()
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.config.poll_interval)

    async def _reconcile_loop(self) -> None:
        await reconcile_forever(
            self.pool, self.registry, self.config.reconciler, self._stopping, observer=self.observer
        )

    async def reconcile_once(self, *, now: datetime | None = None) -> ReconcileResult:
        """One reconciler pass on a pooled connection, with the registry's current kinds and sweeps;
        ``now`` moves its clock (tests), as in ``Reconciler.run_once``."""
        async with db.connection(self.pool) as conn:
            result = await make_reconciler(self.registry, self.config.reconciler).run_once(conn, now=now)
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
                if self._per_tenant is None:
                    self._per_tenant = self._finishes.per_tenant = await jobs.distributed(conn)
                leases = await jobs.fetch_and_lease(
                    conn,
                    owner=self.owner,
                    kinds=ttls,
                    limit=limit,
                    hooked=self._hooked(),
                    to_supersede=to_supersede,
                    per_tenant=self._per_tenant,
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
    async def _refill(self, conn: db.Conn, finishing: list[int]) -> AsyncIterator[Callable[[], None] | None]:
        """Inside a finish batch's transaction: lease jobs for the slots the batch's ``finishing`` jobs give
        back, so that one commit ends a batch and leases the next (a commit waits for the WAL flush, and two of
        them per batch bounded a drain: docs/performance.md). Yields what starts the leased jobs, to be called
        once the transaction has committed, or ``None``. Skipped while the run loop fetches or the worker
        stops; a refill that fails is logged and the batch's finishes commit without it."""
        ttls = self._ttls()
        free = self.config.concurrency - len(self._running) + len(finishing)
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
                    per_tenant=bool(self._per_tenant),
                )
                if to_supersede:
                    # Cancelled by the run loop's next fetch, outside this batch's transaction.
                    self._wake.set()
            except Exception as exc:
                log.warning("worker.fetch_failed", extra={"error": f"{type(exc).__name__}: {exc}"})
                yield functools.partial(self._start, [])  # their ends wake the run loop to fetch for them
                return
            if not leases:
                # Nothing leased, no slot to race for: a fetch woken by a NOTIFY meanwhile goes now instead of
                # waiting for this batch's commit (a WAL flush; it was ~4 ms of the wake-up under load).
                self._fetching.release()
                held = False
            yield functools.partial(self._refilled, finishing, leases)
        finally:
            if held:
                self._fetching.release()

    def _refilled(self, finishing: list[int], leases: list[jobs.Lease]) -> None:
        """The refill's transaction committed: its leases are ours, and the finishing jobs' slots were offered
        to its fetch (anything due then was leased, up to the slots), so their ends need not wake another
        fetch. A job due since comes with its own NOTIFY; one whose retry delay runs out, with the poll."""
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

    async def run_until_idle(self, *, max_rounds: int = 1000) -> int:
        """Run due jobs until none is left or running (tests, one-shot CLI use); returns jobs run."""
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
            async with db.connection(self.pool) as conn:
                recorded = await steps.for_effect(conn, lease.effect_id)
        event = Event(lease.source, lease.event_id, lease.event_type, lease.payload, lease.tenant)
        ctx = EffectContext(
            pool=self.pool,
            lease=lease,
            event=event,
            recorded=recorded,
            services=self.services,
            slice_budget=kind.slice_budget,
        )
        ctx.draining = self._stopping.is_set()
        self._contexts[lease.job_id] = ctx
        handler = asyncio.create_task(_call(kind, ctx, event), name=f"handler-{lease.job_id}")
        self._beat(_Beat(lease, kind, ctx, handler, asyncio.get_running_loop().time() + kind.lease_ttl / 3))
        try:
            outcome, exc = await self._await_slice(ctx, kind, handler)
        except asyncio.CancelledError:
            # The drain gave up on this slice: refuse its writes, stop its handler, let the lease expire.
            ctx.fenced_off = True
            handler.cancel()
            handler.add_done_callback(functools.partial(_log_settled, lease.job_id))
            raise
        finally:
            if self._beats.pop(lease.job_id, None) is not None:
                self._beat_changed.set()  # the last lease gone ends the heartbeat task now, not a beat later
        if outcome is _Ended.ABANDONED:
            return SliceOutcome.ABANDONED
        if ctx.fenced_off:
            return SliceOutcome.LEASE_LOST
        step = ctx.step_of(exc) if exc is not None else None
        return await self._record_outcome(lease, kind, outcome, exc, step)

    def _beat(self, beat: _Beat) -> None:
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
                    beat_result = await jobs.extend_leases(
                        conn,
                        [(b.lease.job_id, b.lease.lease_token, b.kind.lease_ttl) for b in due],
                        tenants=[b.lease.tenant for b in due] if self._per_tenant else None,
                    )
            except LedgerError as exc:
                log.warning(
                    "worker.heartbeat_failed",
                    extra={"job_ids": [b.lease.job_id for b in due], "error": str(exc)},
                )
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

    async def _await_slice(
        self, ctx: EffectContext, kind: EffectKind, handler: asyncio.Task[Any]
    ) -> tuple[_Ended, BaseException | None]:
        done, _ = await asyncio.wait({handler}, timeout=kind.max_slice)
        if done:
            return _outcome(handler)
        log.warning("worker.slice_overran", extra={"job_id": ctx.job_id, "max_slice": kind.max_slice})
        handler.cancel()
        done, _ = await asyncio.wait({handler}, timeout=min(ABANDON_GRACE, kind.lease_ttl))
        if not done:
            # The step ignores cancellation (a blocking call, a lock wait). Free the slot, refuse its
            # writes, and let the lease expire: the reconciler redrives or parks the job.
            ctx.fenced_off = True
            log.error("worker.slice_abandoned", extra={"job_id": ctx.job_id})
            handler.add_done_callback(functools.partial(_log_settled, ctx.job_id))
            return _Ended.ABANDONED, None
        outcome, exc = _outcome(handler)
        if outcome is _Ended.RETURNED or (
            outcome is _Ended.ERROR and isinstance(exc, asyncio.CancelledError)
        ):
            # A return after the deadline's cancellation is not evidence the work was done.
            return _Ended.ERROR, TransientError(
                f"slice exceeded max_slice ({kind.max_slice:g} s) and was cancelled"
            )
        return outcome, exc

    async def _record_outcome(
        self,
        lease: jobs.Lease,
        kind: EffectKind,
        outcome: _Ended,
        exc: BaseException | None,
        step: str | None = None,
    ) -> SliceOutcome:
        job_id, token = lease.job_id, lease.lease_token
        if outcome is _Ended.HANDED_BACK:
            threshold = kind.poison_threshold or self.config.reconciler.rescuer_config().poison_threshold
            reached = await self._transition(
                lease,
                kind,
                lambda conn: jobs.hand_back(
                    conn, job_id, token, poison_threshold=threshold, by=self.owner, tenant=lease.tenant
                ),
            )
            if reached.state == JobState.PARKED:
                log.error(
                    "worker.parked",
                    extra={**_job_fields(lease), "reason": reached.reason, "state": reached.state},
                )
            else:
                log.info("worker.handed_back", extra={"job_id": job_id, "state": reached.state})
            return _ended(reached, requeued=SliceOutcome.HANDED_BACK)
        if outcome is _Ended.RETURNED:
            reached = await self._finish(
                lease, kind, jobs.Finish(job_id, token, JobState.SUCCEEDED, self.owner, tenant=lease.tenant)
            )
            # DEBUG: at thousands of jobs a second a JSON line per success cost a quarter of the worker's CPU
            # per job (docs/performance.md); the attempt row, the metrics and a failure's line still say it.
            log.debug("worker.finished", extra={"job_id": job_id, "state": reached.state})
            return SliceOutcome(reached.state)
        assert exc is not None
        if isinstance(exc, LeaseLost):
            raise exc
        error = error_record(exc)
        failed_reason: str | None = None
        if isinstance(exc, TerminalError):
            failed_reason = f"{type(exc).__name__}: {_message(exc)}"
        elif lease.attempt >= lease.max_attempts:
            failed_reason = (
                f"attempts exhausted ({lease.attempt}/{lease.max_attempts}): "
                f"{type(exc).__name__}: {_message(exc)}"
            )
        if failed_reason is not None:
            finish = jobs.Finish(
                job_id,
                token,
                JobState.FAILED,
                self.owner,
                failed_reason,
                error,
                isinstance(exc, UnrecoverableError),
                tenant=lease.tenant,
            )
            reached = await self._finish(lease, kind, finish)
            if reached.state == JobState.FAILED:
                log.error(
                    "worker.failed",
                    extra={
                        **_job_fields(lease, exc, step),
                        "reason": failed_reason,
                        "unrecoverable": isinstance(exc, UnrecoverableError),
                    },
                )
            else:
                log.info("worker.finished", extra={"job_id": job_id, "state": reached.state})
            return SliceOutcome(reached.state)
        delay = backoff_delay(lease.attempt, self.config.backoff_base, self.config.backoff_cap)
        retry_after = getattr(exc, "retry_after", None)
        if isinstance(retry_after, int | float) and retry_after > delay:
            delay = float(retry_after)
        reached = await self._transition(
            lease,
            kind,
            lambda conn: jobs.retry(conn, job_id, token, delay=delay, error=error, tenant=lease.tenant),
        )
        if reached.state == JobState.PENDING:
            log.warning("worker.retry", extra={**_job_fields(lease, exc, step), "delay": round(delay, 3)})
        else:
            log.info(
                "worker.retry_overtaken",
                extra={**_job_fields(lease, exc, step), "state": reached.state, "reason": reached.reason},
            )
        if reached.state == JobState.PENDING and self.observer is not None:
            self.observer.retry_scheduled(lease.kind)
        return _ended(reached, requeued=SliceOutcome.RETRY)

    async def _finish(self, lease: jobs.Lease, kind: EffectKind, finish: jobs.Finish) -> jobs.Reached:
        """A terminal transition, batched with the other jobs finishing now; retried as ``_transition``."""
        for delay in (*TRANSITION_RETRY_DELAYS, None):
            try:
                return await self._finishes.finish(lease, kind, finish)
            except LedgerUnavailable as exc:
                if delay is None:
                    raise
                log.warning(
                    "worker.transition_retry",
                    extra={"job_id": lease.job_id, "delay": delay, "error": str(exc)},
                )
                await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    async def _transition(
        self,
        lease: jobs.Lease,
        kind: EffectKind,
        apply: Callable[[db.Conn], Awaitable[jobs.Reached]],
    ) -> jobs.Reached:
        """Make one fenced transition; a terminal one runs the kind's ``on_transition`` in its transaction.

        A lost connection is retried a few times: the slice's work is done, and leaving its outcome to
        lease expiry would re-run or park a job that only failed to say it finished. If an earlier try
        did commit before its connection dropped, the retry finds the lease gone (``LeaseLost``) and
        changes nothing.
        """
        for delay in TRANSITION_RETRY_DELAYS:
            try:
                return await self._transition_once(lease, kind, apply)
            except LedgerUnavailable as exc:
                log.warning(
                    "worker.transition_retry",
                    extra={"job_id": lease.job_id, "delay": delay, "error": str(exc)},
                )
                await asyncio.sleep(delay)
        return await self._transition_once(lease, kind, apply)

    async def _transition_once(
        self,
        lease: jobs.Lease,
        kind: EffectKind,
        apply: Callable[[db.Conn], Awaitable[jobs.Reached]],
    ) -> jobs.Reached:
        async with db.connection(self.pool) as conn:
            if kind.on_transition is None:
                # One statement on an autocommit connection is its own transaction: no BEGIN/COMMIT.
                return await apply(conn)
            reached: jobs.Reached | None = None
            try:
                async with conn.transaction():
                    reached = await apply(conn)
                    if reached.terminal and kind.on_transition is not None:
                        transition = Transition(lease.job_id, lease.effect_key, reached.state, reached.reason)
                        await kind.on_transition(conn, transition)
                return reached
            except Exception as exc:
                if reached is None:
                    raise
                # The hook failed and took the transition down with it. A job left running is worse than a
                # user row that missed its mirror (a sweep can repair that), so transition without it.
                log.error(
                    "worker.transition_hook_failed",
                    extra={"job_id": lease.job_id, "error": f"{type(exc).__name__}: {exc}"},
                )
            async with conn.transaction():
                return await apply(conn)


class _Ended(enum.Enum):
    """How the handler's task ended, before anything is recorded."""

    RETURNED = enum.auto()
    HANDED_BACK = enum.auto()
    ERROR = enum.auto()
    ABANDONED = enum.auto()


# What the handler side called a hand-back before HAND_BACK. Returned now, it would read as success and
# leave the rest of the work undone, so it fails the job with a message saying what to return instead.
_OLD_HAND_BACK = "budget"


@dataclass(slots=True)
class _Beat:
    """A lease the worker's heartbeat keeps alive, and what to tell when it is lost or cancelled."""

    lease: jobs.Lease
    kind: EffectKind
    ctx: EffectContext
    handler: asyncio.Task[Any]
    due: float


@dataclass(slots=True)
class _Finishing:
    lease: jobs.Lease
    kind: EffectKind
    finish: jobs.Finish
    future: asyncio.Future[jobs.Reached]


class _FinishBatcher:
    """Terminal transitions of the jobs that finish together, written by one statement in one commit.

    Each row is fenced by its own token: a stale one raises ``LeaseLost`` for its job alone. A kind's
    ``on_transition`` runs in the batch's transaction, each in a savepoint, so a failing hook rolls
    back its own writes and no one else's (the transition stands: a job left running is worse than a
    user row that missed its mirror, which a sweep can repair). One batch is in flight at a time; the
    next takes what queued meanwhile, so an idle worker's lone transition goes at once.
    """

    def __init__(self, pool: db.Pool, max_batch: int = 256) -> None:
        self._pool = pool
        self._max_batch = max_batch
        # A ledger distributed by tenant: one statement per tenant (set by the worker's first fetch).
        self.per_tenant = False
        self._queue: list[_Finishing] = []
        self.flusher: asyncio.Task[None] | None = None
        # Set by a running worker: leases the next jobs in the batch's own transaction (Worker._refill).
        self.refill: (
            Callable[[db.Conn, list[int]], contextlib.AbstractAsyncContextManager[Callable[[], None] | None]]
            | None
        ) = None

    async def finish(self, lease: jobs.Lease, kind: EffectKind, finish: jobs.Finish) -> jobs.Reached:
        item = _Finishing(lease, kind, finish, asyncio.get_running_loop().create_future())
        self._queue.append(item)
        if self.flusher is None or self.flusher.done():
            self.flusher = asyncio.create_task(self._flush(), name="finishes")
        return await item.future

    async def _flush(self) -> None:
        while self._queue:
            batch, self._queue = self._queue[: self._max_batch], self._queue[self._max_batch :]
            try:
                answers = await self._write(batch)
            except BaseException as exc:
                for item in batch:
                    if not item.future.done():
                        item.future.set_exception(exc)
                if not isinstance(exc, Exception):
                    raise
                continue
            for item, reached in zip(batch, answers, strict=True):
                if item.future.done():
                    continue
                if reached is None:
                    item.future.set_exception(LeaseLost(item.finish.job_id, item.finish.lease_token))
                elif isinstance(reached, LedgerError):
                    item.future.set_exception(reached)  # this job's alone: its batch-mates went through
                else:
                    item.future.set_result(reached)

    async def _write(self, batch: list[_Finishing]) -> list[jobs.Reached | LedgerError | None]:
        async with db.connection(self._pool) as conn, contextlib.AsyncExitStack() as refilled:
            hooks = any(item.kind.on_transition is not None for item in batch)
            if self.refill is None and not hooks:
                # One statement on an autocommit connection is its own transaction: no BEGIN/COMMIT.
                return await jobs.finish_many(
                    conn, [item.finish for item in batch], per_tenant=self.per_tenant
                )
            start: Callable[[], None] | None = None
            async with conn.transaction():
                answers = await jobs.finish_many(
                    conn, [item.finish for item in batch], per_tenant=self.per_tenant
                )
                for item, reached in zip(batch, answers, strict=True):
                    hook = item.kind.on_transition
                    if not isinstance(reached, jobs.Reached) or not reached.terminal or hook is None:
                        continue
                    transition = Transition(
                        item.lease.job_id, item.lease.effect_key, reached.state, reached.reason
                    )
                    try:
                        async with conn.transaction():
                            await hook(conn, transition)
                    except Exception as exc:
                        log.error(
                            "worker.transition_hook_failed",
                            extra={"job_id": item.lease.job_id, "error": f"{type(exc).__name__}: {exc}"},
                        )
                if self.refill is not None:
                    # Last in the transaction, so its row locks are held the shortest time.
                    start = await refilled.enter_async_context(
                        self.refill(conn, [item.lease.job_id for item in batch])
                    )
            if start is not None:
                start()  # committed: the leases are ours
            return answers


def _ended(reached: jobs.Reached, *, requeued: SliceOutcome) -> SliceOutcome:
    # Back to pending is the outcome the caller asked for; anything else (a cancel that won, a poison
    # park) is the state the job reached instead.
    return requeued if reached.state == JobState.PENDING else SliceOutcome(reached.state)


async def _call(kind: EffectKind, ctx: EffectContext, event: Event) -> Any:
    return await kind.fn(ctx, event)


def _outcome(handler: asyncio.Task[Any]) -> tuple[_Ended, BaseException | None]:
    if handler.cancelled():
        return _Ended.ERROR, asyncio.CancelledError()
    exc = handler.exception()
    if exc is not None:
        return _Ended.ERROR, exc
    result = handler.result()
    if result is HAND_BACK:
        return _Ended.HANDED_BACK, None
    if isinstance(result, str) and result == _OLD_HAND_BACK:
        return _Ended.ERROR, TerminalError(
            'the handler returned "budget": return effectgate.HAND_BACK to hand the rest of the work back'
        )
    return _Ended.RETURNED, None


def _job_fields(
    lease: jobs.Lease, exc: BaseException | None = None, step: str | None = None
) -> dict[str, Any]:
    """What a retry, failure or park line says: which job, which attempt of how many, which step (``None``:
    outside every step) and which error."""
    return {
        "job_id": lease.job_id,
        "kind": lease.kind,
        "effect_key": lease.effect_key,
        "attempt": lease.attempt,
        "max_attempts": lease.max_attempts,
        "step": step,
        "error_class": None if exc is None else type(exc).__name__,
        "error": None if exc is None else _message(exc),
    }


def _task_job(task: asyncio.Task[Any]) -> int:
    name = task.get_name()
    return int(name.removeprefix("job-")) if name.startswith("job-") else -1


def _log_settled(job_id: int, task: asyncio.Task[Any]) -> None:
    if task.cancelled():
        outcome, error = "cancelled", None
    else:
        exc = task.exception()
        outcome, error = ("error", f"{type(exc).__name__}: {exc}") if exc else ("returned", None)
    log.warning("worker.abandoned_step_settled", extra={"job_id": job_id, "outcome": outcome, "error": error})

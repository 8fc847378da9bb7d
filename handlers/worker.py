"""The worker runtime: lease due jobs, run their handlers in slices, record every outcome.

One loop fetches jobs (``FOR UPDATE SKIP LOCKED``, woken by LISTEN/NOTIFY, polling as a fallback),
one task per leased job runs its handler under heartbeats, a soft slice budget and a hard deadline,
and one task runs the reconciler on a tick. On ``stop()`` the worker drains: it stops fetching,
asks running slices to yield, waits up to ``drain_timeout``, and leaves whatever did not hand back to
lease expiry — nothing is lost either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import random
import socket
import traceback
import uuid
from dataclasses import dataclass, field
from typing import Any

from ledger import db, jobs, steps
from ledger.errors import LeaseLost, LedgerError
from ledger.reconciler import Reconciler, ReconcilerConfig

from .context import EffectContext, Services
from .errors import TerminalError, TransientError, UnrecoverableError
from .registry import EffectKind, Event, Registry, Transition

log = logging.getLogger("effectgate.worker")

NOTIFY_CHANNEL = "effectgate_jobs"
DEFAULT_CONCURRENCY = 4
DEFAULT_POLL_INTERVAL = 2.0
DEFAULT_DRAIN_TIMEOUT = 30.0
DEFAULT_BACKOFF_BASE = 1.0
DEFAULT_BACKOFF_CAP = 600.0
# How long a step that ignored its cancellation may keep the slot before it is abandoned.
ABANDON_GRACE = 5.0
HANDED_BACK = "budget"


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """How a worker runs: concurrency, wake-ups, drain, retry backoff, reconciler."""

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
        if self.poll_interval <= 0:
            raise ValueError("worker poll_interval must be > 0 seconds")
        if self.drain_timeout < 0:
            raise ValueError("worker drain_timeout must be >= 0 seconds")
        if self.backoff_base < 0 or self.backoff_cap < self.backoff_base:
            raise ValueError("worker backoff needs 0 <= backoff_base <= backoff_cap")


def backoff_delay(attempt: int, base: float, cap: float, rng: random.Random | None = None) -> float:
    """Exponential backoff with jitter: a random delay in [0.5, 1] * min(cap, base * 2 ** (attempt - 1))."""
    ceiling = min(cap, base * 2.0 ** max(0, attempt - 1))
    draw = rng.random() if rng is not None else random.random()
    return ceiling * (0.5 + 0.5 * draw)


def error_record(exc: BaseException) -> dict[str, Any]:
    """How an attempt's error is stored: type, message, code (if any), traceback."""
    return {
        "type": type(exc).__name__,
        "message": str(exc),
        "code": getattr(exc, "code", None),
        "traceback": "".join(traceback.format_exception(exc))[-8000:],
    }


class Worker:
    """Runs registered effect handlers for leased jobs until stopped."""

    def __init__(
        self,
        pool: db.Pool,
        registry: Registry,
        *,
        url: str | None = None,
        config: WorkerConfig | None = None,
        services: Services | None = None,
        owner: str | None = None,
    ) -> None:
        self.pool = pool
        self.registry = registry
        self.url = url
        self.config = config or WorkerConfig()
        self.services = services or Services()
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.reconciler = Reconciler(self.config.reconciler, registry.sweeps())
        self._running: dict[int, tuple[asyncio.Task[None], EffectContext | None]] = {}
        self._contexts: dict[int, EffectContext] = {}
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()

    # -- lifecycle -------------------------------------------------------------------------------

    def stop(self) -> None:
        """Begin draining: stop fetching, ask running slices to yield."""
        self._stopping.set()
        self._wake.set()
        for ctx in self._contexts.values():
            ctx.draining = True

    async def run(self) -> None:
        """Fetch and run jobs until ``stop()``; then drain and return."""
        kinds = [k.name for k in self.registry.kinds()]
        log.info("worker.started", extra={"owner": self.owner, "kinds": kinds})
        background = [asyncio.create_task(self._listen())]
        if self.config.run_reconciler:
            background.append(asyncio.create_task(self._reconcile_loop()))
        try:
            while not self._stopping.is_set():
                fetched = 0
                free = self.config.concurrency - len(self._running)
                if free > 0 and kinds:
                    try:
                        fetched = await self.fetch_and_start(free)
                    except LedgerError as exc:
                        log.warning("worker.fetch_failed", extra={"error": str(exc)})
                if fetched == 0 or len(self._running) >= self.config.concurrency:
                    self._wake.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), self.config.poll_interval)
        finally:
            await self._drain()
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            log.info("worker.stopped", extra={"owner": self.owner})

    async def _drain(self) -> None:
        for ctx in self._contexts.values():
            ctx.draining = True
        tasks = [task for task, _ in self._running.values()]
        if not tasks:
            return
        _, still = await asyncio.wait(tasks, timeout=self.config.drain_timeout)
        for task in still:
            # Left to lease expiry: the reconciler redrives or parks it by policy.
            left = self._contexts.get(_task_job(task))
            if left is not None:
                left.fenced_off = True
            task.cancel()
        if still:
            log.warning("worker.drain_timeout", extra={"left_to_lease_expiry": len(still)})
            await asyncio.gather(*still, return_exceptions=True)

    async def _listen(self) -> None:
        """LISTEN for new and re-queued jobs; re-established whenever the connection drops."""
        if self.url is None:
            return
        while not self._stopping.is_set():
            try:
                conn = await db.connect(self.url)
                async with conn:
                    await conn.execute("LISTEN " + NOTIFY_CHANNEL)
                    self._wake.set()  # anything notified while we were not listening
                    async for _ in conn.notifies():
                        self._wake.set()
            except (LedgerError, OSError, Exception) as exc:
                if self._stopping.is_set():
                    return
                log.warning("worker.listen_lost", extra={"error": f"{type(exc).__name__}: {exc}"})
                await asyncio.sleep(self.config.poll_interval)

    async def _reconcile_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                result = await self.reconcile_once()
                if result.changed:
                    log.info("reconciler.repaired", extra={"result": str(result)})
            except Exception as exc:
                log.warning("reconciler.failed", extra={"error": f"{type(exc).__name__}: {exc}"})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self.config.reconciler.tick)

    async def reconcile_once(self) -> Any:
        """One reconciler pass on a pooled connection."""
        async with db.connection(self.pool) as conn:
            return await self.reconciler.run_once(conn)

    # -- running jobs ----------------------------------------------------------------------------

    async def fetch_and_start(self, limit: int) -> int:
        """Lease up to ``limit`` due jobs and start a task for each; returns how many were leased."""
        kinds = [k.name for k in self.registry.kinds()]
        ttl = min((k.lease_ttl for k in self.registry.kinds()), default=60.0)
        async with db.connection(self.pool) as conn:
            leases = await jobs.fetch_and_lease(conn, owner=self.owner, kinds=kinds, limit=limit, ttl=ttl)
        for lease in leases:
            task = asyncio.create_task(self.run_job(lease), name=f"job-{lease.job_id}")
            self._running[lease.job_id] = (task, None)
            task.add_done_callback(functools.partial(self._finished, lease.job_id))
        return len(leases)

    def _finished(self, job_id: int, _task: asyncio.Task[None]) -> None:
        self._running.pop(job_id, None)
        self._contexts.pop(job_id, None)
        self._wake.set()

    async def run_until_idle(self, *, max_rounds: int = 1000) -> int:
        """Run due jobs until none is left or running (tests, one-shot CLI use); returns jobs run."""
        total = 0
        for _ in range(max_rounds):
            started = await self.fetch_and_start(self.config.concurrency)
            total += started
            tasks = [task for task, _ in self._running.values()]
            if not started and not tasks:
                return total
            if tasks:
                await asyncio.wait(tasks)
        return total

    async def run_job(self, lease: jobs.Lease) -> None:
        """Run one leased job's slice to an outcome, and record it under the lease."""
        kind = self.registry.get(lease.kind)
        if kind is None:  # fetch only asks for registered kinds; a registry changed under us
            log.error("worker.unknown_kind", extra={"job_id": lease.job_id, "kind": lease.kind})
            return
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
        heartbeat = asyncio.create_task(self._heartbeat(ctx, lease, kind))
        try:
            outcome, exc = await self._run_slice(ctx, kind, event)
        finally:
            heartbeat.cancel()
            await asyncio.gather(heartbeat, return_exceptions=True)
        if outcome == "abandoned" or ctx.fenced_off:
            return
        try:
            await self._record_outcome(ctx, lease, kind, outcome, exc)
        except LeaseLost:
            log.warning("worker.lease_lost", extra={"job_id": lease.job_id, "lease_token": lease.lease_token})

    async def _heartbeat(self, ctx: EffectContext, lease: jobs.Lease, kind: EffectKind) -> None:
        interval = kind.lease_ttl / 3
        while True:
            await asyncio.sleep(interval)
            try:
                async with db.connection(self.pool) as conn:
                    if await jobs.extend_lease(conn, lease.job_id, lease.lease_token, ttl=kind.lease_ttl):
                        ctx.cancel_requested = True
            except LeaseLost:
                # Someone else holds the job now: every later write from this slice is refused.
                ctx.fenced_off = True
                log.warning(
                    "worker.lease_lost", extra={"job_id": lease.job_id, "lease_token": lease.lease_token}
                )
                return
            except LedgerError as exc:
                log.warning("worker.heartbeat_failed", extra={"job_id": lease.job_id, "error": str(exc)})

    async def _run_slice(
        self, ctx: EffectContext, kind: EffectKind, event: Event
    ) -> tuple[str, BaseException | None]:
        task: asyncio.Task[Any] = asyncio.create_task(kind.fn(ctx, event))  # type: ignore[arg-type]
        done, _ = await asyncio.wait({task}, timeout=kind.max_slice)
        if not done:
            log.warning("worker.slice_overran", extra={"job_id": ctx.job_id, "max_slice": kind.max_slice})
            task.cancel()
            done, _ = await asyncio.wait({task}, timeout=min(ABANDON_GRACE, kind.lease_ttl))
            if not done:
                # The step ignores cancellation (a blocking call, a lock wait). Free the slot, refuse its
                # writes, and let the lease expire: the reconciler redrives or parks the job.
                ctx.fenced_off = True
                log.error("worker.slice_abandoned", extra={"job_id": ctx.job_id})
                task.add_done_callback(functools.partial(_log_settled, ctx.job_id))
                return "abandoned", None
            # Cancelled at the deadline and returned: the lease is still ours, so say so in the ledger.
            return "error", TransientError(
                f"slice exceeded max_slice ({kind.max_slice:g} s) and was cancelled"
            )
        try:
            result = task.result()
        except asyncio.CancelledError as exc:
            return "error", TransientError(f"handler was cancelled: {exc}")
        except Exception as exc:
            return "error", exc
        return ("handed_back" if result == HANDED_BACK else "returned"), None

    async def _record_outcome(
        self,
        ctx: EffectContext,
        lease: jobs.Lease,
        kind: EffectKind,
        outcome: str,
        exc: BaseException | None,
    ) -> None:
        async with db.connection(self.pool) as conn:
            if outcome == "handed_back":
                state = await jobs.hand_back(
                    conn,
                    lease.job_id,
                    lease.lease_token,
                    poison_threshold=self.config.reconciler.poison_threshold,
                    by=self.owner,
                )
                log.info("worker.handed_back", extra={"job_id": lease.job_id, "state": state})
                return
            if outcome == "returned":
                await self._finish(conn, ctx, kind, state="succeeded", reason=None)
                return
            assert exc is not None
            if isinstance(exc, LeaseLost):
                raise exc
            error = error_record(exc)
            if isinstance(exc, TerminalError):
                await self._finish(
                    conn,
                    ctx,
                    kind,
                    state="failed",
                    reason=f"{type(exc).__name__}: {exc}",
                    error=error,
                    unrecoverable=isinstance(exc, UnrecoverableError),
                )
            elif lease.attempt >= lease.max_attempts:
                await self._finish(
                    conn,
                    ctx,
                    kind,
                    state="failed",
                    reason=f"attempts exhausted ({lease.attempt}/{lease.max_attempts}): {type(exc).__name__}: {exc}",
                    error=error,
                )
            else:
                delay = backoff_delay(lease.attempt, self.config.backoff_base, self.config.backoff_cap)
                retry_after = getattr(exc, "retry_after", None)
                if isinstance(retry_after, int | float) and retry_after > delay:
                    delay = float(retry_after)
                state = await jobs.retry(conn, lease.job_id, lease.lease_token, delay=delay, error=error)
                log.info(
                    "worker.retry",
                    extra={"job_id": lease.job_id, "attempt": lease.attempt, "delay": delay, "state": state},
                )

    async def _finish(
        self,
        conn: db.Conn,
        ctx: EffectContext,
        kind: EffectKind,
        *,
        state: jobs.FinishState,
        reason: str | None,
        error: dict[str, Any] | None = None,
        unrecoverable: bool = False,
    ) -> None:
        # The terminal transition and the kind's own mirror of it commit together or not at all.
        async with conn.transaction():
            reached = await jobs.finish(
                conn,
                ctx.job_id,
                ctx._lease.lease_token,
                state=state,
                by=self.owner,
                reason=reason,
                error=error,
                unrecoverable=unrecoverable,
            )
            if kind.on_transition is not None:
                await kind.on_transition(conn, Transition(ctx.job_id, ctx.effect_key, reached, reason))
        log.info("worker.finished", extra={"job_id": ctx.job_id, "state": reached})


def _task_job(task: asyncio.Task[Any]) -> int:
    name = task.get_name()
    return int(name.removeprefix("job-")) if name.startswith("job-") else -1


def _log_settled(job_id: int, task: asyncio.Task[Any]) -> None:
    outcome = "cancelled" if task.cancelled() else ("error" if task.exception() else "returned")
    log.warning("worker.abandoned_step_settled", extra={"job_id": job_id, "outcome": outcome})

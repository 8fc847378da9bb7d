"""Recording a slice's outcome under its lease: success, failure, a retry after backoff, a hand-back.

Terminal transitions go through the worker's finish batcher; the others are one fenced transition each,
with the kind's ``on_transition`` hook in its transaction. A lost connection is retried until the database is
back, for up to the kind's lease TTL.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

from effectgate.ledger import db, jobs
from effectgate.ledger.errors import LeaseLost, LedgerUnavailable
from effectgate.ledger.handle import Ledger
from effectgate.ledger.vocabulary import JobState

from ..effect_kind import EffectKind
from ..errors import TerminalError, UnrecoverableError, facts
from ..event import Transition
from ..observe import WorkerObserver
from ..outcomes import SliceOutcome
from .backoff import backoff_delay, kind_backoff
from .config import WorkerConfig
from .finishes import FinishBatcher
from .slices import Ended

log = logging.getLogger("effectgate.worker")


def error_record(exc: BaseException) -> dict[str, Any]:
    """How an attempt's error is stored: type, message, code (if any), the provider's facts (HTTP status,
    request id, decline code: ``errors.facts``, where known) and traceback."""
    return {
        "type": type(exc).__name__,
        "message": _message(exc),
        "code": getattr(exc, "code", None),
        **facts(exc),
        "traceback": "".join(traceback.format_exception(exc))[-8000:],
    }


def _message(exc: BaseException) -> str:
    # A handler's exception is user code: a __str__ that raises must cost the record its message, not the
    # job its terminal transition.
    try:
        return str(exc)
    except Exception:
        return f"<{type(exc).__name__}.__str__ raised>"


class OutcomeRecorder:
    """Records how each of a worker's slices ended, as the worker's ``owner``, under the slice's lease."""

    def __init__(
        self,
        ledger: Ledger,
        owner: str,
        config: WorkerConfig,
        observer: WorkerObserver | None,
        finishes: FinishBatcher,
    ) -> None:
        self._ledger = ledger
        # The running jobs' pool: a retry's or a yield's transition is one slot's own write.
        self.pool = ledger.handler_pool
        self.owner = owner
        self.config = config
        self.observer = observer
        self._finishes = finishes

    async def record_outcome(
        self,
        lease: jobs.Lease,
        kind: EffectKind,
        outcome: Ended,
        exc: BaseException | None,
        step: str | None = None,
        *,
        now: datetime | None = None,
    ) -> SliceOutcome:
        """Record how the slice of ``lease`` ended. ``now`` moves the clock a retry is scheduled from
        (``Worker.run_until_idle(now=…)``, tests); ``None`` is the database's."""
        job_id, token = lease.job_id, lease.lease_token
        if outcome is Ended.HANDED_BACK:
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
        if outcome is Ended.RETURNED:
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
        delay = backoff_delay(lease.attempt, *kind_backoff(kind, self.config))
        retry_after = getattr(exc, "retry_after", None)
        if isinstance(retry_after, int | float) and retry_after > delay:
            delay = float(retry_after)
        reached = await self._transition(
            lease,
            kind,
            lambda conn: jobs.retry(
                conn,
                job_id,
                token,
                delay=delay,
                error=error,
                now=now,
                tenant=lease.tenant,
                topology=self._ledger.known_topology,
            ),
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
        return await self._outlast_outage(lease, kind, lambda: self._finishes.finish(lease, kind, finish))

    async def _transition(
        self,
        lease: jobs.Lease,
        kind: EffectKind,
        apply: Callable[[db.Conn], Awaitable[jobs.Reached]],
    ) -> jobs.Reached:
        """Make one fenced transition; a terminal one runs the kind's ``on_transition`` in its transaction.

        A lost connection is retried until the database is back, for up to the kind's lease TTL
        (``_outlast_outage``). If an earlier try did commit before its connection dropped, the retry finds
        the lease gone (``LeaseLost``) and changes nothing.
        """
        return await self._outlast_outage(lease, kind, lambda: self._transition_once(lease, kind, apply))

    async def _outlast_outage(
        self, lease: jobs.Lease, kind: EffectKind, write: Callable[[], Awaitable[jobs.Reached]]
    ) -> jobs.Reached:
        # The slice's work is done: leaving its outcome to lease expiry would re-run a job, or park it by
        # its orphan policy, that only failed to say it finished — a failover is not an orphan. So the
        # write waits out a restart or a standby's promotion, up to the lease TTL (past it the lease may be
        # rescued anyway, and the fence refuses the late write).
        def retrying(exc: LedgerUnavailable, delay: float) -> None:
            log.warning(
                "worker.transition_retry", extra={"job_id": lease.job_id, "delay": delay, "error": str(exc)}
            )

        return await db.retry_while_unavailable(write, within=kind.lease_ttl, on_retry=retrying)

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


def _ended(reached: jobs.Reached, *, requeued: SliceOutcome) -> SliceOutcome:
    # Back to pending is the outcome the caller asked for; anything else (a cancel that won, a poison
    # park) is the state the job reached instead.
    return requeued if reached.state == JobState.PENDING else SliceOutcome(reached.state)


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

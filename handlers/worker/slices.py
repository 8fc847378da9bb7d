"""How a handler's slice ends: its task awaited under the kind's ``max_slice``, and what its end means.

A slice that overruns is cancelled; one that ignores the cancellation too is abandoned (its writes
refused, its lease left to expire) so that it frees the slot.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import logging
from typing import Any

from ..context import EffectContext
from ..effect_kind import EffectKind
from ..errors import TerminalError, TransientError
from ..event import Event
from ..outcomes import HAND_BACK

log = logging.getLogger("effectgate.worker")

# How long a step that ignored its cancellation may keep the slot before it is abandoned; never longer
# than the lease TTL, since past that the reconciler may hand the job to someone else anyway.
ABANDON_GRACE = 5.0


class Ended(enum.Enum):
    """How the handler's task ended, before anything is recorded."""

    RETURNED = enum.auto()
    HANDED_BACK = enum.auto()
    ERROR = enum.auto()
    ABANDONED = enum.auto()


# What the handler side called a hand-back before HAND_BACK. Returned now, it would read as success and
# leave the rest of the work undone, so it fails the job with a message saying what to return instead.
_OLD_HAND_BACK = "budget"


async def call(kind: EffectKind, ctx: EffectContext, event: Event) -> Any:
    return await kind.fn(ctx, event)


async def await_slice(
    ctx: EffectContext, kind: EffectKind, handler: asyncio.Task[Any]
) -> tuple[Ended, BaseException | None]:
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
        handler.add_done_callback(functools.partial(log_settled, ctx.job_id))
        return Ended.ABANDONED, None
    outcome, exc = _outcome(handler)
    if outcome is Ended.RETURNED or (outcome is Ended.ERROR and isinstance(exc, asyncio.CancelledError)):
        # A return after the deadline's cancellation is not evidence the work was done.
        return Ended.ERROR, TransientError(
            f"slice exceeded max_slice ({kind.max_slice:g} s) and was cancelled"
        )
    return outcome, exc


def _outcome(handler: asyncio.Task[Any]) -> tuple[Ended, BaseException | None]:
    if handler.cancelled():
        return Ended.ERROR, asyncio.CancelledError()
    exc = handler.exception()
    if exc is not None:
        return Ended.ERROR, exc
    result = handler.result()
    if result is HAND_BACK:
        return Ended.HANDED_BACK, None
    if isinstance(result, str) and result == _OLD_HAND_BACK:
        return Ended.ERROR, TerminalError(
            'the handler returned "budget": return effectgate.HAND_BACK to hand the rest of the work back'
        )
    return Ended.RETURNED, None


def log_settled(job_id: int, task: asyncio.Task[Any]) -> None:
    if task.cancelled():
        outcome, error = "cancelled", None
    else:
        exc = task.exception()
        outcome, error = ("error", f"{type(exc).__name__}: {exc}") if exc else ("returned", None)
    log.warning("worker.abandoned_step_settled", extra={"job_id": job_id, "outcome": outcome, "error": error})

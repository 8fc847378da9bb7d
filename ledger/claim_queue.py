"""The requests waiting for a claim batch, and the rule that takes the next batch from them.

A batch is as fair as its taking rule: each key waiting gets into it once before any key gets a second round,
a key's claims keep their arrival order, and a tenant whose routed call is still going waits its turn. The
batcher that queues the requests, writes the batches and answers them is ``ledger.claim_batcher``.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from .claims import ClaimOutcome, Delivery, EffectRequest


@dataclass(slots=True)
class WaitingClaim:
    """One request's deliveries waiting for a batch, and the future that answers it."""

    items: Sequence[tuple[Delivery, Sequence[EffectRequest]]]
    keys: frozenset[tuple[str, str]]
    future: asyncio.Future[list[list[ClaimOutcome]]]
    tenants: frozenset[str] = frozenset()
    timer: asyncio.TimerHandle | None = None
    # Taken into a batch: from then on only the batch's own outcome answers it.
    taken: bool = False
    # Answered ClaimTimeout while queued; dropped from the queue when a batch next looks at it.
    expired: bool = False

    def answer(self, result: list[list[ClaimOutcome]] | BaseException) -> None:
        if self.future.done():  # the request gave up waiting (its task was cancelled)
            return
        if isinstance(result, BaseException):
            self.future.set_exception(result)
        else:
            self.future.set_result(result)


def take_batch(
    queue: deque[WaitingClaim], *, max_batch: int, max_rounds: int, busy: AbstractSet[str]
) -> tuple[list[WaitingClaim], int]:
    """The next batch, taken off the front of ``queue``: every request whose keys are new to the batch first, then
    repeats of its keys in the room left, each key at most ``max_rounds`` statements deep, at most ``max_batch``
    requests in all; a request of a ``busy`` tenant, or one behind a passed-over request that shares a key with
    it, stays queued, in its place. Expired requests are dropped from the queue on the way; the second value
    says how many."""
    dropped = 0
    first: list[WaitingClaim] = []  # requests whose keys are new to the batch: its first statement
    repeats: list[WaitingClaim] = []  # passed over, in arrival order
    in_batch: set[tuple[str, str]] = set()
    # Keys of every request passed over: a request behind one that waits, sharing a key with it, must not
    # overtake it. The whole queue is looked at (it is bounded), not a window of it: a window full of one
    # replayed key was how unrelated deliveries came to wait behind a flood.
    blocked: set[tuple[str, str]] = set()
    while queue and len(first) < max_batch:
        waiting = queue.popleft()
        if waiting.expired:
            dropped += 1
            continue
        if (
            waiting.keys.isdisjoint(in_batch)
            and waiting.keys.isdisjoint(blocked)
            and waiting.tenants.isdisjoint(busy)
        ):
            first.append(waiting)
            in_batch |= waiting.keys
        else:
            repeats.append(waiting)
            blocked |= waiting.keys
    # Repeats fill the room left, in arrival order, each key at most max_rounds statements deep. Every
    # request taken above that shares a key with one passed over arrived before it (after it, the key was
    # blocked), so the n-th claim of a key in the batch is still its n-th in arrival order.
    batch = first
    depth = dict.fromkeys(in_batch, 1)
    blocked.clear()
    later: list[WaitingClaim] = []
    for waiting in repeats:
        if (
            len(batch) < max_batch
            and waiting.tenants.isdisjoint(busy)
            and waiting.keys.isdisjoint(blocked)
            and all(depth.get(key, 0) < max_rounds for key in waiting.keys)
        ):
            batch.append(waiting)
            for key in waiting.keys:
                depth[key] = depth.get(key, 0) + 1
        else:
            later.append(waiting)
            blocked |= waiting.keys
    queue.extendleft(reversed(later))
    for waiting in batch:
        waiting.taken = True
        if waiting.timer is not None:
            waiting.timer.cancel()
    return batch, dropped

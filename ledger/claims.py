"""Claiming effects: the atomic step before anything is performed.

``claim_delivery`` takes one verified delivery and the effects its handlers asked for, and in one
transaction claims each effect by (tenant, effect key): new → claim + job (``Accepted``); the same
payload again → counted (``Duplicate``); a different payload under a held key → recorded
(``Rejected``). Nothing is acknowledged before this transaction commits.

``ClaimBatcher`` is group commit for a gateway process: the claims of concurrent deliveries are written
by one statement in one transaction, and each request is answered after that commit.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import psycopg

from .db import Conn, Pool, translate_errors
from .errors import DeliveryRefused, LedgerError
from .fingerprints import canonical_json
from .queries import Q
from .vocabulary import DeliveryOutcome


@dataclass(frozen=True, slots=True)
class EffectRequest:
    """One effect a delivery asks for: which handler, under which key, with what limits."""

    effect_key: str
    handler: str
    max_attempts: int
    orphan_policy: str
    lock_key: str | None = None
    # The fingerprint of the fields this effect says make "the same request"; None: the delivery's,
    # of the whole payload.
    fingerprint: str | None = None


@dataclass(frozen=True, slots=True)
class Delivery:
    """A verified delivery as the ledger records it."""

    request_id: str
    tenant: str
    source: str
    event_id: str
    event_type: str
    payload: Any
    fingerprint: str
    secret_index: int | None = None
    # The canonical JSON the fingerprint was taken over, if the caller kept it: sent as the payload as is.
    payload_text: str | None = None


@dataclass(frozen=True, slots=True)
class Accepted:
    """A new claim: the effect will run, as job ``job_id``."""

    effect_key: str
    handler: str
    effect_id: int
    job_id: int
    outcome: Literal[DeliveryOutcome.ACCEPTED] = DeliveryOutcome.ACCEPTED


@dataclass(frozen=True, slots=True)
class Duplicate:
    """The same event again: counted, not run again."""

    effect_key: str
    handler: str
    effect_id: int
    delivery_count: int
    outcome: Literal[DeliveryOutcome.DUPLICATE] = DeliveryOutcome.DUPLICATE


@dataclass(frozen=True, slots=True)
class Rejected:
    """A different payload reusing a held key: recorded, never run."""

    effect_key: str
    handler: str
    effect_id: int
    held_fingerprint: str
    outcome: Literal[DeliveryOutcome.REJECTED] = DeliveryOutcome.REJECTED


ClaimOutcome = Accepted | Duplicate | Rejected


async def claim_delivery(
    conn: Conn,
    delivery: Delivery,
    effects: Sequence[EffectRequest],
    *,
    now: datetime | None = None,
) -> list[ClaimOutcome]:
    """Claim every effect of one delivery atomically; returns one outcome per effect, in input order.

    A delivery that matched no handler is recorded as ``unmatched`` and returns ``[]``.
    """
    [outcomes] = await claim_deliveries(conn, [(delivery, effects)], now=now)
    return outcomes


async def claim_deliveries(
    conn: Conn,
    items: Sequence[tuple[Delivery, Sequence[EffectRequest]]],
    *,
    now: datetime | None = None,
) -> list[list[ClaimOutcome]]:
    """Claim the effects of several deliveries in one transaction, with one statement for all of them.

    Claims resolve as if the deliveries ran one after another in the given order: the first claim of a
    key is accepted, the same payload later is a duplicate, another payload is rejected — also when
    one key comes several times here. Returns, per delivery, one outcome per effect in input order.
    """
    rounds = _rounds(items)
    if len(rounds) == 1 and not conn.info.transaction_status:
        # One statement on an autocommit connection is its own transaction: no BEGIN/COMMIT round trip.
        rows = await _claim_round(conn, items, rounds[0], now)
    else:
        rows = []
        async with conn.transaction():
            for entries in rounds:
                rows.extend(await _claim_round(conn, items, entries, now))
    results: list[list[ClaimOutcome | None]] = [[None] * len(effects) for _, effects in items]
    for (d, e), row in rows:
        eff = items[d][1][e]
        key, handler = eff.effect_key, eff.handler
        outcome: ClaimOutcome
        if row["outcome"] == DeliveryOutcome.ACCEPTED:
            outcome = Accepted(key, handler, row["effect_id"], row["job_id"])
        elif row["outcome"] == DeliveryOutcome.DUPLICATE:
            outcome = Duplicate(key, handler, row["effect_id"], row["delivery_count"])
        else:
            outcome = Rejected(key, handler, row["effect_id"], row["held_fingerprint"])
        results[d][e] = outcome
    return [[o for o in per_delivery if o is not None] for per_delivery in results]


# One entry of a claim statement: (delivery index, effect index or -1 for an unmatched delivery).
_Entry = tuple[int, int]


def _rounds(items: Sequence[tuple[Delivery, Sequence[EffectRequest]]]) -> list[list[_Entry]]:
    """Split the entries into statements in which every (tenant, key) appears at most once.

    ON CONFLICT DO UPDATE may touch a row once per statement, and a later claim of a key must see the
    earlier one's row, so the n-th claim of a key goes to the n-th statement; they run in order in one
    transaction. Later rounds only touch keys the first round already locked: no new lock order.
    """
    rounds: list[list[_Entry]] = [[]]
    seen: dict[tuple[str, str], int] = {}
    for d, (delivery, effects) in enumerate(items):
        if not effects:
            rounds[0].append((d, -1))
            continue
        for e, effect in enumerate(effects):
            key = (delivery.tenant, effect.effect_key)
            n = seen.get(key, -1) + 1
            seen[key] = n
            if n == len(rounds):
                rounds.append([])
            rounds[n].append((d, e))
    return rounds


async def _claim_round(
    conn: Conn,
    items: Sequence[tuple[Delivery, Sequence[EffectRequest]]],
    entries: list[_Entry],
    now: datetime | None,
) -> list[tuple[_Entry, Any]]:
    columns: dict[str, list[Any]] = {name: [] for name in _COLUMNS}
    payloads: list[str] = []
    payload_ix: dict[int, int] = {}
    for n, (d, e) in enumerate(entries):
        delivery, effects = items[d]
        if e < 0:
            # A delivery no handler asked for keeps its payload too (for the payload window), so it can be
            # replayed once a handler exists.
            effect_key = handler = orphan_policy = lock_key = None
            max_attempts = None
            fingerprint = delivery.fingerprint
        else:
            effect = effects[e]
            effect_key, handler = effect.effect_key, effect.handler
            max_attempts, orphan_policy, lock_key = effect.max_attempts, effect.orphan_policy, effect.lock_key
            # The effect's own fingerprint fields, when it names some; else the whole payload's.
            fingerprint = effect.fingerprint or delivery.fingerprint
        ix = payload_ix.get(d)
        if ix is None:
            # Sent once per delivery however many effects it has; the canonical text the fingerprint
            # was taken over, when the caller kept it, so the payload is not serialised again.
            payloads.append(delivery.payload_text or canonical_json(delivery.payload).decode())
            ix = payload_ix[d] = len(payloads)
        for name, value in (
            ("ord", n),
            ("request_id", delivery.request_id),
            ("tenant", delivery.tenant),
            ("effect_key", effect_key),
            ("source", delivery.source),
            ("handler", handler),
            ("event_id", delivery.event_id),
            ("event_type", delivery.event_type),
            ("fingerprint", fingerprint),
            ("payload_ix", ix),
            ("max_attempts", max_attempts),
            ("orphan_policy", orphan_policy),
            ("lock_key", lock_key),
            ("secret_index", delivery.secret_index),
        ):
            columns[name].append(value)
    params: dict[str, Any] = {**columns, "payloads": payloads, "now": now}
    rows = await (await conn.execute(Q["effect_claim_batch"], params)).fetchall()
    return [(entries[row["ord"]], row) for row in rows]


_COLUMNS = (
    "ord",
    "request_id",
    "tenant",
    "effect_key",
    "source",
    "handler",
    "event_id",
    "event_type",
    "fingerprint",
    "payload_ix",
    "max_attempts",
    "orphan_policy",
    "lock_key",
    "secret_index",
)


DEFAULT_MAX_BATCH = 64
# One batch in flight per process: measured against 2 (serve --workers 2, 64 connections, ABBA order on a loaded
# machine) it gave 1,900 and 2,087 deliveries/s against 1,423 and 1,324 — fewer, larger batches cost Postgres
# less per claim; with one process the two were even.
DEFAULT_MAX_IN_FLIGHT = 1


@dataclass(slots=True)
class _Waiting:
    items: Sequence[tuple[Delivery, Sequence[EffectRequest]]]
    keys: frozenset[tuple[str, str]]
    future: asyncio.Future[list[list[ClaimOutcome]]]

    def answer(self, result: list[list[ClaimOutcome]] | BaseException) -> None:
        if self.future.done():  # the request gave up waiting (its task was cancelled)
            return
        if isinstance(result, BaseException):
            self.future.set_exception(result)
        else:
            self.future.set_result(result)


class ClaimBatcher:
    """Group commit for one process: the claims of concurrent deliveries share one statement.

    ``claim(items)`` queues one request's deliveries and returns their outcomes once the batch they were
    written in has committed. A batch takes whatever queued while earlier batches were in flight, up to
    ``max_batch`` requests, with at most ``max_in_flight`` batches at once; an idle batcher sends a lone
    request at once, without waiting for company. A request sharing a key with an earlier one still
    queued waits for the next batch, so claims of one key resolve in arrival order.

    Failures stay with their owner: a batch whose statement Postgres refuses for one delivery's data is
    split until that delivery stands alone (``DeliveryRefused``, or ``LedgerError`` for a constraint),
    and the others are claimed without it. A batch lost with its connection fails every request in it
    with ``LedgerUnavailable``; it was one transaction, so nothing of it is half-written.
    """

    def __init__(
        self, pool: Pool, *, max_batch: int = DEFAULT_MAX_BATCH, max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    ) -> None:
        if max_batch < 1 or max_in_flight < 1:
            raise ValueError("claim batcher needs max_batch >= 1 and max_in_flight >= 1")
        self._pool = pool
        self._max_batch = max_batch
        self._max_in_flight = max_in_flight
        self._queue: deque[_Waiting] = deque()
        self._flushers: set[asyncio.Task[None]] = set()
        self._active = 0

    async def claim(
        self, items: Sequence[tuple[Delivery, Sequence[EffectRequest]]]
    ) -> list[list[ClaimOutcome]]:
        """Claim one request's deliveries in the next batch; as ``claim_deliveries``, after the commit."""
        keys = frozenset((d.tenant, e.effect_key) for d, effects in items for e in effects)
        waiting = _Waiting(items, keys, asyncio.get_running_loop().create_future())
        self._queue.append(waiting)
        if self._active < self._max_in_flight:
            # Counted here and uncounted in the flusher's last synchronous step (not by a done callback,
            # which runs a loop iteration later): a request arriving in between would find no flusher.
            self._active += 1
            task = asyncio.create_task(self._flush())
            self._flushers.add(task)
            task.add_done_callback(self._flushers.discard)
        return await waiting.future

    async def close(self) -> None:
        """Wait for the batches in flight and those queued to be written."""
        while self._flushers:
            await asyncio.gather(*self._flushers, return_exceptions=True)

    def _take(self) -> list[_Waiting]:
        batch: list[_Waiting] = []
        later: list[_Waiting] = []
        # Keys of the batch and of every request left for later: a request behind a waiting one with a
        # shared key must not overtake it.
        blocked: set[tuple[str, str]] = set()
        scanned = 0
        while self._queue and len(batch) < self._max_batch and scanned < 4 * self._max_batch:
            waiting = self._queue.popleft()
            scanned += 1
            if waiting.keys.isdisjoint(blocked):
                batch.append(waiting)
            else:
                later.append(waiting)
            blocked |= waiting.keys
        self._queue.extendleft(reversed(later))
        return batch

    async def _flush(self) -> None:
        try:
            while self._queue:
                batch = self._take()
                try:
                    await self._write(batch)
                except BaseException as exc:
                    for waiting in batch:
                        waiting.answer(exc)
                    raise
        finally:
            self._active -= 1

    async def _write(self, batch: list[_Waiting]) -> None:
        items = [item for waiting in batch for item in waiting.items]
        refused: Exception | None = None
        try:
            async with translate_errors():
                try:
                    async with self._pool.connection() as conn:
                        results = await claim_deliveries(conn, items)
                except (psycopg.DataError, psycopg.IntegrityError, UnicodeEncodeError) as exc:
                    # Refused for what some delivery holds, not for the database's state: find which.
                    refused = exc
        except LedgerError as exc:
            for waiting in batch:
                waiting.answer(exc)
            return
        if refused is not None:
            if len(batch) > 1:
                half = len(batch) // 2
                await self._write(batch[:half])
                await self._write(batch[half:])
            elif isinstance(refused, psycopg.IntegrityError):
                batch[0].answer(LedgerError(f"ledger database error: {type(refused).__name__}: {refused}"))
            else:
                batch[0].answer(DeliveryRefused(f"the ledger cannot store this delivery: {refused}"))
            return
        start = 0
        for waiting in batch:
            end = start + len(waiting.items)
            waiting.answer(results[start:end])
            start = end


async def record_signature_failure(
    conn: Conn,
    *,
    source: str,
    reason: str,
    size: int,
    body_sha256: str,
    detail: str,
    now: datetime | None = None,
) -> None:
    """Count one failed verification in its (source, reason, minute) bucket; the body is never stored."""
    await conn.execute(
        Q["signature_failure_count"],
        {
            "source": source,
            "reason": reason,
            "size": size,
            "body_sha256": body_sha256,
            "detail": detail[:500],
            "now": now,
        },
    )

"""Group commit for a gateway process: the claims of concurrent deliveries share one statement and one commit,
each request answered after it — bounded in how many wait and for how long, and with every failure answered
to the request it belongs to (see ``ClaimBatcher``; ADR 0006 and 0008). The requests waiting and the rule that
takes the next batch from them are in ``claim_queue``; whom a failure belongs to is asked of ``error_kinds``.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Sequence

import psycopg

from .claim_queue import WaitingClaim, take_batch
from .claims import Accepted, ClaimOutcome, Delivery, EffectRequest, claim_deliveries, notify_kinds
from .cluster.topology import SINGLE_NODE, Topology
from .error_kinds import error_kind
from .errors import ClaimOverloaded, ClaimTimeout, DeliveryRefused, LedgerError, LedgerUnavailable
from .handle import Ledger
from .queries import Q

DEFAULT_MAX_BATCH = 64
# One batch in flight per process: measured against 2 (serve --workers 2, 64 connections, ABBA order on a loaded
# machine) it gave 1,900 and 2,087 deliveries/s against 1,423 and 1,324 — fewer, larger batches cost Postgres
# less per claim; with one process the two were even.
DEFAULT_MAX_IN_FLIGHT = 1
# Requests waiting for a batch, per process. Past it claim() refuses at once (ClaimOverloaded, 503 overloaded):
# a queue that can only grow answers nobody in time. Room for 500 connections replaying one delivery and the
# genuine traffic beside them; a queued request holds its parsed payload (at most max_body_bytes).
DEFAULT_MAX_QUEUE = 1024
# Seconds a request may wait in the queue before it is taken into a batch. Only a request not yet taken is
# answered ClaimTimeout: one in a batch waits for that batch's commit or failure (bounded by the pool timeout
# and statement_timeout), so a 503 is never sent for a claim that then commits.
DEFAULT_DEADLINE = 2.0
# Statements one batch may spend on repeats of one key (the n-th claim of a key is the n-th statement of the
# transaction): a replayed delivery drains this many copies per batch, and never crowds other keys out. Each
# round is one more round trip for the whole batch. Measured with `python -m tests.bench.claim_flood --seconds 6
# --rounds N` (64 genuine clients beside 500 replaying one delivery, rounds 1, 2, 8 interleaved, two runs each,
# shared 2-core machine): genuine p99 132/137, 144/127 and 127/192 ms against 77-108 ms quiet; the flood drained
# 223-232, 325-339 and 824-1,094 copies in 6 s. Within this machine's noise; 2 keeps a batch at two statements.
DEFAULT_MAX_ROUNDS = 2
# The claim pool's session limits (seconds). A batch waits on a row lock only while another transaction holds
# that key (another replica's batch: milliseconds); past lock_timeout the requests needing the key get
# ClaimTimeout and the rest of the batch is written. With one batch in flight per process, this is also how
# long one held key can stall the process's claims. statement_timeout bounds the rest of the statement.
DEFAULT_LOCK_TIMEOUT = 0.5
DEFAULT_STATEMENT_TIMEOUT = 5.0
# On a ledger claimed per tenant (Citus), seconds a batch waits for its slowest tenant's call before it lets that
# call go on alone and starts the next batch, and how many such calls may be left going at once. A tenant whose
# shard is being moved has its claim wait on the worker node for the move's lock (block_writes: the whole copy of
# the shard; logical: the switch-over), where the claim pool's lock_timeout does not reach; waited for, that one
# call held every other tenant's claims in the queue until their deadline (issue 41: 102 503s a rebalance).
# A routed claim takes milliseconds; a call past this is waiting on something. Its tenant's later claims stay
# queued (a key's claims resolve in arrival order), the others go on. Each call left going holds a connection:
# the claim pool has room for them (``ClaimBatcher.connections``).
DEFAULT_STRAGGLE_AFTER = 0.25
DEFAULT_MAX_STRAGGLING = 2

log = logging.getLogger("effectgate.ledger")


class ClaimBatcher:
    """Group commit for one process: the claims of concurrent deliveries share one statement.

    ``claim(items)`` queues one request's deliveries and returns their outcomes once the batch they were
    written in has committed. A batch takes whatever queued while earlier batches were in flight, up to
    ``max_batch`` requests, with at most ``max_in_flight`` batches at once; an idle batcher sends a lone
    request at once, without waiting for company. Every distinct key waiting gets into the next batch first;
    repeats of a key already in it fill the room left, each key at most ``max_rounds`` deep, so a replayed
    delivery never holds back unrelated ones. Claims of one key resolve in arrival order.

    Bounded: past ``max_queue`` waiting requests ``claim`` raises ``ClaimOverloaded`` at once; a request
    not taken into a batch within ``deadline`` seconds gets ``ClaimTimeout`` (a request already in a batch
    waits for that batch's answer, so a claim that commits is never reported failed).

    Failures stay with their owner. A batch whose statement Postgres refuses for one row's values
    (SQLSTATE classes 22, 23, 54) is split until that request stands alone (``DeliveryRefused``); one that
    waited past ``lock_timeout`` answers the requests whose keys another transaction holds with
    ``ClaimTimeout`` and writes the rest. A batch lost with its connection or server fails every request in
    it with ``LedgerUnavailable``; it was one transaction, so nothing of it is half-written. The flusher
    survives anything: whatever escapes answers the requests it held, and the next batch starts.
    """

    def __init__(
        self,
        ledger: Ledger,
        *,
        max_batch: int = DEFAULT_MAX_BATCH,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        max_queue: int = DEFAULT_MAX_QUEUE,
        deadline: float = DEFAULT_DEADLINE,
        max_rounds: int = DEFAULT_MAX_ROUNDS,
        straggle_after: float = DEFAULT_STRAGGLE_AFTER,
        max_straggling: int = DEFAULT_MAX_STRAGGLING,
    ) -> None:
        if min(max_batch, max_in_flight, max_queue, max_rounds) < 1 or not deadline > 0:
            raise ValueError(
                "claim batcher needs max_batch, max_in_flight, max_queue, max_rounds >= 1 and deadline > 0"
            )
        if max_straggling < 0 or not straggle_after > 0:
            raise ValueError("claim batcher needs max_straggling >= 0 and straggle_after > 0")
        self._ledger = ledger
        # The claim path's pool: its lock and statement timeouts bound claims and nothing else.
        self._pool = ledger.claim_pool
        self._max_batch = max_batch
        self._max_in_flight = max_in_flight
        self._max_queue = max_queue
        self._deadline = deadline
        self._max_rounds = max_rounds
        self._queue: deque[WaitingClaim] = deque()
        self._expired = 0  # expired requests still in the queue: they hold no room
        self._flushers: set[asyncio.Task[None]] = set()
        self._active = 0
        self._straggle_after = straggle_after
        self._max_straggling = max_straggling
        # Tenants with a routed call left going (see DEFAULT_STRAGGLE_AFTER): their requests wait in the queue.
        self._busy: set[str] = set()
        self._stragglers: set[asyncio.Task[None]] = set()

    @staticmethod
    def connections(
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT, max_straggling: int = DEFAULT_MAX_STRAGGLING
    ) -> int:
        """The claim pool's size for a batcher of these settings: a connection per batch in flight, per call left
        going, and one for the probe that finds a locked key."""
        return max_in_flight + max_straggling + 1

    def check_room(self) -> None:
        """Raise ``ClaimOverloaded`` when the queue is full, as ``claim`` would: ingress asks before it reads
        a request's body, so a request the claim would refuse costs no read, verify or plan."""
        if len(self._queue) - self._expired >= self._max_queue:
            raise ClaimOverloaded(
                f"{self._max_queue} claims are waiting in this process already; nothing was queued"
            )

    async def claim(
        self, items: Sequence[tuple[Delivery, Sequence[EffectRequest]]]
    ) -> list[list[ClaimOutcome]]:
        """Claim one request's deliveries in the next batch; as ``claim_deliveries``, after the commit.

        Raises ``ClaimOverloaded`` at once when the queue is full, ``ClaimTimeout`` when the claim was not
        written in time, ``DeliveryRefused`` when Postgres refused this request's data, and
        ``LedgerUnavailable`` when the database was lost; in every case nothing of it was written.
        """
        self.check_room()
        keys = frozenset((d.tenant, e.effect_key) for d, effects in items for e in effects)
        loop = asyncio.get_running_loop()
        tenants = frozenset(d.tenant for d, _ in items)
        waiting = WaitingClaim(items, keys, loop.create_future(), tenants)
        waiting.timer = loop.call_later(self._deadline, self._expire, waiting)
        self._queue.append(waiting)
        self._kick()
        return await waiting.future

    def _kick(self) -> None:
        if self._active < self._max_in_flight:
            # Counted here and uncounted in the flusher's last synchronous step (not by a done callback,
            # which runs a loop iteration later): a request arriving in between would find no flusher.
            self._active += 1
            task = asyncio.create_task(self._flush())
            self._flushers.add(task)
            task.add_done_callback(self._flushers.discard)

    async def close(self) -> None:
        """Wait for the batches in flight and those queued to be written."""
        while self._flushers or self._stragglers:
            await asyncio.gather(*self._flushers, *self._stragglers, return_exceptions=True)

    def _expire(self, waiting: WaitingClaim) -> None:
        if waiting.taken or waiting.future.done():
            return
        waiting.expired = True
        self._expired += 1
        waiting.future.set_exception(
            ClaimTimeout(
                "deadline",
                f"the claim waited {self._deadline:g}s for a batch without being written; nothing was written",
            )
        )

    def _take(self, max_rounds: int) -> list[WaitingClaim]:
        batch, dropped = take_batch(
            self._queue, max_batch=self._max_batch, max_rounds=max_rounds, busy=self._busy
        )
        self._expired -= dropped
        return batch

    async def _flush(self) -> None:
        try:
            while self._queue:
                batch: list[WaitingClaim] = []
                try:
                    # Routed by tenant (Citus): a key at most once a batch, so every batch is one routed call per
                    # tenant; a key's repeat waits for the next batch rather than send the whole batch through
                    # the coordinator in a multi-statement transaction (a two-phase commit, even for one tenant).
                    rounds = 1 if (await self.topology()).claims_routed else self._max_rounds
                    batch = self._take(rounds)
                    if not batch:
                        # Whatever waits is a busy tenant's: the end of its call starts the next flusher.
                        break
                    await self._write_batch(batch)
                except Exception as exc:
                    # _write answers every failure it knows; this is for the one it does not (a bug): the
                    # requests it held are answered, and the loop goes on to the next batch.
                    log.exception("claims.batch_failed", extra={"requests": len(batch)})
                    for waiting in batch:
                        failure = LedgerError("the claim could not be written; nothing was acknowledged")
                        waiting.answer(_cause(failure, exc))
                except BaseException:
                    # Cancelled (the process is stopping): nobody will write what it holds or what waits.
                    for waiting in [*batch, *self._queue]:
                        waiting.answer(
                            LedgerUnavailable("the gateway is stopping; the claim was not written")
                        )
                    self._queue.clear()
                    self._expired = 0
                    raise
        finally:
            self._active -= 1

    async def topology(self) -> Topology:
        """How claims route (the ledger handle's answer; batches are claimed per tenant where
        ``claims_routed``). A failed question is asked again by the next batch, which meanwhile takes the
        statement through the coordinator, correct everywhere."""
        try:
            return await self._ledger.topology()
        except Exception as exc:
            log.warning("claims.routing_unknown", extra={"error": type(exc).__name__})
            return SINGLE_NODE

    async def _write(self, batch: list[WaitingClaim], *, woken: set[str] | None = None) -> None:
        routes = await self.topology()
        if routes.claims_routed and woken is None:
            groups = _by_tenant(batch)
            if len(groups) > 1:
                # One routed transaction per tenant, side by side; each answers and fails on its own, so a
                # tenant's refusal never makes another's committed claims look undone. One wake-up for all of
                # them afterwards, not one per tenant: 32 tenants' deliveries cost 33 statements, not 64.
                kinds: set[str] = set()
                await asyncio.gather(*(self._write(group, woken=kinds) for group in groups))
                if kinds:
                    await self._wake(kinds)
                return
        items = [item for waiting in batch for item in waiting.items]
        try:
            async with self._pool.connection() as conn:
                results = await claim_deliveries(conn, items, topology=routes, wake=woken is None)
        except Exception as exc:
            await self._failed(batch, exc)
            return
        if woken is not None:
            woken.update(o.handler for per_item in results for o in per_item if isinstance(o, Accepted))
        start = 0
        for waiting in batch:
            end = start + len(waiting.items)
            waiting.answer(results[start:end])
            start = end

    async def _write_batch(self, batch: list[WaitingClaim]) -> None:
        # A batch as the flusher sends it: per tenant, a slow tenant's call is left going (DEFAULT_STRAGGLE_AFTER).
        # Splits after a failure go through _write, which waits for all its calls.
        if not (self._max_straggling and (await self.topology()).claims_routed):
            await self._write(batch)
            return
        groups = _by_tenant(batch)
        woken = [set[str]() for _ in groups]
        calls = [
            # A lone tenant's call carries its own wake-up, as _write sends it.
            asyncio.create_task(self._write(g) if len(groups) == 1 else self._write(g, woken=k))
            for g, k in zip(groups, woken, strict=True)
        ]
        room = self._max_straggling - len(self._stragglers)
        done, slow = await asyncio.wait(calls, timeout=self._straggle_after if room > 0 else None)
        if len(slow) > room:
            # No room to leave them going: wait, as a batch always did.
            await asyncio.wait(slow)
            done, slow = set(calls), set()
        for call, group, k in zip(calls, groups, woken, strict=True):
            if call in slow:
                self._straggle(call, group, k)
        kinds = set[str]().union(*(k for c, k in zip(calls, woken, strict=True) if c in done))
        if kinds:
            await self._wake(kinds)
        for call in done:
            call.result()  # a bug's exception: the flusher answers the batch's requests still waiting

    def _straggle(self, call: asyncio.Task[None], group: list[WaitingClaim], kinds: set[str]) -> None:
        # A tenant's call left going (its shard moving): the next batch goes on without that tenant, whose
        # requests stay queued behind it, so its claims still resolve in arrival order.
        tenants = {t for waiting in group for t in waiting.tenants}
        self._busy |= tenants
        log.info("claims.tenant_waiting", extra={"tenants": len(tenants), "requests": len(group)})

        async def finish() -> None:
            try:
                await call
                if kinds:
                    await self._wake(kinds)
            except Exception as exc:  # a bug, as in _flush: answer what the call held
                log.exception("claims.batch_failed", extra={"requests": len(group)})
                for waiting in group:
                    waiting.answer(
                        _cause(LedgerError("the claim could not be written; nothing was acknowledged"), exc)
                    )
            finally:
                self._busy -= tenants
                if self._queue:
                    self._kick()

        task = asyncio.create_task(finish())
        self._stragglers.add(task)
        task.add_done_callback(self._stragglers.discard)

    async def _wake(self, kinds: set[str]) -> None:
        # The claims have committed: a wake-up lost now costs the workers a poll interval, never a claim.
        try:
            async with self._pool.connection() as conn:
                await notify_kinds(conn, sorted(kinds))
        except Exception as exc:
            log.warning("claims.wake_failed", extra={"kinds": sorted(kinds), "error": type(exc).__name__})

    async def _failed(self, batch: list[WaitingClaim], exc: Exception) -> None:
        kind = error_kind(exc)
        state = getattr(exc, "sqlstate", None)
        if kind == "connection" or kind == "statement_timeout":
            # The database's state, not a row's: splitting would only fail again, slower.
            log.warning(
                "claims.batch_unavailable",
                extra={"sqlstate": state, "error": type(exc).__name__, "requests": len(batch)},
            )

            def failure() -> LedgerError:
                if kind == "statement_timeout":
                    return ClaimTimeout(
                        "statement_timeout",
                        "the claim statement ran past statement_timeout; nothing was written",
                    )
                return LedgerUnavailable("the ledger database is unavailable; nothing was written")

            self._answer_all(batch, failure, exc)
            return
        if len(batch) == 1:
            [waiting] = batch
            if kind == "row":
                log.warning("claims.delivery_refused", extra={"sqlstate": state, "error": type(exc).__name__})
                waiting.answer(_cause(DeliveryRefused(_refusal(state), sqlstate=state), exc))
            elif kind == "lock_timeout":
                log.warning("claims.lock_timeout", extra={"sqlstate": state, "keys": len(waiting.keys)})
                waiting.answer(_cause(ClaimTimeout("lock_timeout", _LOCKED), exc))
            else:
                log.error("claims.claim_failed", exc_info=exc, extra={"sqlstate": state})
                waiting.answer(
                    _cause(LedgerError("the claim could not be written; nothing was written"), exc)
                )
            return
        if kind == "lock_timeout":
            # Another transaction holds some key's row (a pass of retention, another replica's batch): find
            # which, answer the requests that need it, and write the others now, rather than halving the
            # batch and waiting lock_timeout once per level.
            locked = await self._locked_keys(batch)
            if locked:
                stuck = [w for w in batch if not w.keys.isdisjoint(locked)]
                log.warning(
                    "claims.lock_timeout",
                    extra={"sqlstate": state, "requests": len(stuck), "keys": len(locked)},
                )
                self._answer_all(stuck, lambda: ClaimTimeout("lock_timeout", _LOCKED), exc)
                rest = [w for w in batch if w.keys.isdisjoint(locked)]
                if rest:
                    await self._write(rest)
                return
        # Refused for what some request holds (or for a reason that may be one request's): find which. Halves in
        # order, so a key's claims still resolve in arrival order.
        half = len(batch) // 2
        await self._write(batch[:half])
        await self._write(batch[half:])

    async def _locked_keys(self, batch: list[WaitingClaim]) -> set[tuple[str, str]]:
        keys = sorted({key for waiting in batch for key in waiting.keys})
        try:
            async with self._pool.connection() as conn:
                cursor = await conn.execute(
                    Q["effect_keys_locked"],
                    {"tenant": [k[0] for k in keys], "effect_key": [k[1] for k in keys]},
                )
                return {(row["tenant"], row["effect_key"]) for row in await cursor.fetchall()}
        except psycopg.Error as exc:
            # The database stalled or went away while the claim waited (a failover): expected, so one line with
            # the error and no traceback; the requests are answered by the halving that follows.
            log.warning(
                "claims.lock_probe_failed",
                extra={"error": f"{type(exc).__name__}: {exc}", "sqlstate": getattr(exc, "sqlstate", None)},
            )
            return set()
        except Exception:
            log.warning("claims.lock_probe_failed", exc_info=True)  # a bug: keep its traceback
            return set()

    @staticmethod
    def _answer_all(
        batch: list[WaitingClaim], failure: Callable[[], LedgerError], cause: BaseException
    ) -> None:
        # One exception each: an instance raised in many tasks would gather every one's traceback.
        for waiting in batch:
            waiting.answer(_cause(failure(), cause))


def _by_tenant(batch: list[WaitingClaim]) -> list[list[WaitingClaim]]:
    """The batch's requests by tenant, in arrival order; a request of several tenants is a group of its own."""
    groups: dict[object, list[WaitingClaim]] = {}
    for n, waiting in enumerate(batch):
        tenants = {delivery.tenant for delivery, _ in waiting.items}
        key: object = next(iter(tenants)) if len(tenants) == 1 else n
        groups.setdefault(key, []).append(waiting)
    return list(groups.values())


_LOCKED = "another transaction held this delivery's effect key past lock_timeout; nothing was written"
_REFUSALS = {
    "22": "a value Postgres cannot store",
    "23": "a value the ledger's constraints refuse",
    "54": "a value over a database size limit (an over-long key, event type or id)",
}


def _refusal(sqlstate: str | None) -> str:
    # Our words, not the driver's: its text names indexes and internals the sender has no use for.
    what = _REFUSALS.get((sqlstate or "")[:2], "a value the driver cannot send")
    code = f" (SQLSTATE {sqlstate})" if sqlstate else ""
    return f"the ledger cannot store this delivery: {what}{code}; nothing of it was written"


def _cause(error: LedgerError, cause: BaseException) -> LedgerError:
    error.__cause__ = cause
    return error

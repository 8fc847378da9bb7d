"""The worker's finish batcher: terminal transitions of the jobs that finish together, one commit per batch."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

from effectgate.ledger import db, error_kinds, jobs
from effectgate.ledger.errors import LeaseLost, LedgerError, LedgerUnavailable
from effectgate.ledger.handle import Ledger

from ..effect_kind import EffectKind
from ..event import Transition

log = logging.getLogger("effectgate.worker")


@dataclass(slots=True)
class _Finishing:
    lease: jobs.Lease
    kind: EffectKind
    finish: jobs.Finish
    future: asyncio.Future[jobs.Reached]


class _Aborted(Exception):
    """An unguarded batch's transaction failed before its commit and was rolled back."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


class FinishBatcher:
    """Terminal transitions of the jobs that finish together, written by one statement in one commit.

    Each row is fenced by its own token: a stale one raises ``LeaseLost`` for its job alone. A kind's
    ``on_transition`` runs in the batch's transaction, each in a savepoint, so a failing hook rolls
    back its own writes and no one else's (the transition stands: a job left running is worse than a
    user row that missed its mirror, which a sweep can repair). One batch is in flight at a time; the
    next takes what queued meanwhile, so an idle worker's lone transition goes at once.
    """

    def __init__(self, ledger: Ledger, max_batch: int = 256) -> None:
        self._ledger = ledger
        self._pool = ledger.pool
        self._max_batch = max_batch
        self._queue: list[_Finishing] = []
        self.flusher: asyncio.Task[None] | None = None
        # Set by a running worker: leases the next jobs in the batch's own transaction (Worker._refill).
        self.refill: (
            Callable[
                [db.Conn, list[int], bool], contextlib.AbstractAsyncContextManager[Callable[[], None] | None]
            ]
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
        async with db.connection(self._pool) as conn:
            hooks = any(item.kind.on_transition is not None for item in batch)
            if self.refill is None and not hooks:
                # One statement on an autocommit connection is its own transaction: no BEGIN/COMMIT.
                return await jobs.finish_many(
                    conn, [item.finish for item in batch], topology=self._ledger.known_topology
                )
            if not hooks and not self._ledger.known_topology.distributed:
                # First without savepoints around the finish and the refill's fetch: four round trips fewer
                # per batch (they were a fifth of a draining worker's busy time, docs/performance.md). An
                # error then aborts the whole transaction, which rolls back before anything was answered or
                # started, and the batch is written again below with a savepoint around each statement,
                # where a row Postgres refuses is split out and a refused fetch leaves the finishes standing.
                try:
                    return await self._committed(conn, batch, guarded=False)
                except _Aborted as aborted:
                    if error_kinds.error_kind(aborted.error) == "connection":
                        raise aborted.error from None
                    log.info(
                        "worker.finish_batch_again_guarded",
                        extra={
                            "jobs": len(batch),
                            "error": f"{type(aborted.error).__name__}: {aborted.error}",
                        },
                    )
            return await self._committed(conn, batch, guarded=True)

    async def _committed(
        self, conn: db.Conn, batch: list[_Finishing], *, guarded: bool
    ) -> list[jobs.Reached | LedgerError | None]:
        """The batch written and committed, then the refill's leases started. Unguarded, an error before the
        commit is raised as ``_Aborted`` (rolled back: nothing answered, nothing started), so the caller can
        tell it from anything after."""
        # The refill holds the worker's fetch until its leases have started (its exit, after start()).
        async with contextlib.AsyncExitStack() as refilled:
            try:
                answers, start = await self._transaction(conn, batch, refilled, guarded=guarded)
            except Exception as exc:
                if guarded:
                    raise
                raise _Aborted(exc) from exc
            if conn.broken:
                # psycopg leaves a transaction block without an error when the connection died inside a
                # savepoint whose error was handled there (a hook's, the refill's fetch): nothing was committed,
                # and answering the batch as written would leave its jobs running until their leases expire,
                # and then to their orphan policy (found by tests/bench/failover.py).
                raise LedgerUnavailable("the connection was lost inside the finish batch's transaction")
            if start is not None:
                start()  # committed: the leases are ours
            return answers

    async def _transaction(
        self, conn: db.Conn, batch: list[_Finishing], refilled: contextlib.AsyncExitStack, *, guarded: bool
    ) -> tuple[list[jobs.Reached | LedgerError | None], Callable[[], None] | None]:
        start: Callable[[], None] | None = None
        async with conn.transaction():
            answers = await jobs.finish_many(
                conn, [item.finish for item in batch], topology=self._ledger.known_topology, guarded=guarded
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
                    self.refill(conn, [item.lease.job_id for item in batch], guarded)
                )
        return answers, start

"""How fast worker processes call one downstream API: at most ``max_in_flight`` calls at once (per process), at
most ``max_per_second`` started a second (per process, or for every worker of the ledger together: ``shared``),
and none started before a ``429``'s ``Retry-After`` has passed.

A worker's slots are not a rate limit: 64 slots draining a backlog of captures would call Stripe 64 times at
once, and Stripe answers ``429`` past 100 operations a second in live mode (25 in a sandbox, 25 a second for
most single endpoints). A ``429`` is retried with the same idempotency key, so nothing is charged twice, but
each costs an attempt. A ``Pace`` keeps the calls under the provider's limit instead, per ``[downstream.NAME]``.

The limit is the provider account's, not a process's. With ``shared`` (``SharedTurns``: the ledger's
``downstream_paces`` row of the name, ``ledger/paces.py``; ``pace_scope = "ledger"``, the default) every worker
process reserves its calls' starts from one schedule kept by the database's clock, so N processes together start
at most ``max_per_second`` a second, and a ``429`` one of them sees holds the others' calls back too. Without it
the schedule is this process's own (N processes may send N times the limit). ``max_in_flight`` is always per
process: a count of calls at once kept in a database would outlive a process killed mid-call.

A call waits for its turn in its job's slot, the job's lease renewed meanwhile, but never longer than
``max_wait`` (the downstream's ``timeout``): a call whose turn is further off is not sent at all and raises
``TransientError`` with ``retry_after`` set to the wait, so the job is retried when its turn would have come
and the slot goes to other work. Nothing was sent, so nothing can have happened.

Start times are reserved in order (a turn is taken before the wait, with no ``await`` between reading and
writing the schedule; shared, by one upsert of the row), so callers never start together after waiting for the
same moment. ``clock`` and ``sleep`` are parameters, so tests drive the schedule without sleeping. A shared
schedule that cannot be reached (the ledger down) refuses the call unsent, as a turn too far off does.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Protocol

from effectgate.handlers.errors import TransientError

__all__ = ["MAX_HOLD", "NO_RETRY_AFTER_HOLD", "Pace", "PaceExceeded", "SharedTurns", "check_limits"]

logger = logging.getLogger(__name__)

#: The longest a ``Retry-After`` holds a downstream's calls back, seconds: a header of hours is a provider's
#: mistake or an outage, and the job's own backoff (``retry_after`` on its error) already honours it in full.
MAX_HOLD = 60.0
#: How long a ``429`` without ``Retry-After`` holds the downstream's next calls back, seconds: Stripe sends
#: none and asks for backoff; a second lets the limiter's window move before the other slots call again.
NO_RETRY_AFTER_HOLD = 1.0


def check_limits(max_in_flight: int | None, max_per_second: float | None) -> None:
    """Raise ``ValueError`` naming the first wrong limit: ``max_in_flight`` must be ``None`` or an integer >= 1,
    ``max_per_second`` ``None`` or a finite number > 0."""
    if max_in_flight is not None and (
        isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int) or max_in_flight < 1
    ):
        raise ValueError(f"max_in_flight must be an integer >= 1, got {max_in_flight!r}")
    if max_per_second is not None and not (
        isinstance(max_per_second, int | float)
        and not isinstance(max_per_second, bool)
        and math.isfinite(max_per_second)
        and max_per_second > 0
    ):
        raise ValueError(f"max_per_second must be a number > 0, got {max_per_second!r}")


class PaceExceeded(TransientError):
    """The call's turn to be sent was further off than its downstream's ``timeout``: it was not sent."""


class SharedTurns(Protocol):
    """A schedule of turns every worker process of a ledger reads and writes (``ledger.paces.LedgerTurns``).

    Times are the schedule's own clock; what crosses this interface is seconds from now."""

    async def take(self, name: str, interval: float, max_wait: float) -> tuple[bool, float]:
        """Reserve ``name``'s next turn and move the one after ``interval`` seconds past it: ``(True, seconds
        to wait for it)``; or, when it is more than ``max_wait`` seconds away, ``(False, seconds away)`` with
        nothing reserved."""
        ...

    async def hold(self, name: str, seconds: float) -> None:
        """No turn of ``name`` starts sooner than ``seconds`` from now (a longer hold is kept)."""
        ...

    async def held(self, name: str) -> float:
        """Seconds left of ``name``'s hold (0: none)."""
        ...


class Pace:
    """The turns of one downstream's calls in this process (module docstring); ``turn()`` around each call.

    ``max_in_flight`` (calls at once) and ``max_per_second`` (calls started a second) are each ``None`` for
    no limit; ``max_wait`` bounds how long a call waits for its turn. ``hold(seconds)`` delays every call not
    yet started until that many seconds from now (what a ``429`` asks for). With ``shared`` (and a
    ``max_per_second``), the starts and holds are ``name``'s in that schedule, every worker process's together.
    """

    def __init__(
        self,
        *,
        max_in_flight: int | None = None,
        max_per_second: float | None = None,
        max_wait: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        name: str = "",
        shared: SharedTurns | None = None,
    ) -> None:
        check_limits(max_in_flight, max_per_second)
        if shared is not None and not name:
            raise ValueError("a shared pace needs the downstream's name")
        if not (isinstance(max_wait, int | float) and math.isfinite(max_wait) and max_wait >= 0):
            raise ValueError(f"max_wait must be a number of seconds >= 0, got {max_wait!r}")
        self.max_in_flight = max_in_flight
        self.max_per_second = max_per_second
        self.max_wait = float(max_wait)
        self._interval = 1.0 / max_per_second if max_per_second else 0.0
        self._slots = asyncio.Semaphore(max_in_flight) if max_in_flight else None
        self._clock = clock
        self._sleep = sleep
        #: Calls waiting for their turn now (neither sent nor refused yet).
        self.waiting = 0
        # The earliest start the next caller may reserve, and the end of a 429's hold.
        self._next = -math.inf
        self._held_until = -math.inf
        self.name = name
        # A schedule without a rate would cost a statement a call for holds alone: holds stay local then.
        self.shared = shared if max_per_second else None
        # Holds on their way to the shared schedule (``hold`` is called where no await may happen).
        self._writes: set[asyncio.Task[None]] = set()

    def __repr__(self) -> str:
        return f"Pace(max_in_flight={self.max_in_flight!r}, max_per_second={self.max_per_second!r})"

    def hold(self, seconds: float | None) -> None:
        """No call of this downstream starts sooner than ``seconds`` from now (``None``: the default hold of
        a ``429`` without ``Retry-After``); at most ``MAX_HOLD``, and never shortening a longer hold."""
        if seconds is None or not math.isfinite(seconds) or seconds < 0:
            seconds = NO_RETRY_AFTER_HOLD
        seconds = min(seconds, MAX_HOLD)
        self._held_until = max(self._held_until, self._clock() + seconds)
        if self.shared is not None:
            # This process's calls wait for it at once (above); the others' once it is written.
            write = asyncio.get_running_loop().create_task(self._share_hold(seconds))
            self._writes.add(write)
            write.add_done_callback(self._writes.discard)

    async def _share_hold(self, seconds: float) -> None:
        assert self.shared is not None
        try:
            await self.shared.hold(self.name, seconds)
        except Exception as exc:  # the hold still holds this process; the others may 429 once
            logger.warning(
                "downstream %s: the 429's hold of %.3g s was not shared: %s", self.name, seconds, exc
            )

    async def settled(self) -> None:
        """Return once every hold this pace was given is written to the shared schedule (or failed to be)."""
        while self._writes:
            await asyncio.gather(*self._writes)

    @asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        """Wait for this call's turn and hold its place among the ``max_in_flight`` until the block ends.

        Raises ``PaceExceeded`` (a ``TransientError``, ``retry_after`` = the wait) without waiting when the
        turn is more than ``max_wait`` away; the block has then not run, so nothing was sent.
        """
        started = self._clock()
        self.waiting += 1
        try:
            if self._slots is not None:
                await self._acquire_slot(started)
        except BaseException:
            self.waiting -= 1
            raise
        try:
            try:
                if self.shared is not None:
                    await self._wait_for_shared_start(started)
                else:
                    await self._wait_for_start(started)
            finally:
                self.waiting -= 1
            yield
        finally:
            if self._slots is not None:
                self._slots.release()

    async def _acquire_slot(self, started: float) -> None:
        assert self._slots is not None
        if not self._slots.locked():
            await self._slots.acquire()
            return
        try:
            await asyncio.wait_for(self._slots.acquire(), self.max_wait)
        except TimeoutError:
            raise PaceExceeded(
                f"{self.max_in_flight} calls already in flight for {self._clock() - started:.3g} s",
                retry_after=self.max_wait,
            ) from None

    async def _wait_for_start(self, started: float) -> None:
        while True:
            now = self._clock()
            at = max(now, self._next, self._held_until)
            if at - started > self.max_wait:
                # Not reserved: a refused call must not push the next one's turn further away.
                raise PaceExceeded(
                    f"the next turn to call is {at - now:.3g} s away, past the {self.max_wait:g} s wait",
                    retry_after=at - now,
                )
            if self._interval:
                self._next = at + self._interval
            if at <= now:
                return
            await self._sleep(at - now)
            if self._held_until <= self._clock():
                return
            # A 429 arrived while this call waited: its reserved start is void; take a turn after the hold.

    async def _wait_for_shared_start(self, started: float) -> None:
        assert self.shared is not None and self.max_per_second
        while True:
            now = self._clock()
            if self._held_until > now:
                # This process's own 429, perhaps not written yet: wait it out before taking a turn.
                if self._held_until - started > self.max_wait:
                    raise PaceExceeded(
                        f"calls are held for {self._held_until - now:.3g} s after a 429, past the "
                        f"{self.max_wait:g} s wait",
                        retry_after=self._held_until - now,
                    )
                await self._sleep(self._held_until - now)
                continue
            budget = max(0.0, self.max_wait - (now - started))
            try:
                reserved, wait = await self.shared.take(self.name, self._interval, budget)
            except Exception as exc:  # whatever failed, nothing was sent
                raise self._unreadable(exc) from exc
            if not reserved:
                raise PaceExceeded(
                    f"the next turn to call is {wait:.3g} s away, past the {self.max_wait:g} s wait "
                    "(shared by the ledger's workers)",
                    retry_after=wait,
                )
            if wait <= 0:
                return
            await self._sleep(wait)
            try:
                held = await self.shared.held(self.name)
            except Exception as exc:
                raise self._unreadable(exc) from exc
            if held <= 0 and self._held_until <= self._clock():
                return
            # A 429 arrived (here or in another process) while this call waited: its turn is void; take another.

    def _unreadable(self, exc: Exception) -> PaceExceeded:
        return PaceExceeded(f"the shared pace of {self.name} could not be read: {exc}")

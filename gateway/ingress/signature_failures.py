"""What a failed verification costs the gateway after its 401: a counter bump, and now and then a diagnosis.

The answer to a bad signature must cost no more than a good one's HMAC, whatever the body, and nothing on
the claim pool. So ``SignatureFailures.failed`` does two cheap things on the event loop:

- counts the failure in memory (``ledger.signature_failures.FailureCounter``), which a background
  ``FailureFlusher`` writes in one statement every couple of seconds on its own connection;
- offers the scheme's deferred diagnosis (``SignatureError.diagnose``: would a re-serialised form of the
  JSON have matched?) to a ``Diagnoser``, which runs at most ``per_minute`` of them per source and minute,
  on one worker thread, with at most ``queue`` waiting; anything past either bound is skipped, not queued.
  A hint it finds lands in the bucket's ``hint`` column (the rejects report) and in the log.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
from collections.abc import Callable
from datetime import UTC, datetime

from effectgate.ledger.signature_failures import FailureCounter, minute_of

from ..signatures import SignatureError

log = logging.getLogger("effectgate.gateway")

# A diagnosis of a 64 KiB JSON body (the most it parses) costs up to a hundred milliseconds or so of CPU
# and of the GIL, which the event loop shares: two per source and minute tell the operator what is wrong
# and cap that cost well under 1 % of a core per source, whatever the flood.
DEFAULT_DIAGNOSES_PER_MINUTE = 2
DEFAULT_DIAGNOSIS_QUEUE = 4

Diagnosis = Callable[[], str | None]


class Diagnoser:
    """Runs deferred diagnoses sampled, bounded and off the event loop; hands each hint to ``on_hint``.

    ``on_hint(source, reason, moment, hint)`` is called on the event loop. The thread is started by the
    first diagnosis, so a gateway that never sees a bad signature never has one.
    """

    def __init__(
        self,
        on_hint: Callable[[str, str, datetime, str], None],
        *,
        per_minute: int = DEFAULT_DIAGNOSES_PER_MINUTE,
        queue: int = DEFAULT_DIAGNOSIS_QUEUE,
    ) -> None:
        if per_minute < 0 or queue < 1:
            raise ValueError("per_minute must be >= 0 and queue >= 1")
        self.per_minute = per_minute
        self.queue = queue
        self._on_hint = on_hint
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._in_flight: set[asyncio.Future[str | None]] = set()
        # source → (minute, diagnoses started in it). Keyed by configured sources only, so bounded.
        self._started: dict[str, tuple[datetime, int]] = {}
        self.started = 0
        self.skipped = 0

    def offer(self, source: str, reason: str, moment: datetime, diagnose: Diagnosis) -> bool:
        """Start ``diagnose`` if this source's sample for the minute and the queue allow; True if started."""
        minute = minute_of(moment)
        seen, count = self._started.get(source, (minute, 0))
        if seen != minute:
            count = 0
        if count >= self.per_minute or len(self._in_flight) >= self.queue:
            self.skipped += 1
            return False
        self._started[source] = (minute, count + 1)
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="effectgate-diagnosis"
            )
        future = asyncio.get_running_loop().run_in_executor(self._executor, diagnose)
        self._in_flight.add(future)
        future.add_done_callback(functools.partial(self._done, source, reason, moment))
        self.started += 1
        return True

    def _done(self, source: str, reason: str, moment: datetime, future: asyncio.Future[str | None]) -> None:
        self._in_flight.discard(future)
        if future.cancelled() or future.exception() is not None:
            return
        hint = future.result()
        if hint is None:
            return
        log.warning("signature_failure.diagnosed", extra={"source": source, "reason": reason, "hint": hint})
        self._on_hint(source, reason, moment, hint)

    async def wait_idle(self) -> None:
        """Wait until every started diagnosis has finished (tests, and a tidy shutdown)."""
        while self._in_flight:
            await asyncio.wait(set(self._in_flight))

    def close(self) -> None:
        """Stop the thread; diagnoses not yet started are dropped (they only ever explain, never count)."""
        for future in list(self._in_flight):
            # A diagnosis still running finishes in its thread; cancelled here, its result is never handed
            # to an event loop that may be closed by then.
            future.cancel()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None


class SignatureFailures:
    """The gateway's side of a failed verification: count it, and offer its diagnosis. See the module."""

    def __init__(self, counter: FailureCounter, diagnoser: Diagnoser | None = None) -> None:
        self.counter = counter
        self.diagnoser = diagnoser if diagnoser is not None else Diagnoser(self._hint)

    def failed(self, source: str, failure: SignatureError, body: bytes) -> None:
        """Count one failed verification of ``body`` for ``source``; no I/O, no wait."""
        moment = datetime.now(UTC)
        self.counter.add(source, failure.code, body, failure.detail, now=moment)
        if failure.diagnose is not None:
            self.diagnoser.offer(source, failure.code, moment, failure.diagnose)

    def _hint(self, source: str, reason: str, moment: datetime, hint: str) -> None:
        self.counter.hint(source, reason, moment, hint, seen_at=moment)

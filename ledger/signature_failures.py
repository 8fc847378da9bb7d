"""Failed verifications, counted in memory and written to ``signature_failures`` a few times a minute.

An unauthenticated request must not cost a database round trip: a flood of bad signatures that each
awaited an upsert of one hot row per (source, reason, minute) queued genuine claims behind that row's lock
and the claim pool. So the gateway counts in a ``FailureCounter`` (a dict update, nothing else) and a
``FailureFlusher`` writes everything counted since its last pass in one statement, on a connection of its
own, every ``interval`` seconds and once more when the process stops.

Memory is bounded. A bucket is one (source, reason, minute): sources are the configured ones (an unknown
source is answered 404 before anything is counted), reasons are the closed set of ``SignatureError`` codes,
and buckets leave memory at every flush, so between two flushes there are at most sources * reasons * 2.
``max_buckets`` caps it anyway, for a flusher that cannot reach the database and keeps what it has: past
the cap, a failure in a new bucket is counted in ``dropped`` (and in the metrics, which count every failure
as it happens) instead of being kept.

A flush that fails never reaches an answer: the 401 was sent long before. Its rows go back into the
counter, up to the cap, and the next pass tries again on a fresh connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from dataclasses import dataclass
from datetime import UTC, datetime

from . import db
from .db import Conn
from .queries import Q

log = logging.getLogger("effectgate.ledger")

DEFAULT_INTERVAL = 2.0
DEFAULT_MAX_BUCKETS = 10_000
# The flusher's own connection waits this long for the server; it is not the claim pool's connection.
DEFAULT_CONNECT_TIMEOUT = 5
MAX_DETAIL = 500
MAX_HINT = 500

Key = tuple[str, str, datetime]
"""(source, reason, minute): one row of ``signature_failures``."""


def minute_of(moment: datetime) -> datetime:
    """The minute bucket ``moment`` falls in, as the table keys it."""
    return moment.astimezone(UTC).replace(second=0, microsecond=0)


@dataclass(slots=True)
class Bucket:
    """What is known of one (source, reason, minute) since the last flush.

    ``body_sha256`` is a sample: the hash of the first body counted in this bucket since the last flush, so
    a flood pays one hash per bucket and flush, not one per request. ``hint`` is a diagnosis that arrived
    for this bucket (see ``FailureCounter.hint``); a bucket with ``count == 0`` carries only that.
    """

    count: int
    bytes_total: int
    body_sha256: str
    detail: str
    last_seen_at: datetime
    hint: str | None = None

    def merge(self, older: Bucket) -> None:
        """Fold ``older`` (a pass put back after a failed write) into this newer bucket."""
        if self.count == 0:
            self.body_sha256, self.detail = older.body_sha256, older.detail
        self.count += older.count
        self.bytes_total += older.bytes_total
        self.last_seen_at = max(self.last_seen_at, older.last_seen_at)
        self.hint = self.hint or older.hint


class FailureCounter:
    """Failed verifications aggregated per (source, reason, minute) until a flusher takes them.

    Used from the event loop only (no lock): ``add`` is the whole cost a failed request pays here.
    """

    def __init__(self, *, max_buckets: int = DEFAULT_MAX_BUCKETS) -> None:
        if max_buckets < 1:
            raise ValueError("max_buckets must be at least 1")
        self.max_buckets = max_buckets
        self._buckets: dict[Key, Bucket] = {}
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._buckets)

    def add(self, source: str, reason: str, body: bytes, detail: str, *, now: datetime | None = None) -> None:
        """Count one failed verification of ``body``; the body is hashed only when the bucket needs a sample."""
        moment = now or datetime.now(UTC)
        key = (source, reason, minute_of(moment))
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= self.max_buckets:
                self.dropped += 1
                return
            self._buckets[key] = Bucket(
                1, len(body), hashlib.sha256(body).hexdigest(), detail[:MAX_DETAIL], moment
            )
            return
        if bucket.count == 0:
            # A hint-only bucket: this is its first counted body.
            bucket.body_sha256 = hashlib.sha256(body).hexdigest()
        bucket.count += 1
        bucket.bytes_total += len(body)
        bucket.detail = detail[:MAX_DETAIL]
        bucket.last_seen_at = max(bucket.last_seen_at, moment)

    def hint(self, source: str, reason: str, minute: datetime, hint: str, *, seen_at: datetime) -> None:
        """Attach a diagnosis to the (source, reason, minute) it was made for; its counts may be flushed
        already, in which case the next flush carries the hint alone (count 0)."""
        key = (source, reason, minute_of(minute))
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= self.max_buckets:
                return
            bucket = self._buckets[key] = Bucket(0, 0, "", "", seen_at)
        bucket.hint = hint[:MAX_HINT]

    def drain(self) -> dict[Key, Bucket]:
        """Everything counted since the last drain; the counter starts empty."""
        taken, self._buckets = self._buckets, {}
        return taken

    def restore(self, taken: dict[Key, Bucket]) -> None:
        """Put back what a failed write took, merged with what arrived since, up to ``max_buckets``."""
        for key, old in taken.items():
            current = self._buckets.get(key)
            if current is not None:
                current.merge(old)
            elif len(self._buckets) < self.max_buckets:
                self._buckets[key] = old
            else:
                self.dropped += old.count


async def write(conn: Conn, taken: dict[Key, Bucket]) -> None:
    """Add ``taken`` to ``signature_failures`` in one statement."""
    if not taken:
        return
    rows = list(taken.items())
    await conn.execute(
        Q["signature_failures_add_batch"],
        {
            "source": [k[0] for k, _ in rows],
            "reason": [k[1] for k, _ in rows],
            "minute": [k[2] for k, _ in rows],
            "count": [b.count for _, b in rows],
            "bytes_total": [b.bytes_total for _, b in rows],
            "body_sha256": [b.body_sha256 for _, b in rows],
            "detail": [b.detail for _, b in rows],
            "last_seen_at": [b.last_seen_at for _, b in rows],
            "hint": [b.hint for _, b in rows],
        },
    )


class FailureFlusher:
    """Writes a ``FailureCounter`` to the ledger every ``interval`` seconds, on a connection of its own.

    ``run(stopping)`` is the background task (started in the gateway's lifespan); it makes a last flush when
    ``stopping`` is set. ``flush()`` is one pass, for the loop and for tests. A failed pass is logged and
    its rows are restored to the counter; it never raises.
    """

    def __init__(
        self,
        counter: FailureCounter,
        database_url: str,
        *,
        interval: float = DEFAULT_INTERVAL,
        connect_timeout: int = DEFAULT_CONNECT_TIMEOUT,
        schema: str = db.DEFAULT_SCHEMA,
    ) -> None:
        if not interval > 0:
            raise ValueError("interval must be > 0 seconds")
        self.counter = counter
        self.interval = interval
        self._url = database_url
        self._connect_timeout = connect_timeout
        self._schema = schema
        self._conn: Conn | None = None
        # One pass at a time: the loop's and an explicit flush() must not take the same rows twice.
        self._lock = asyncio.Lock()
        self.written = 0
        self.failed_passes = 0
        self._dropped_logged = 0

    async def flush(self) -> int:
        """Write everything counted so far; the number of failures written (0 when the write failed)."""
        async with self._lock:
            if self.counter.dropped > self._dropped_logged:
                # Only when the cap was reached: the metrics still counted each of these failures.
                log.warning(
                    "signature_failures.dropped",
                    extra={
                        "failures": self.counter.dropped - self._dropped_logged,
                        "cap": self.counter.max_buckets,
                    },
                )
                self._dropped_logged = self.counter.dropped
            taken = self.counter.drain()
            if not taken:
                return 0
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = await db.connect(
                        self._url, schema=self._schema, connect_timeout=self._connect_timeout
                    )
                async with db.translate_errors():
                    await write(self._conn, taken)
            except Exception as exc:
                self.failed_passes += 1
                self.counter.restore(taken)
                await self._drop_connection()
                log.warning(
                    "signature_failures.flush_failed",
                    extra={"buckets": len(taken), "error": f"{type(exc).__name__}: {exc}"},
                )
                return 0
            count = sum(b.count for b in taken.values())
            self.written += count
            return count

    async def run(self, stopping: asyncio.Event) -> None:
        """Flush every ``interval`` seconds until ``stopping`` is set, then once more, then close."""
        try:
            while not stopping.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), self.interval)
                await self.flush()
        finally:
            await self._drop_connection()

    async def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()

"""Retention keeper: what the ledger forgets, and when — tombstones keep what must never be forgotten.

Effects are claimed forever in meaning, not in bytes. In order, each a batch at a time:

1. **payloads** (per source): once an effect's job has finished and its payload window has passed, its
   payload and its steps' recorded answers are purged and the effects row becomes a **tombstone** (tenant,
   key, fingerprint, outcome, first and last seen). A late provider retry still meets the unique
   constraint and is answered duplicate: the claim never reads the payload. Rejected payloads and the
   payloads unmatched deliveries keep for replay go at the same window, and so does the row that
   de-duplicates an unmatched body (``unmatched_deliveries``), so the same body later is kept afresh.
2. **history**: delivery rows, key-conflict rows, and finished jobs (with their attempts and steps) older
   than the history window. The tombstone keeps the job's outcome.
3. **tombstones** (opt-in, per source): the dedupe window. Without one, tombstones are kept forever; with
   one, a tombstone last seen before it is deleted with whatever still references it, and a later delivery
   of that key counts as **new**. ``gateway.config`` refuses a window shorter than the automatic-retry
   window of any configured source's provider (docs/providers.md).
4. **signature_failures**: failed-verification counters.

Each batch (``batch`` rows, ``DEFAULT_BATCH``) is a transaction of its own, and what it purged is added to
``retention_purges`` (cumulative, per table or column) in that same transaction, so ``/metrics`` and
``report()`` say the same whichever process ran the pass, and no row lock a claim or a lease needs is held for
longer than one batch (a whole pass in one transaction held them all until its end).

On a ledger distributed by tenant (Citus, ``topology.distributed``) a statement over every tenant is a
multi-shard ``FOR UPDATE``, which Citus refuses. There each statement's sibling ``<name>_on_shard`` reads, without
a lock and shard by shard, which tenants hold each shard's oldest ``batch`` due rows (a worker node that cannot be
reached is skipped, logged once per pass, and its tenants purged after it returns: ``shards``); the statement then runs once per tenant (a batch, a
transaction each), which Citus routes to that tenant's shard group, and the tenants are read again while a
round purged a full batch's worth. The budget (``batches_per_pass`` per statement) is the same on one node and
on many.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from ..cluster import shards
from ..cluster.topology import SINGLE_NODE, Topology
from ..db import Conn
from ..queries import Q

DAY = 86400.0
DEFAULT_PAYLOADS = 30 * DAY
DEFAULT_HISTORY = 90 * DAY
DEFAULT_TOMBSTONES: float | None = None  # kept forever unless the operator opts in
DEFAULT_SIGNATURE_FAILURES = 30 * DAY
DEFAULT_BATCH = 1000
DEFAULT_BATCHES_PER_PASS = 20
#: On a ledger distributed by tenant: how many per-tenant statements one batch of a pass's budget may cost.
TENANT_STATEMENTS_PER_BATCH = 10

#: What the keeper purges, in the order it does, by the name counters and reports use.
PURGED = (
    "effects.payload",
    "steps.answer",
    "effect_rejects.payload",
    "deliveries.payload",
    "unmatched_deliveries",
    "deliveries",
    "effect_rejects",
    "jobs",
    "job_attempts",
    "steps",
    "effects",
    "signature_failures",
)


@dataclass(frozen=True, slots=True)
class RetentionConfig:
    """Retention windows in seconds, per source where it matters, and how much one pass purges.

    ``source_payloads`` overrides ``payloads`` per source; ``source_tombstones`` overrides ``tombstones``
    (the dedupe window) per source, where ``None`` keeps that source's tombstones forever.
    """

    payloads: float = DEFAULT_PAYLOADS
    history: float = DEFAULT_HISTORY
    tombstones: float | None = DEFAULT_TOMBSTONES
    signature_failures: float = DEFAULT_SIGNATURE_FAILURES
    batch: int = DEFAULT_BATCH
    batches_per_pass: int = DEFAULT_BATCHES_PER_PASS
    source_payloads: Mapping[str, float] = field(default_factory=dict)
    source_tombstones: Mapping[str, float | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.signature_failures > 0:
            raise ValueError("signature_failure_retention must be > 0 seconds")
        if self.batch < 1:
            raise ValueError("retention batch must be >= 1")
        if self.batches_per_pass < 1:
            raise ValueError("retention batches_per_pass must be >= 1")
        for name, window in {"payloads": self.payloads, **self._named(self.source_payloads)}.items():
            if not window > 0:
                raise ValueError(f"retention {name} must be > 0 seconds")
            # History rows (and the jobs that run on the payload) outlive the payload, never the reverse:
            # a finished job is deleted only once its payload is gone.
            if window > self.history:
                raise ValueError(
                    f"retention {name} ({window:g} s) must not exceed history ({self.history:g} s)"
                )
        for name, maybe in {"tombstones": self.tombstones, **self._named(self.source_tombstones)}.items():
            if maybe is not None and not maybe > 0:
                raise ValueError(f"retention {name} must be > 0 seconds (or unset: kept forever)")

    @staticmethod
    def _named(per_source: Mapping[str, Any]) -> dict[str, Any]:
        return {f"sources.{source}": window for source, window in per_source.items()}

    def dedupe_window(self, source: str) -> float | None:
        """How long ``source``'s tombstones are kept; ``None`` for ever."""
        if source in self.source_tombstones:
            return self.source_tombstones[source]
        return self.tombstones

    def payload_window(self, source: str) -> float:
        """How long after its job finished ``source``'s payloads are kept."""
        return self.source_payloads.get(source, self.payloads)


@dataclass(slots=True)
class RetentionResult:
    """Rows purged by one pass, per table or column (``PURGED`` names)."""

    purged: dict[str, int] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        """Whether the pass purged anything."""
        return any(self.purged.values())

    def add(self, what: str, n: int) -> None:
        """Count ``n`` more rows of ``what``."""
        self.purged[what] = self.purged.get(what, 0) + int(n)


class RetentionKeeper:
    """Purges what has outlived its window: up to ``batches_per_pass`` batches per table per pass."""

    name = "retention"

    def __init__(self, config: RetentionConfig | None = None, *, topology: Topology = SINGLE_NODE) -> None:
        self.config = config or RetentionConfig()
        self.topology = topology
        self._skipped: list[shards.Skipped] = []  # this pass's unreached worker nodes (Citus), logged once

    async def run_once(self, conn: Conn, *, now: datetime | None = None) -> RetentionResult:
        """One pass over every window, oldest rows first. Each batch is a transaction of its own, committed
        with its counters: a batch's row locks (on effects a late retry may claim, on jobs) are held for
        that batch only, never for the whole pass."""
        c = self.config
        result = RetentionResult(dict.fromkeys(PURGED, 0))
        self._skipped = []
        limit = {"now": now, "limit": c.batch, "tenant": None}
        payload_policy = {
            **limit,
            "window": c.payloads,
            "sources": list(c.source_payloads),
            "windows": list(c.source_payloads.values()),
        }
        await self._batches(
            conn,
            "effect_payloads_purge_expired",
            payload_policy,
            _columns({"effects.payload": "payloads", "steps.answer": "answers"}, full="jobs"),
            result,
        )
        await self._batches(
            conn, "reject_payloads_purge_expired", payload_policy, _rowcount("effect_rejects.payload"), result
        )
        await self._batches(
            conn, "unmatched_payloads_purge_expired", payload_policy, _rowcount("deliveries.payload"), result
        )
        await self._batches(
            conn, "unmatched_seen_purge_expired", payload_policy, _rowcount("unmatched_deliveries"), result
        )
        history = {**limit, "window": c.history}
        # Time partitions are dropped whole by the partition keeper; the row deletes only reach what lies
        # before the first of them (the legacy partition) and the DEFAULT partition.
        clock = now or await self._clock(conn)
        first = await self._first_partition_starts(conn)

        def before(parent: str, window: float) -> datetime:
            cutoff = clock - timedelta(seconds=window)
            start = first.get(parent)
            return cutoff if start is None else min(cutoff, start)

        for parent, rows_query, default_query in (
            ("deliveries", "deliveries_delete_expired", "deliveries_default_delete_expired"),
            ("effect_rejects", "effect_rejects_delete_expired", "effect_rejects_default_delete_expired"),
        ):
            params = {**limit, "before": before(parent, c.history)}
            await self._batches(conn, rows_query, params, _rowcount(parent), result)
            await self._batches(conn, default_query, history, _rowcount(parent), result)
        await self._batches(
            conn,
            "jobs_delete_expired",
            history,
            _columns({"jobs": "jobs", "job_attempts": "attempts", "steps": "steps"}, full="jobs"),
            result,
        )
        if c.tombstones is not None or any(w is not None for w in c.source_tombstones.values()):
            tombstones = {
                **limit,
                "window": c.tombstones,
                "sources": list(c.source_tombstones),
                "windows": list(c.source_tombstones.values()),
            }
            await self._batches(
                conn,
                "effect_tombstones_delete_expired",
                tombstones,
                _columns(
                    {
                        "effects": "tombstones",
                        "deliveries": "deliveries",
                        "effect_rejects": "rejects",
                        "jobs": "jobs",
                        "job_attempts": "attempts",
                        "steps": "steps",
                    },
                    full="tombstones",
                ),
                result,
            )
        sig = c.signature_failures
        await self._batches(
            conn,
            "signature_failures_delete_expired",
            {**limit, "before": before("signature_failures", sig)},
            _rowcount("signature_failures"),
            result,
        )
        await self._batches(
            conn,
            "signature_failures_default_delete_expired",
            {**limit, "window": sig},
            _rowcount("signature_failures"),
            result,
        )
        shards.log_skipped(self.name, self._skipped)
        # Every line's last run, purged or not (the batches counted what they purged as they committed).
        await conn.execute(
            Q["retention_purges_count"], {"now": now, "whats": list(PURGED), "counts": [0] * len(PURGED)}
        )
        return result

    async def _batches(
        self, conn: Conn, query: str, params: Mapping[str, Any], tally: _Tally, result: RetentionResult
    ) -> None:
        """Up to ``batches_per_pass`` batches of ``query``, each committed on its own together with its
        counters, until one comes back short. ``tally`` reads a batch's counts per ``PURGED`` name, and the
        number that says whether the batch was full.

        Per tenant (Citus, when ``query`` has a sibling in ``_TENANTS_OF``): the same budget in rows
        (``batches_per_pass`` x ``batch``), spent tenant by tenant, a batch each; and at most
        ``TENANT_STATEMENTS_PER_BATCH`` routed statements per batch of the budget, so that rows spread thin
        over many tenants (one due row each) cannot hold a reconciler pass (and the next pass's lease
        rescue) for one statement per tenant."""
        c = self.config
        read_from = _TENANTS_OF.get(query)
        if not self.topology.distributed or read_from is None:
            for _ in range(c.batches_per_pass):
                if await self._batch(conn, query, params, tally, result) < c.batch:
                    return
            return
        rows_left = c.batches_per_pass * c.batch
        statements_left = c.batches_per_pass * TENANT_STATEMENTS_PER_BATCH
        while rows_left > 0:
            asked = min(c.batch, rows_left)
            found = await shards.tenants_on_live_nodes(
                conn,
                read_from[0],
                table=read_from[1],
                joined=read_from[2],
                params={k: v for k, v in params.items() if k not in ("limit", "tenant", "now")},
                limit=asked,
                now=params["now"],
            )
            self._skipped += found.skipped
            round_purged = 0
            for tenant in found.tenants:
                if statements_left <= 0 or rows_left <= 0:
                    return
                statements_left -= 1
                n = await self._batch(
                    conn,
                    query,
                    {**params, "limit": min(c.batch, rows_left), "tenant": tenant},
                    tally,
                    result,
                )
                rows_left -= n
                round_purged += n
            # The tenants read held the oldest `asked` due rows; fewer purged than that means nothing more was due
            # (or what is left is locked, which the next pass takes), as a short batch does on one node.
            if round_purged < asked:
                return

    async def _batch(
        self, conn: Conn, query: str, params: Mapping[str, Any], tally: _Tally, result: RetentionResult
    ) -> int:
        """One batch of ``query`` and its counters, in a transaction of its own; the number compared with the
        batch size."""
        async with conn.transaction():
            cur = await conn.execute(Q[query], params)
            row = await cur.fetchone() if cur.description is not None else None
            counts, n = tally(row, cur.rowcount)
            purged = {what: int(k) for what, k in counts.items() if k}
            if purged:
                await conn.execute(
                    Q["retention_purges_count"],
                    {"now": params["now"], "whats": list(purged), "counts": list(purged.values())},
                )
        for what, k in purged.items():
            result.add(what, k)
        return int(n)

    @staticmethod
    async def _clock(conn: Conn) -> datetime:
        row = await (await conn.execute(Q["maintenance_clock"])).fetchone()
        assert row is not None
        return row["now"]  # type: ignore[no-any-return]

    @staticmethod
    async def _first_partition_starts(conn: Conn) -> dict[str, datetime]:
        first: dict[str, datetime] = {}
        for row in await (await conn.execute(Q["history_partitions_list"])).fetchall():
            start = row["range_from"]
            if start is not None and (row["parent"] not in first or start < first[row["parent"]]):
                first[row["parent"]] = start
        return first


# The statements on distributed tables, and for each its read of one shard (``<name>_on_shard``), the table whose
# shards it reads and the co-located table it joins, if any (Citus). The
# signature_failures ones have none: that table stays on the coordinator, keyed by source.
_TENANTS_OF: dict[str, tuple[str, str, str | None]] = {
    "effect_payloads_purge_expired": ("effect_payloads_purge_expired_on_shard", "jobs", "effects"),
    "reject_payloads_purge_expired": ("reject_payloads_purge_expired_on_shard", "effect_rejects", None),
    "unmatched_payloads_purge_expired": ("unmatched_payloads_purge_expired_on_shard", "deliveries", None),
    "unmatched_seen_purge_expired": ("unmatched_seen_purge_expired_on_shard", "unmatched_deliveries", None),
    "deliveries_delete_expired": ("deliveries_delete_expired_on_shard", "deliveries", None),
    "deliveries_default_delete_expired": (
        "deliveries_default_delete_expired_on_shard",
        "deliveries_default",
        None,
    ),
    "effect_rejects_delete_expired": ("effect_rejects_delete_expired_on_shard", "effect_rejects", None),
    "effect_rejects_default_delete_expired": (
        "effect_rejects_default_delete_expired_on_shard",
        "effect_rejects_default",
        None,
    ),
    "jobs_delete_expired": ("jobs_delete_expired_on_shard", "jobs", None),
    "effect_tombstones_delete_expired": ("effect_tombstones_delete_expired_on_shard", "effects", None),
}

# How one batch's answer becomes counts: (the row it returned, or None; its rowcount) -> ({PURGED name: n},
# the number compared with the batch size).
_Tally = Callable[[dict[str, Any] | None, int], tuple[dict[str, int], int]]


def _rowcount(what: str) -> _Tally:
    return lambda _row, n: ({what: n}, n)


def _columns(columns: Mapping[str, str], *, full: str) -> _Tally:
    """Counts read from the columns of the batch's one row (``PURGED`` name -> column); ``full`` is the
    column compared with the batch size."""

    def tally(row: dict[str, Any] | None, _n: int) -> tuple[dict[str, int], int]:
        assert row is not None  # an aggregate always yields its row
        return {what: row[column] for what, column in columns.items()}, row[full]

    return tally


@dataclass(frozen=True, slots=True)
class RetentionLine:
    """One line of the retention report: a table (or column), its window, what it holds and what went."""

    what: str
    window_seconds: float | None
    oldest_held: datetime | None
    purged_total: int
    last_purged_at: datetime | None
    last_run_at: datetime | None


# Which window governs each line, and which column of retention_oldest_held says what it still holds.
_REPORT = (
    ("effects.payload", "payloads", "payloads"),
    ("steps.answer", "payloads", None),
    ("effect_rejects.payload", "payloads", None),
    ("deliveries.payload", "payloads", None),
    ("unmatched_deliveries", "payloads", None),
    ("deliveries", "history", "deliveries"),
    ("effect_rejects", "history", "effect_rejects"),
    ("jobs", "history", "jobs"),
    ("job_attempts", "history", None),
    ("steps", "history", None),
    ("effects", "tombstones", "tombstones"),
    ("signature_failures", "signature_failures", "signature_failures"),
)


async def purge_totals(conn: Conn) -> dict[str, int]:
    """Rows purged so far, per table or column, by every process (what ``/metrics`` reports)."""
    rows = await (await conn.execute(Q["retention_purges_all"])).fetchall()
    return {row["what"]: int(row["purged"]) for row in rows}


async def report(conn: Conn, config: RetentionConfig | None = None) -> tuple[list[RetentionLine], int]:
    """What retention keeps and has purged: one line per table or column (window, oldest row still held,
    rows purged so far, when last), and how many tombstones the ledger holds."""
    config = config or RetentionConfig()
    totals = {row["what"]: row for row in await (await conn.execute(Q["retention_purges_all"])).fetchall()}
    oldest = await (await conn.execute(Q["retention_oldest_held"])).fetchone()
    assert oldest is not None
    windows: dict[str, float | None] = {
        "payloads": config.payloads,
        "history": config.history,
        "tombstones": config.tombstones,
        "signature_failures": config.signature_failures,
    }
    lines = []
    for what, window, held in _REPORT:
        total = totals.get(what)
        lines.append(
            RetentionLine(
                what=what,
                window_seconds=windows[window],
                oldest_held=oldest[held] if held else None,
                purged_total=int(total["purged"]) if total else 0,
                last_purged_at=total["last_purged_at"] if total else None,
                last_run_at=total["last_run_at"] if total else None,
            )
        )
    return lines, int(oldest["tombstone_count"])


def overdue(line: RetentionLine, now: datetime, *, slack: float = 0.0) -> bool:
    """Whether ``line`` holds a row older than its window (plus ``slack``): retention is behind."""
    if line.window_seconds is None or line.oldest_held is None:
        return False
    return line.oldest_held < now - timedelta(seconds=line.window_seconds + slack)

"""Read-only views of the ledger for operators: an effect's lineage, duplicates, rejects."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from .db import Conn
from .queries import Q

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000


@dataclass(frozen=True, slots=True)
class EffectView:
    """One effect from delivery to outcome: the claim, its deliveries, rejects, job attempts and steps."""

    effect: dict[str, Any]
    deliveries: list[dict[str, Any]]
    rejects: list[dict[str, Any]]
    attempts: list[dict[str, Any]]
    steps: list[dict[str, Any]]


async def effect_view(conn: Conn, effect_key: str, *, tenant: str = "default") -> EffectView | None:
    """The lineage of one effect by key, or ``None`` when no such effect was ever claimed."""
    effect = await (
        await conn.execute(Q["effect_by_key"], {"tenant": tenant, "effect_key": effect_key})
    ).fetchone()
    if effect is None:
        return None
    params = {"effect_id": effect["id"]}
    deliveries = await (await conn.execute(Q["effect_deliveries"], params)).fetchall()
    rejects = await (await conn.execute(Q["effect_rejects_for_effect"], params)).fetchall()
    attempts = await (await conn.execute(Q["effect_attempts"], params)).fetchall()
    steps = await (await conn.execute(Q["steps_for_effect"], params)).fetchall()
    return EffectView(effect, deliveries, rejects, attempts, steps)


def _window(since: datetime | None, until: datetime | None) -> tuple[datetime, datetime]:
    end = until or datetime.now(UTC)
    return (since or end - timedelta(hours=24), end)


def _limit(limit: int) -> int:
    if limit < 1:
        raise ValueError("limit must be >= 1")
    return min(limit, MAX_LIMIT)


async def duplicates(
    conn: Conn,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    source: str | None = None,
    limit: int = DEFAULT_LIMIT,
) -> list[dict[str, Any]]:
    """Effects delivered more than once, last seen in the window (default: the last 24 hours)."""
    start, end = _window(since, until)
    return await (
        await conn.execute(
            Q["report_duplicates"], {"since": start, "until": end, "source": source, "limit": _limit(limit)}
        )
    ).fetchall()


async def key_conflicts(
    conn: Conn,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    source: str | None = None,
    limit: int = DEFAULT_LIMIT,
) -> list[dict[str, Any]]:
    """Deliveries rejected because a different payload held their key, in the window."""
    start, end = _window(since, until)
    return await (
        await conn.execute(
            Q["report_key_conflicts"],
            {"since": start, "until": end, "source": source, "limit": _limit(limit)},
        )
    ).fetchall()


async def signature_failures(
    conn: Conn,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    source: str | None = None,
) -> list[dict[str, Any]]:
    """Verification failures by (source, reason) in the window."""
    start, end = _window(since, until)
    return await (
        await conn.execute(Q["report_signature_failures"], {"since": start, "until": end, "source": source})
    ).fetchall()

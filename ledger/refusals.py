"""Refused deliveries: verified deliveries that could not become effects, kept so none is lost in silence.

A key, lock-key, tenant or ``require`` function raised, the tenant was missing or not allowed, the payload was
past what the ledger stores, or Postgres refused what the delivery holds. Each event of such a delivery is a
``deliveries`` row with outcome ``refused``: its payload (what ``effectgate ledger replay --refused`` claims once
the cause is fixed), the raw body byte-exact, and the reason (``refusal``: reason, the event that failed, the
handler, the exception's type and message). They count in the delivery-outcomes report, list in the refused
deliveries report, and go with the payload window (payload and body) and the history window (the row).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb

from .db import Conn
from .queries import Q
from .storable import storable_record, storable_text

# Longest event id, type and tenant text kept on a refused row: one of them may be why it was refused.
_MAX_TEXT = 500


@dataclass(frozen=True, slots=True)
class RefusedEvent:
    """One event of a refused delivery: ``payload_text`` is its stored copy as JSON text (None when the ledger
    cannot store it), ``tenant`` is empty when the refusal is that it has none usable."""

    event_id: str
    event_type: str
    tenant: str
    payload_text: str | None
    fingerprint: str


async def keep_refused(
    conn: Conn,
    *,
    request_id: str,
    source: str,
    secret_index: int | None,
    events: Sequence[RefusedEvent],
    refusal: dict[str, Any],
    body: bytes,
    now: datetime | None = None,
) -> None:
    """Keep every event of one refused delivery, with its body and ``refusal`` (made storable first)."""
    await conn.execute(
        Q["refused_deliveries_keep"],
        {
            "request_id": storable_text(request_id)[:_MAX_TEXT],
            "now": now,
            "source": source,
            "secret_index": secret_index,
            "refusal": Jsonb(storable_record(refusal)),
            "body": body,
            "tenant": [storable_text(e.tenant)[:_MAX_TEXT] for e in events],
            "event_id": [storable_text(e.event_id)[:_MAX_TEXT] for e in events],
            "event_type": [storable_text(e.event_type)[:_MAX_TEXT] for e in events],
            "fingerprint": [e.fingerprint for e in events],
            "payload": [e.payload_text for e in events],
        },
    )


def body_fingerprint(body: bytes) -> str:
    """The fingerprint of a refused event whose payload the ledger cannot hold: its body's SHA-256."""
    return hashlib.sha256(body).hexdigest()


async def mark_replayed(
    conn: Conn, row: dict[str, Any], *, replayed_at: datetime, outcomes: list[dict[str, Any]]
) -> None:
    """Mark one refused row (as ``refused_for_replay`` returned it) replayed, with what its effects came to."""
    await conn.execute(
        Q["refused_delivery_mark_replayed"],
        {
            "id": row["id"],
            "received_at": row["received_at"],
            "tenant": row["row_tenant"],
            "replayed": Jsonb({"replayed_at": replayed_at.isoformat(), "replay_outcomes": outcomes}),
        },
    )


async def refused_for_replay(
    conn: Conn, *, source: str, since: datetime, until: datetime | None, limit: int
) -> list[dict[str, Any]]:
    """Refused deliveries of ``source`` received in [since, until) that still keep their payload and were not
    replayed yet, oldest first (``row_tenant`` is the row's own tenant, part of its key)."""
    return await (
        await conn.execute(
            Q["refused_deliveries_for_replay"],
            {"source": source, "since": since, "until": until, "limit": limit},
        )
    ).fetchall()

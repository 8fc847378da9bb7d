"""Signed transmissions remembered while their signature can still be accepted.

PayPal signs a transmission id and time with RSA but covers the body only by its CRC32, which is not a
cryptographic hash: a few chosen bytes give any body the CRC of a captured one. The id cannot be changed
without the signature failing, so a forged body still arrives under the captured id. ``remember_first``
records the SHA-256 of the body each id first came with and returns it; a caller seeing another hash
than its own refuses the delivery. The table is shared by every gateway replica, and each row lives only
until the transmission's signed time leaves the tolerance window (migration 0011).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from .db import Conn
from .queries import Q

# Expired rows deleted by each remember: more than one, so the table shrinks back after a burst
# (each new transmission removes up to this many old ones), few enough to keep the statement small.
SWEEP_PER_REMEMBER = 16


@dataclass(frozen=True, slots=True)
class Remembered:
    """What the ledger holds for one transmission id after remembering it: the body hash it was first
    seen with, how many times it was seen in its window (this one included), and how many expired rows
    the statement swept."""

    body_sha256: str
    seen_count: int
    swept: int


async def remember_first(
    conn: Conn,
    *,
    source: str,
    transmission_id: str,
    body_sha256: str,
    expires_at: datetime,
    now: datetime | None = None,
) -> Remembered:
    """Remember ``transmission_id`` of ``source`` with ``body_sha256`` until ``expires_at``, unless it is
    remembered already; return what is remembered. Concurrent calls for one id all return the first hash."""
    cursor = await conn.execute(
        Q["transmission_remember_first"],
        {
            "source": source,
            "transmission_id": transmission_id,
            "body_sha256": body_sha256,
            "expires_at": expires_at,
            "now": now,
            "sweep": SWEEP_PER_REMEMBER,
        },
    )
    row = await cursor.fetchone()
    assert row is not None  # INSERT … ON CONFLICT DO UPDATE … RETURNING always returns the row
    return Remembered(str(row["body_sha256"]), int(row["seen_count"]), int(row["swept"]))

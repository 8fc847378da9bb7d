"""Failed-verification counters are bounded per minute by their key and in time by retention."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from effectgate.ledger import db
from effectgate.ledger.claims import record_signature_failure
from effectgate.ledger.reconciler import Reconciler, ReconcilerConfig

pytestmark = pytest.mark.anyio

NOW = datetime(2031, 1, 31, 12, 0, tzinfo=UTC)


async def count(conn: db.Conn) -> int:
    row = await (await conn.execute("SELECT count(*) AS n FROM signature_failures")).fetchone()
    assert row is not None
    return int(row["n"])


async def test_counters_older_than_the_retention_are_forgotten_by_the_reconciler(conn: db.Conn) -> None:
    for days_ago in (40, 31, 29, 1):
        for _ in range(3):  # the same minute: one row, counted three times
            await record_signature_failure(
                conn,
                source="stripe",
                reason="signature_invalid",
                size=10,
                body_sha256="0" * 64,
                detail="no secret matched",
                now=NOW - timedelta(days=days_ago),
            )
    assert await count(conn) == 4
    result = await Reconciler(ReconcilerConfig(signature_failure_retention=30 * 86400)).run_once(
        conn, now=NOW
    )
    assert result.expired_signature_failures == 2 and result.changed
    assert await count(conn) == 2
    again = await Reconciler(ReconcilerConfig(signature_failure_retention=30 * 86400)).run_once(conn, now=NOW)
    assert again.expired_signature_failures == 0

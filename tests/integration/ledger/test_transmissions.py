"""The ledger's memory of signed transmission ids (migration 0011): the first body wins for as long as the
id can pass the time window, concurrent callers agree, expired rows are replaced and swept, and the sweep
stays on its index at a realistic row count."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from effectgate.ledger import db, transmissions
from effectgate.ledger.queries import Q
from tests.integration.jobs_and_workers import connected

pytestmark = [pytest.mark.anyio, pytest.mark.rolled_back]

T0 = datetime(2031, 6, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


async def remember(conn: db.Conn, tid: str, digest: str, *, expires: float, now: float) -> str:
    remembered = await transmissions.remember_first(
        conn, source="paypal", transmission_id=tid, body_sha256=digest, expires_at=at(expires), now=at(now)
    )
    return remembered.body_sha256


async def count(conn: db.Conn) -> int:
    row = await (await conn.execute("SELECT count(*) AS n FROM transmissions")).fetchone()
    assert row is not None
    return int(row["n"])


async def test_the_first_body_is_remembered_until_the_id_expires(conn: db.Conn) -> None:
    assert await remember(conn, "t-1", "genuine", expires=300, now=0) == "genuine"
    assert await remember(conn, "t-1", "forged", expires=300, now=10) == "genuine"
    assert await remember(conn, "t-1", "genuine", expires=300, now=20) == "genuine"
    # Another source's id of the same text is another transmission.
    other = await transmissions.remember_first(
        conn, source="paypal_eu", transmission_id="t-1", body_sha256="x", expires_at=at(300), now=at(30)
    )
    assert (other.body_sha256, other.seen_count) == ("x", 1)
    row = await (
        await conn.execute("SELECT seen_count FROM transmissions WHERE source = 'paypal'")
    ).fetchone()
    assert row is not None and row["seen_count"] == 3
    # Past its expiry no delivery naming it can pass verify; a row still there is replaced, not obeyed.
    assert await remember(conn, "t-1", "later", expires=900, now=301) == "later"


async def test_each_remember_sweeps_a_bounded_number_of_expired_rows(conn: db.Conn) -> None:
    for n in range(40):
        await remember(conn, f"old-{n}", "h", expires=10, now=0)
    first = await transmissions.remember_first(
        conn, source="paypal", transmission_id="new-1", body_sha256="h", expires_at=at(400), now=at(100)
    )
    assert first.swept == transmissions.SWEEP_PER_REMEMBER
    assert await count(conn) == 40 - transmissions.SWEEP_PER_REMEMBER + 1
    for n in range(2, 5):
        await remember(conn, f"new-{n}", "h", expires=400, now=100)
    # Every expired row is gone after a few new ids; the live ones stay.
    assert await count(conn) == 4


async def test_concurrent_callers_on_one_id_all_get_the_one_hash_that_won(db_url: str) -> None:
    async def one(digest: str) -> str:
        async with connected(db_url) as conn:
            await conn.set_autocommit(True)
            return await remember(conn, "t-race", digest, expires=300, now=0)

    answers = await asyncio.gather(*(one(f"body-{n % 2}") for n in range(16)))
    assert len(set(answers)) == 1


async def test_the_sweep_reads_the_expiry_index_at_a_realistic_row_count(conn: db.Conn) -> None:
    await conn.execute(
        "INSERT INTO transmissions (source, transmission_id, body_sha256, expires_at, first_seen_at, last_seen_at) "
        "SELECT 'paypal', 't-' || n, 'h', %(t0)s + n * interval '1 second', %(t0)s, %(t0)s "
        "FROM generate_series(1, 50000) n",
        {"t0": T0},
    )
    await conn.execute("ANALYZE transmissions")
    params: dict[str, Any] = {
        "source": "paypal",
        "transmission_id": "t-new",
        "body_sha256": "h",
        "expires_at": at(90_000),
        "now": at(100),
        "sweep": transmissions.SWEEP_PER_REMEMBER,
    }
    row = await (
        await conn.execute("EXPLAIN (FORMAT JSON) " + Q["transmission_remember_first"], params)
    ).fetchone()  # type: ignore[operator]
    assert row is not None

    def nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
        return [node, *(n for child in node.get("Plans", []) for n in nodes(child))]

    plan = nodes(row["QUERY PLAN"][0]["Plan"])
    scans = {(n["Node Type"], n.get("Index Name")) for n in plan if "Scan" in n["Node Type"]}
    assert ("Seq Scan", None) not in scans, scans
    assert not any(n["Node Type"] == "Sort" for n in plan)

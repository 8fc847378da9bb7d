"""The previous release's statements still run on a fully migrated ledger, and agree with this release's code.

A rolling upgrade runs both releases against one schema (deploy/README.md, "Rolling upgrades"): migration 0017
adds versioned names for the SQL functions running code calls and keeps the unversioned ones the previous
release calls (docs/adr/0017-versioned-sql-functions.md). The previous release's SQL is frozen in
tests/data/previous_release_sql/; each test runs one of its statements, with the parameters that release passed,
beside this release's code path on a twin row, and compares what both leave behind — and mixes them on one row,
as an old gateway and a new one do during the roll.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from effectgate.ledger import db, jobs
from effectgate.ledger.claims import Accepted, Delivery, Duplicate, EffectRequest, Rejected, claim_delivery
from effectgate.ledger.fingerprints import canonical_json, fingerprint
from effectgate.ledger.maintenance.rescuer import LeaseRescuer, RescuerConfig
from effectgate.ledger.queries import Q, parse
from tests.integration.ledger.before_0022 import BEFORE_0022

pytestmark = pytest.mark.anyio

PREVIOUS_DIR = Path(__file__).parents[2] / "data" / "previous_release_sql"


def _load_previous() -> dict[str, Any]:
    blocks: dict[str, Any] = {}
    for path in sorted(PREVIOUS_DIR.glob("*.sql")):
        blocks.update(parse(path.read_text(encoding="utf-8"), str(path)))
    return blocks


PREVIOUS = _load_previous()
T0 = datetime(2030, 1, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def delivery(key: str, amount: int = 100) -> Delivery:
    # The payload leaves the key out, so twin deliveries of two keys have one fingerprint.
    payload = {"type": "charge.succeeded", "amount": amount}
    return Delivery(
        f"req-{key}-{amount}",
        "default",
        "stripe",
        f"evt-{key}",
        "charge.succeeded",
        payload,
        fingerprint(payload),
        0,
    )


def effect(key: str, kind: str = "charge", orphan_policy: str = "redrive") -> EffectRequest:
    return EffectRequest(key, kind, 5, orphan_policy)


async def previous_claim(
    conn: db.Conn, arrived: Delivery, wanted: EffectRequest, now: datetime
) -> dict[str, Any]:
    """One effect of one delivery, claimed the way the previous release's ledger/claims.py called its
    ``effect_claim_batch``: one element per parallel array, the payload sent once as canonical JSON."""
    params = {
        "ord": [0],
        "request_id": [arrived.request_id],
        "tenant": [arrived.tenant],
        "effect_key": [wanted.effect_key],
        "source": [arrived.source],
        "handler": [wanted.handler],
        "event_id": [arrived.event_id],
        "event_type": [arrived.event_type],
        "fingerprint": [arrived.fingerprint],
        "payload_ix": [1],
        "max_attempts": [wanted.max_attempts],
        "orphan_policy": [wanted.orphan_policy],
        "lock_key": [wanted.lock_key],
        "secret_index": [arrived.secret_index],
        "payloads": [canonical_json(arrived.payload).decode()],
        "now": now,
    }
    [row] = await (await conn.execute(PREVIOUS["effect_claim_batch"], params)).fetchall()
    return dict(row)


async def rows_of(conn: db.Conn, key: str) -> dict[str, Any]:
    """What a claim of ``key`` left behind, without the columns that name the key, its ids or its request."""
    effect_row = await (
        await conn.execute(
            "SELECT tenant, source, handler, event_type, fingerprint, payload, delivery_count, reject_count,"
            " first_seen_at, last_seen_at FROM effects WHERE effect_key = %s",
            (key,),
        )
    ).fetchone()
    job_rows = await (
        await conn.execute(
            "SELECT j.tenant, j.kind, j.state::text AS state, j.attempt, j.max_attempts, j.orphan_policy,"
            " j.run_at, j.lock_key FROM jobs j JOIN effects e ON e.id = j.effect_id WHERE e.effect_key = %s",
            (key,),
        )
    ).fetchall()
    delivery_rows = await (
        await conn.execute(
            "SELECT tenant, source, event_type, outcome, fingerprint, secret_index, received_at"
            " FROM deliveries WHERE effect_key = %s ORDER BY id",
            (key,),
        )
    ).fetchall()
    return {"effect": effect_row, "jobs": job_rows, "deliveries": delivery_rows}


async def test_the_previous_claim_statement_claims_like_the_new_code(conn: db.Conn) -> None:
    old = await previous_claim(conn, delivery("old"), effect("old"), at(0))
    [new] = await claim_delivery(conn, delivery("new"), [effect("new")], now=at(0))
    assert old["outcome"] == "accepted" and old["job_id"] is not None
    assert isinstance(new, Accepted)
    # Same event shape, same clock: the rows differ only in the key, the ids and the request.
    assert await rows_of(conn, "old") == await rows_of(conn, "new")

    # Mixed, as during the roll: an old gateway's retry of a key the new one claimed is a duplicate, and the
    # other way round; another payload under the key is a reject whichever release sees it.
    again_old = await previous_claim(conn, delivery("new"), effect("new"), at(1))
    [again_new] = await claim_delivery(conn, delivery("old"), [effect("old")], now=at(1))
    assert (again_old["outcome"], again_old["delivery_count"]) == ("duplicate", 2)
    assert isinstance(again_new, Duplicate) and again_new.delivery_count == 2
    other_old = await previous_claim(conn, delivery("new", amount=7), effect("new"), at(2))
    [other_new] = await claim_delivery(conn, delivery("old", amount=7), [effect("old")], now=at(2))
    assert (other_old["outcome"], other_old["held_fingerprint"]) == ("rejected", delivery("new").fingerprint)
    assert isinstance(other_new, Rejected) and other_new.held_fingerprint == delivery("old").fingerprint
    assert await rows_of(conn, "old") == await rows_of(conn, "new")
    counts = await (
        await conn.execute("SELECT delivery_count, reject_count FROM effects ORDER BY effect_key")
    ).fetchall()
    assert counts == [{"delivery_count": 2, "reject_count": 1}] * 2


async def lease(conn: db.Conn, kind: str, now: datetime, ttl: float = 10) -> jobs.Lease:
    [leased] = await jobs.fetch_and_lease(conn, owner="w", kinds={kind: ttl}, limit=1, now=now)
    return leased


async def job_state(conn: db.Conn, job_id: int) -> dict[str, Any]:
    row = await (
        await conn.execute(
            "SELECT state::text AS state, terminal_reason, terminal_by, releases_without_commit,"
            " committed_since_release, attempt, lease_owner, finished_at FROM jobs WHERE id = %s",
            (job_id,),
        )
    ).fetchone()
    assert row is not None
    return dict(row)


async def test_the_previous_hand_back_applies_the_same_release_rule(conn: db.Conn) -> None:
    # Two hand-backs in a row without a commit at threshold 2: re-queued, then parked as poison; the previous
    # release's statement (calling the unversioned job_release_verdict) and this release's agree at each.
    [old] = await claim_delivery(conn, delivery("old"), [effect("old", kind="old")], now=at(0))
    [new] = await claim_delivery(conn, delivery("new"), [effect("new", kind="new")], now=at(0))
    assert isinstance(old, Accepted) and isinstance(new, Accepted)
    for n, expected in enumerate(("pending", "parked")):
        old_lease, new_lease = await lease(conn, "old", at(n)), await lease(conn, "new", at(n))
        old_row = await (
            await conn.execute(
                PREVIOUS["job_hand_back_if_leased"],
                {
                    "job_id": old.job_id,
                    "lease_token": old_lease.lease_token,
                    "poison_threshold": 2,
                    "by": "w",
                    "now": at(n),
                },
            )
        ).fetchone()
        reached = await jobs.hand_back(
            conn, new.job_id, new_lease.lease_token, poison_threshold=2, by="w", now=at(n)
        )
        assert old_row is not None
        assert (old_row["state"], old_row["terminal_reason"]) == (reached.state, reached.reason)
        assert reached.state == expected
        assert await job_state(conn, old.job_id) == await job_state(conn, new.job_id)
    assert reached.reason == "poison: handed back 2 times without committing"


async def test_the_previous_lease_rescuer_applies_the_same_release_rule(conn: db.Conn) -> None:
    # An expired lease of a job whose orphan policy is park: parked as orphaned by either release.
    [old] = await claim_delivery(
        conn, delivery("old"), [effect("old", kind="old", orphan_policy="park")], now=at(0)
    )
    [new] = await claim_delivery(
        conn, delivery("new"), [effect("new", kind="new", orphan_policy="park")], now=at(0)
    )
    assert isinstance(old, Accepted) and isinstance(new, Accepted)
    await lease(conn, "old", at(0))
    async with conn.transaction():
        old_rows = await (
            await conn.execute(
                PREVIOUS["job_rescue_expired_batch"],
                {"now": at(20), "limit": 10, "poison_threshold": 3, "kinds": [], "poison_thresholds": []},
            )
        ).fetchall()
    await lease(conn, "new", at(20))
    result = await LeaseRescuer(RescuerConfig(poison_threshold=3)).run_once(conn, now=at(40))
    assert [(r["id"], r["state"], r["terminal_reason"]) for r in old_rows] == [
        (old.job_id, "parked", "orphaned: lease expired and orphan_policy is park")
    ]
    assert [(r.job_id, r.state, r.reason) for r in result.repaired] == [
        (new.job_id, "parked", "orphaned: lease expired and orphan_policy is park")
    ]
    old_state, new_state = await job_state(conn, old.job_id), await job_state(conn, new.job_id)
    assert old_state.pop("finished_at") == at(20) and new_state.pop("finished_at") == at(40)
    assert old_state == new_state


async def one(conn: db.Conn, query: Any, params: dict[str, Any]) -> Any:
    row = await (await conn.execute(query, params)).fetchone()
    assert row is not None
    return row


async def test_the_previous_partition_statements_work_beside_the_new_keeper(conn: db.Conn) -> None:
    # An old keeper creates a partition the new one drops, and the other way round; a delivery claimed into
    # each goes with it.
    day = datetime(2100, 1, 1, tzinfo=UTC)
    ranges = [
        {
            "parent": "deliveries",
            "range_from": day + timedelta(days=n),
            "range_to": day + timedelta(days=n + 1),
        }
        for n in range(2)
    ]
    old_name = (await one(conn, PREVIOUS["history_partition_create_for_range"], ranges[0]))["name"]
    new_name = (await one(conn, Q["history_partition_create_for_range"], ranges[1]))["name"]
    assert (old_name, new_name) == ("deliveries_p21000101_000000", "deliveries_p21000102_000000")
    await claim_delivery(conn, delivery("first"), [effect("first")], now=day)
    await previous_claim(conn, delivery("second"), effect("second"), day + timedelta(days=1))
    assert (await one(conn, Q["history_partition_drop_registered"], {"name": old_name}))["rows"] == 1
    assert (await one(conn, PREVIOUS["history_partition_drop_registered"], {"name": new_name}))["rows"] == 1
    left = await (
        await conn.execute("SELECT name FROM history_partitions WHERE range_from >= %s", (day,))
    ).fetchall()
    assert left == []


async def test_the_previous_fetch_opens_attempts_that_carry_the_jobs_tenant(conn: db.Conn) -> None:
    # The previous release's fetch names no tenant for job_attempts (migration 0022 added the column): 0022's
    # trigger fills it from the job, so a draining worker of that release can still lease.
    arrived = dataclasses.replace(delivery("drain"), tenant="acme")
    [claimed] = await claim_delivery(conn, arrived, [effect("drain", kind="drain")], now=at(0))
    assert isinstance(claimed, Accepted)
    params = {"owner": "old", "kinds": ["drain"], "ttls": [30.0], "limit": 5, "scan_limit": 100, "now": at(1)}
    [leased] = await (await conn.execute(PREVIOUS["job_fetch_and_lease"], params)).fetchall()
    assert leased["id"] == claimed.job_id
    attempts = await (
        await conn.execute("SELECT tenant, worker FROM job_attempts WHERE job_id = %s", (claimed.job_id,))
    ).fetchall()
    assert attempts == [{"tenant": "acme", "worker": "old"}]


async def test_the_previous_step_statement_no_longer_finds_its_key(conn: db.Conn) -> None:
    # What 0022 does not keep: the previous release's step statements conflict on (effect_id, name), a key that
    # is now (effect_id, name, tenant). Recorded here so the upgrade note (docs/migrations.md: stop the
    # previous workers first) stays true.
    [claimed] = await claim_delivery(conn, delivery("step"), [effect("step", kind="step")], now=at(0))
    assert isinstance(claimed, Accepted)
    leased = await lease(conn, "step", at(1))
    with pytest.raises(psycopg.errors.InvalidColumnReference):
        await conn.execute(
            BEFORE_0022["step_record_if_leased"],
            {
                "job_id": claimed.job_id,
                "lease_token": leased.lease_token,
                "name": "capture",
                "idempotency_key": "k",
                "status": "succeeded",
                "result": None,
                "error": None,
                "now": at(2),
            },
        )

"""The upgrade from the schema before retention (0001-0005) to partitioned history keeps every row, and the
ledger works afterwards: a ledger populated through the real code paths, then migrated, then used.

Deliveries, rejects and signature failures are written on the old schema by the claim statement of that release
(tests/data/claims_before_0006.sql: today's batched statement names columns the old schema lacks); jobs'
leases, steps and outcomes after 0006 (the fetch now skips paused kinds, a table 0006 adds), before 0007-0008.
"""

from __future__ import annotations

import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

from effectgate.gateway.operator import reporting
from effectgate.ledger import db, jobs
from effectgate.ledger.claims import (
    Accepted,
    Delivery,
    Duplicate,
    EffectRequest,
    claim_delivery,
    record_signature_failure,
)
from effectgate.ledger.jobs import steps
from effectgate.ledger.maintenance.partitions import PartitionKeeper
from effectgate.ledger.maintenance.scheduler import Reconciler
from effectgate.ledger.migrate import MIGRATIONS_DIR, discover, migrate
from effectgate.ledger.queries import parse
from effectgate.ledger.reports import DUPLICATES, KEY_CONFLICTS
from tests.integration.ledger.before_0022 import statements_before_0022
from tests.integration.ledger.maintenance.retention_rows import delivery

pytestmark = pytest.mark.anyio

TABLES = ("effects", "jobs", "job_attempts", "steps", "deliveries", "effect_rejects", "signature_failures")
FIRST_OF_MINE = "0006"


async def snapshot(conn: db.Conn) -> dict[str, list[dict[str, Any]]]:
    out = {}
    for table in TABLES:
        rows = await (await conn.execute(f"SELECT to_jsonb(t) AS r FROM {table} t")).fetchall()  # type: ignore[arg-type]
        out[table] = sorted((r["r"] for r in rows), key=lambda r: sorted((k, str(v)) for k, v in r.items()))
    return out


def only_keys(after: list[dict[str, Any]], like: list[dict[str, Any]]) -> list[dict[str, Any]]:
    keys = set(like[0]) if like else set()
    trimmed = [{k: v for k, v in row.items() if k in keys} for row in after]
    return sorted(trimmed, key=lambda r: sorted((k, str(v)) for k, v in r.items()))


OLD_CLAIM = parse((Path(__file__).parents[2] / "data" / "claims_before_0006.sql").read_text())["effect_claim"]
# The fetch of a release before 0020 (today's reads jobs.version, which that migration adds).
OLD_FETCH = parse((Path(__file__).parents[2] / "data" / "previous_release_sql" / "jobs.sql").read_text())[
    "job_fetch_and_lease"
]


async def old_claim(conn: db.Conn, arrived: Delivery, effect: EffectRequest, now: datetime) -> str:
    """One effect claimed as the release before 0006 claimed it; returns the outcome."""
    params = {
        "request_id": arrived.request_id,
        "tenant": arrived.tenant,
        "source": arrived.source,
        "event_id": arrived.event_id,
        "event_type": arrived.event_type,
        "fingerprint": arrived.fingerprint,
        "secret_index": arrived.secret_index,
        "now": now,
        "effect_key": effect.effect_key,
        "handler": effect.handler,
        "payload": Jsonb(arrived.payload),
        "max_attempts": effect.max_attempts,
        "orphan_policy": effect.orphan_policy,
        "lock_key": effect.lock_key,
    }
    row = await (await conn.execute(sql.SQL(OLD_CLAIM), params)).fetchone()  # type: ignore[arg-type]
    assert row is not None
    return str(row["outcome"])


async def populate_arrivals(conn: db.Conn, now: datetime) -> None:
    """What arrived, written by the claim statement of the release before 0006, on its schema."""
    for n in range(20):
        key = f"order-{n}"
        assert await old_claim(conn, delivery(key), EffectRequest(key, "k", 3, "redrive"), now) == "accepted"
    for n in range(5):  # duplicates and conflicts
        effect = EffectRequest(f"order-{n}", "k", 3, "redrive")
        assert await old_claim(conn, delivery(f"order-{n}"), effect, now) == "duplicate"
        other = delivery(f"order-{n}", payload={"other": n})
        assert await old_claim(conn, other, effect, now) == "rejected"
    # An unmatched delivery, recorded as the code before 0008 did (that statement now also keeps the payload,
    # in a column the old schema does not have).
    await conn.execute(
        "INSERT INTO deliveries (request_id, received_at, tenant, source, event_id, event_type, outcome, "
        "fingerprint) VALUES ('r-unmatched', %s, 'default', 'stripe', 'evt-x', 'thing.happened', 'unmatched', 'f')",
        (now,),
    )
    for reason in ("signature_invalid", "signature_missing"):
        await record_signature_failure(
            conn, source="stripe", reason=reason, size=3, body_sha256="0" * 64, detail="d", now=now
        )


async def populate_work(conn: db.Conn, now: datetime) -> None:
    """Leases, steps and outcomes, written by the worker's code (its fetch reads paused_kinds, from 0006)."""
    params = {"owner": "w", "kinds": ["k"], "ttls": [30.0], "limit": 10, "scan_limit": 1000, "now": now}
    for lease in await (await conn.execute(OLD_FETCH, params)).fetchall():
        with statements_before_0022():  # steps and attempts without tenant, as before 0022
            await steps.record(
                conn,
                job_id=lease["id"],
                lease_token=lease["lease_token"],
                name="capture",
                idempotency_key=f"idem-{lease['id']}",
                status="succeeded",
                result={"ok": True},
                now=now,
            )
            await jobs.finish(conn, lease["id"], lease["lease_token"], state="succeeded", by="w", now=now)


async def test_the_upgrade_keeps_every_row_and_the_ledger_works_after_it(
    empty_db_url: str, tmp_path: Path
) -> None:
    def up_to(name: str, last: str) -> Path:
        directory = tmp_path / name
        directory.mkdir()
        for migration in discover():
            if migration.name < last:
                shutil.copyfile(str(MIGRATIONS_DIR.joinpath(migration.name)), directory / migration.name)
        return directory

    before_mine, before_history = up_to("before", FIRST_OF_MINE), up_to("rules", "0007")
    now = datetime.now(UTC) - timedelta(hours=1)
    conn = await db.connect(empty_db_url)
    async with conn:
        applied = await migrate(conn, before_mine)
        assert applied and max(applied) < FIRST_OF_MINE
        await populate_arrivals(conn, now)
        assert await migrate(conn, before_history) == ["0006_job_release_rule_and_pauses.sql"]
        await populate_work(conn, now)
        before = await snapshot(conn)
        assert {t: len(rows) for t, rows in before.items()} == {
            "effects": 20,
            "jobs": 20,
            "job_attempts": 10,
            "steps": 10,
            "deliveries": 31,
            "effect_rejects": 5,
            "signature_failures": 2,
        }

        mine = await migrate(conn)
        assert mine and min(mine) >= FIRST_OF_MINE
        after = await snapshot(conn)
        for table in TABLES:
            assert only_keys(after[table], before[table]) == before[table], table
        # The columns the upgrade added are empty on the old rows.
        assert {row["payload"] for row in after["deliveries"]} == {None}
        kinds = await (
            await conn.execute(
                "SELECT relname, relkind FROM pg_class WHERE relname = ANY(%s) ORDER BY relname",
                (["deliveries", "effect_rejects", "signature_failures", "deliveries_legacy"],),
            )
        ).fetchall()
        assert {r["relname"]: r["relkind"] for r in kinds} == {
            "deliveries": "p",
            "deliveries_legacy": "r",
            "effect_rejects": "p",
            "signature_failures": "p",
        }

        # The ledger works: old keys are duplicates, new ones claimed with ids after the old ones.
        [again] = await claim_delivery(
            conn, delivery("order-1"), [EffectRequest("order-1", "k", 3, "redrive")]
        )
        assert isinstance(again, Duplicate) and again.delivery_count == 3
        [new] = await claim_delivery(
            conn, delivery("order-new"), [EffectRequest("order-new", "k", 3, "redrive")]
        )
        assert isinstance(new, Accepted)
        ids = await (
            await conn.execute("SELECT max(id) AS m, count(DISTINCT id) AS n FROM deliveries")
        ).fetchone()
        assert ids is not None and (ids["m"], ids["n"]) == (33, 33)
        window = {"since": (now - timedelta(hours=1)).isoformat()}
        assert len((await reporting.fetch(conn, DUPLICATES, window)).items) == 5
        assert len((await reporting.fetch(conn, KEY_CONFLICTS, window)).items) == 5
        # Maintenance runs on it: partitions made ahead; the legacy partition is kept inside its window.
        result = await Reconciler().run_once(conn)
        assert result.service_errors == {} and result.partitions.created
        assert result.partitions.dropped == {}
        # And once the legacy rows are past the history window, the legacy partition is dropped whole.
        far = datetime.now(UTC) + timedelta(days=200)
        dropped = await PartitionKeeper().run_once(conn, now=far)
        assert dropped.dropped["deliveries_legacy"] == 33
        assert dropped.dropped["effect_rejects_legacy"] == 5
        assert dropped.dropped["signature_failures_legacy"] == 2

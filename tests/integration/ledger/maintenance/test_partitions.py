"""The history tables' time partitions roll: made ahead, filled, dropped whole once expired (no DELETE)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from effectgate.ledger import db
from effectgate.ledger.claims import record_signature_failure
from effectgate.ledger.maintenance import retention
from effectgate.ledger.maintenance.partitions import PartitionConfig, PartitionKeeper, floor_to
from effectgate.ledger.maintenance.retention import RetentionConfig, RetentionKeeper
from tests.integration.jobs_and_workers import scalar
from tests.integration.ledger.maintenance.retention_rows import deliver, finished

pytestmark = [pytest.mark.anyio, pytest.mark.rolled_back]

HOUR = 3600.0
T = datetime(2031, 6, 1, 0, 0, tzinfo=UTC)


def hours(n: float) -> datetime:
    return T + timedelta(hours=n)


async def partitions(conn: db.Conn, parent: str) -> list[str]:
    rows = await (
        await conn.execute(
            "SELECT name FROM history_partitions WHERE parent = %s AND range_from >= %s ORDER BY range_from",
            (parent, T - timedelta(days=1)),
        )
    ).fetchall()
    return [r["name"] for r in rows]


async def where(conn: db.Conn, key: str) -> list[str]:
    rows = await (
        await conn.execute(
            "SELECT tableoid::regclass::text AS part FROM deliveries WHERE effect_key = %s ORDER BY id",
            (key,),
        )
    ).fetchall()
    return [r["part"] for r in rows]


def keeper(history_hours: float = 3) -> PartitionKeeper:
    windows = RetentionConfig(
        payloads=HOUR, history=history_hours * HOUR, signature_failures=history_hours * HOUR
    )
    return PartitionKeeper(PartitionConfig(interval=HOUR, premake=2), windows)


async def test_partitions_are_made_ahead_filled_and_dropped_whole(conn: db.Conn) -> None:
    first = await keeper().run_once(conn, now=hours(0.5))
    assert await partitions(conn, "deliveries") == [
        "deliveries_p20310601_000000",
        "deliveries_p20310601_010000",
        "deliveries_p20310601_020000",
    ]
    assert len(first.created) == 9  # three tables, each from the current hour to two hours ahead
    await deliver(conn, "early", hours(0.6))
    await deliver(conn, "early", hours(1.2))  # its duplicate, an hour later
    assert await where(conn, "early") == ["deliveries_p20310601_000000", "deliveries_p20310601_010000"]

    # Each tick makes what is missing ahead; nothing is dropped while inside the window.
    later = await keeper().run_once(conn, now=hours(2.5))
    assert later.created == [
        "deliveries_p20310601_030000",
        "deliveries_p20310601_040000",
        "effect_rejects_p20310601_030000",
        "effect_rejects_p20310601_040000",
        "signature_failures_p20310601_030000",
        "signature_failures_p20310601_040000",
    ]
    assert later.dropped == {}
    # 00:00-01:00 is wholly older than the 3-hour window at 04:00 (not at 03:59).
    assert (await keeper().run_once(conn, now=hours(3.99))).dropped == {}
    rolled = await keeper().run_once(conn, now=hours(4))
    assert rolled.dropped == {
        "deliveries_p20310601_000000": 1,
        "effect_rejects_p20310601_000000": 0,
        "signature_failures_p20310601_000000": 0,
    }
    assert await where(conn, "early") == ["deliveries_p20310601_010000"]
    exists = await scalar(conn, "SELECT to_regclass('deliveries_p20310601_000000') IS NOT NULL")
    assert exists is False  # dropped, not emptied
    assert (await retention.purge_totals(conn))["deliveries"] >= 1


async def test_the_row_deletes_leave_time_partitions_to_be_dropped(conn: db.Conn) -> None:
    await keeper().run_once(conn, now=hours(0))
    await deliver(conn, "a", hours(0.5))
    await record_signature_failure(
        conn, source="s", reason="signature_invalid", size=1, body_sha256="0" * 64, detail="x", now=hours(0.5)
    )
    # At 03:45 the row is past its 3-hour window, but its partition (to 01:00) is not wholly expired yet: the
    # retention keeper does not DELETE it, the partition keeper drops it at 04:00.
    config = RetentionConfig(payloads=HOUR, history=3 * HOUR, signature_failures=3 * HOUR)
    result = await RetentionKeeper(config).run_once(conn, now=hours(3.75))
    assert (result.purged["deliveries"], result.purged["signature_failures"]) == (0, 0)
    assert await where(conn, "a") == ["deliveries_p20310601_000000"]
    dropped = await keeper().run_once(conn, now=hours(4))
    assert dropped.dropped["deliveries_p20310601_000000"] == 1
    assert dropped.dropped["signature_failures_p20310601_000000"] == 1


async def test_rows_default_holds_for_a_new_range_are_moved_into_it(conn: db.Conn) -> None:
    # A delivery from a clock ahead of every partition lands in DEFAULT; the partition made later takes it.
    await deliver(conn, "ahead", hours(10.5))
    assert await where(conn, "ahead") == ["deliveries_default"]
    await keeper().run_once(conn, now=hours(9.5))
    assert await where(conn, "ahead") == ["deliveries_p20310601_100000"]


async def test_finished_jobs_rows_in_partitions_survive_payload_purges(conn: db.Conn) -> None:
    # Payload purges are UPDATEs on effects/steps and rejects, whatever partition a reject is in.
    await keeper().run_once(conn, now=hours(0))
    await finished(conn, "k", hours(0.1))
    await deliver(conn, "k", hours(0.2), payload={"other": 1})  # a reject, in the 00:00 partition
    result = await RetentionKeeper(RetentionConfig(payloads=HOUR, history=3 * HOUR)).run_once(
        conn, now=hours(2)
    )
    assert (result.purged["effects.payload"], result.purged["effect_rejects.payload"]) == (1, 1)


def test_partition_config_is_validated() -> None:
    for bad in ({"interval": 59}, {"premake": 0}, {"lock_timeout": 0}):
        with pytest.raises(ValueError):
            PartitionConfig(**bad)  # type: ignore[arg-type]
    assert floor_to(hours(1.5), HOUR) == hours(1)


async def test_a_partition_whose_table_is_busy_waits_for_the_next_pass_and_the_others_go_on(
    db_url: str,
) -> None:
    from tests.integration.jobs_and_workers import connected

    quick = PartitionKeeper(
        PartitionConfig(interval=HOUR, premake=2, lock_timeout=0.2),
        RetentionConfig(payloads=HOUR, history=3 * HOUR),
    )
    async with connected(db_url) as conn, connected(db_url) as reader:
        async with reader.transaction():
            # A long reader of deliveries (a report, say) holds a lock the DDL must wait for.
            await reader.execute("LOCK TABLE deliveries IN ACCESS SHARE MODE")
            result = await quick.run_once(conn, now=hours(0.5))
            # In 2031 the legacy partition (rows from before the upgrade) has expired too: its drop waits as well.
            assert result.waited == ["deliveries_legacy", f"deliveries@{hours(0).isoformat()}"]
            assert not any(name.startswith("deliveries_") for name in result.created)
            assert len([n for n in result.created if n.startswith("effect_rejects_")]) == 3
        # The reader is gone: the next pass makes what waited.
        again = await quick.run_once(conn, now=hours(0.5))
        assert (again.waited, list(again.dropped)) == ([], ["deliveries_legacy"])
        assert again.created == [
            "deliveries_p20310601_000000",
            "deliveries_p20310601_010000",
            "deliveries_p20310601_020000",
        ]


async def test_the_row_delete_plan_reaches_only_the_legacy_and_default_partitions(conn: db.Conn) -> None:
    from effectgate.ledger.queries import Q

    await keeper().run_once(conn, now=hours(0.5))
    params = {"before": hours(0), "limit": 10, "tenant": None}  # the first time partition's start
    plan = await (
        await conn.execute("EXPLAIN (FORMAT JSON) " + Q["deliveries_delete_expired"], params)  # type: ignore[operator]
    ).fetchone()
    assert plan is not None

    def relations(node: dict[str, object]) -> set[str]:
        found = {str(node["Relation Name"])} if "Relation Name" in node else set()
        for child in node.get("Plans", []):  # type: ignore[attr-defined]
            found |= relations(child)
        return found

    def cte(node: dict[str, object]) -> dict[str, object] | None:
        if node.get("Subplan Name") == "CTE due":
            return node
        for child in node.get("Plans", []):  # type: ignore[attr-defined]
            hit = cte(child)
            if hit is not None:
                return hit
        return None

    selection = cte(plan["QUERY PLAN"][0]["Plan"])
    assert selection is not None
    # What the delete looks for is read from DEFAULT (the legacy partition expired by 2031) and never from a
    # live time partition; the DELETE then reaches each chosen row by (id, received_at).
    assert relations(selection) == {"deliveries_default"}

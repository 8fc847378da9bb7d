"""Unmatched deliveries keep their payload for the payload window and can be replayed once a handler exists,
under the normal duplicate and conflict rules."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from effectgate.handlers.actions.replay import replay_unmatched
from effectgate.handlers.registry import Registry
from effectgate.ledger import db
from effectgate.ledger.claims import claim_delivery
from effectgate.ledger.maintenance.retention import DAY, RetentionConfig, RetentionKeeper
from tests.integration.handlers.actions.fulfil_registry import fulfil_registry, noop
from tests.integration.jobs_and_workers import scalar
from tests.integration.ledger.maintenance.retention_rows import day, delivery

pytestmark = [pytest.mark.anyio, pytest.mark.rolled_back]


async def test_an_unmatched_delivery_is_claimed_by_a_replay_once_a_handler_exists(conn: db.Conn) -> None:
    for n in range(3):
        assert await claim_delivery(conn, delivery(f"k{n}"), [], now=day(0)) == []
    assert await claim_delivery(conn, delivery("other", source="github"), [], now=day(0)) == []
    kept = await scalar(
        conn, "SELECT count(*) FROM deliveries WHERE outcome = 'unmatched' AND payload IS NOT NULL"
    )
    assert kept == 4

    # With no handler yet, a replay claims nothing.
    empty = await replay_unmatched(
        conn, by="cli:test", registry=Registry(), source="stripe", since=day(-1), now=day(1)
    )
    assert (empty.deliveries, empty.still_unmatched, dict(empty.outcomes)) == (3, 3, {})

    first = await replay_unmatched(
        conn, by="cli:test", registry=fulfil_registry(), source="stripe", since=day(-1), now=day(1)
    )
    assert (first.deliveries, dict(first.outcomes)) == (3, {"accepted": 3})
    assert await scalar(conn, "SELECT count(*) FROM jobs WHERE kind = 'fulfil'") == 3
    row = await (await conn.execute("SELECT * FROM effects WHERE effect_key = 'order:k0'")).fetchone()
    assert row is not None and (row["event_id"], row["payload"]["key"]) == ("evt-k0", "k0")

    # Again: the normal rules make it a duplicate, never a second job.
    again = await replay_unmatched(
        conn, by="cli:test", registry=fulfil_registry(), source="stripe", since=day(-1), now=day(2)
    )
    assert dict(again.outcomes) == {"duplicate": 3}
    assert await scalar(conn, "SELECT count(*) FROM jobs WHERE kind = 'fulfil'") == 3
    # The window filters: nothing arrived after day 0.5.
    assert (
        await replay_unmatched(
            conn, by="cli:test", registry=fulfil_registry(), source="stripe", since=day(0.5), now=day(2)
        )
    ).deliveries == 0


async def test_a_replayed_key_held_by_another_payload_is_a_conflict(conn: db.Conn) -> None:
    await claim_delivery(conn, delivery("k9", payload={"key": "k9", "v": 1}), [], now=day(0))
    from effectgate.ledger.claims import EffectRequest

    # Meanwhile the key was claimed by a different payload (a live delivery after the handler was deployed).
    held = delivery("k9", payload={"key": "k9", "v": 2})
    await claim_delivery(conn, held, [EffectRequest("order:k9", "fulfil", 3, "redrive")], now=day(0.5))
    result = await replay_unmatched(
        conn, by="cli:test", registry=fulfil_registry(), source="stripe", since=day(-1), now=day(1)
    )
    assert dict(result.outcomes) == {"rejected": 1}


async def test_unmatched_payloads_age_out_with_the_payload_window(conn: db.Conn) -> None:
    await claim_delivery(conn, delivery("late"), [], now=day(0))
    config = RetentionConfig(payloads=1 * DAY, history=10 * DAY)
    inside = await RetentionKeeper(config).run_once(conn, now=day(1) - timedelta(seconds=1))
    assert inside.purged["deliveries.payload"] == 0
    result = await RetentionKeeper(config).run_once(conn, now=day(1) + timedelta(seconds=1))
    assert (result.purged["deliveries.payload"], result.purged["deliveries"]) == (1, 0)
    gone = await replay_unmatched(
        conn, by="cli:test", registry=fulfil_registry(), source="stripe", since=day(-1), now=day(2)
    )
    assert gone.deliveries == 0


HANDLERS = """
from effectgate.handlers.registry import REGISTRY


@REGISTRY.effect(source="stripe", events=["thing.*"], key=lambda ev: "order:" + ev.payload["key"], name="late_fulfil")
async def late_fulfil(ctx, ev):
    return None
"""


def test_the_cli_replays_unmatched_deliveries_of_a_source(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import asyncio
    import json

    from effectgate.handlers.registry import REGISTRY
    from tests.integration.in_process_cli import run_cli
    from tests.integration.jobs_and_workers import connected

    async def arrive() -> None:
        async with connected(db_url) as c:
            for n in range(2):
                await claim_delivery(c, delivery(f"cli{n}"), [])

    asyncio.run(arrive())
    (tmp_path / "replay_handlers_mod.py").write_text(HANDLERS)
    (tmp_path / "eg.toml").write_text(
        '[handlers]\nmodules = ["replay_handlers_mod"]\n[sources.stripe]\nscheme = "stripe"\nsecrets = ["S"]\n'
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(REGISTRY, "_kinds", {})  # the module registers into a registry this test throws away
    monkeypatch.setenv("S", "whsec_x")
    monkeypatch.setenv("DATABASE_URL", db_url)
    config = ["--config", str(tmp_path / "eg.toml")]
    code, out, _ = run_cli(
        capsys,
        "ledger",
        "replay",
        "--unmatched",
        "--source",
        "stripe",
        "--since",
        "1h",
        *config,
        "--format",
        "json",
    )
    assert code == 0 and json.loads(out) == {
        "deliveries": 2,
        "still_unmatched": 0,
        "key_failed": 0,
        "tenant_unusable": 0,
        "outcomes": {"accepted": 2},
    }
    code, out, _ = run_cli(
        capsys, "ledger", "replay", "--unmatched", "--source", "stripe", "--since", "1h", *config
    )
    assert code == 0 and "effects duplicate: 2" in out
    code, _, err = run_cli(
        capsys, "ledger", "replay", "--unmatched", "--source", "nope", "--since", "1h", *config
    )
    assert code == 2 and "--source" in err


async def test_an_unmatched_delivery_sent_again_is_counted_not_kept_again(conn: db.Conn) -> None:
    # One captured delivery that no effect claims, replayed: one row with its payload, and a count.
    for _ in range(5):
        assert await claim_delivery(conn, delivery("same"), [], now=day(0)) == []
    await claim_delivery(conn, delivery("same", tenant="other"), [], now=day(0))
    await claim_delivery(conn, delivery("same", source="github"), [], now=day(0))
    rows = await (
        await conn.execute(
            "SELECT tenant, source, count(*) AS n FROM deliveries WHERE outcome = 'unmatched'"
            " GROUP BY tenant, source ORDER BY tenant, source"
        )
    ).fetchall()
    assert [(r["tenant"], r["source"], r["n"]) for r in rows] == [
        ("default", "github", 1),
        ("default", "stripe", 1),
        ("other", "stripe", 1),
    ]
    counted = await scalar(
        conn, "SELECT delivery_count FROM unmatched_deliveries WHERE tenant = 'default' AND source = 'stripe'"
    )
    assert counted == 5
    # The one kept row still replays, once.
    result = await replay_unmatched(
        conn, by="cli:test", registry=fulfil_registry(), source="stripe", since=day(-1), now=day(1)
    )
    assert (result.deliveries, dict(result.outcomes)) == (2, {"accepted": 2})


async def test_a_replayed_kind_with_fingerprint_fields_then_its_genuine_retry_is_a_duplicate(
    conn: db.Conn,
) -> None:
    """The replay and the ingress plan with one function: a kind that names fingerprint fields is claimed by a
    replay under those fields, so the provider's genuine retry of the same event afterwards is a duplicate
    (the replay used to claim it under the whole payload's fingerprint, and the retry was rejected)."""
    from effectgate.gateway.config import parse
    from effectgate.gateway.ingress.deliveries import plan
    from effectgate.gateway.signatures import Event as SignedEvent
    from effectgate.gateway.signatures import Verified
    from effectgate.ledger.claims import Delivery

    payload = {"key": "fp1", "amount": 500, "currency": "eur"}
    await claim_delivery(conn, delivery("fp1", payload=payload), [], now=day(0))
    reg = Registry()
    reg.effect(
        source="stripe",
        events=["thing.*"],
        key=lambda ev: f"order:{ev.payload['key']}",
        name="fulfil",
        fingerprint=["/amount", "/currency"],
    )(noop)
    replayed = await replay_unmatched(
        conn, by="cli:test", registry=reg, source="stripe", since=day(-1), now=day(1)
    )
    assert dict(replayed.outcomes) == {"accepted": 1}

    config = parse('[sources.stripe]\nscheme = "stripe"\nsecrets = ["S"]\n', env={"S": "whsec_x"})
    verified = Verified(events=(SignedEvent("evt-fp1", "thing.happened", payload),), secret_index=0)
    [(retry, effects)], unmet = plan(config.sources["stripe"], reg, verified, "retry-1")
    assert isinstance(retry, Delivery) and unmet == []
    [outcome] = await claim_delivery(conn, retry, effects, now=day(1))
    assert outcome.outcome == "duplicate"
    assert await scalar(conn, "SELECT count(*) FROM effect_rejects") == 0

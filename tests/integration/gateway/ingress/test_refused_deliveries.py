"""Refused deliveries are kept and replayed (issue 37): a verified delivery that cannot become effects is a row
with its body and reason, and becomes exactly one effect once the cause is fixed and it is replayed."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from effectgate.gateway.app import create_app
from effectgate.gateway.config import Config, parse
from effectgate.handlers.actions.replay import replay_refused
from effectgate.handlers.event import Event
from effectgate.handlers.registry import Registry
from effectgate.ledger import db
from tests.integration.gateway.ingress.ingress_app import CONFIG, ENV, post, rows, stripe_headers

pytestmark = pytest.mark.anyio


async def _noop(ctx: Any, ev: Event) -> None:
    return None


def by_order(registry: Registry, source: str = "lenient") -> Registry:
    # The shop's first key: the order id in the intent's metadata, absent on an intent made in the Dashboard.
    registry.effect(
        source=source,
        events=["payment_intent.succeeded"],
        key=lambda ev: f"order-paid:{ev.payload['data']['object']['metadata']['order_id']}",
        name="shop.fulfil",
    )(_noop)
    return registry


def by_intent(registry: Registry, source: str = "lenient") -> Registry:
    # The fix: keyed on the intent, which every intent has.
    registry.effect(
        source=source,
        events=["payment_intent.succeeded"],
        key=lambda ev: f"intent-paid:{ev.payload['data']['object']['id']}",
        name="shop.fulfil",
    )(_noop)
    return registry


def intent_event(event_id: str, intent: str, metadata: dict[str, str], account: str | None = None) -> bytes:
    event: dict[str, Any] = {
        "id": event_id,
        "type": "payment_intent.succeeded",
        "data": {"object": {"id": intent, "metadata": metadata}},
    }
    if account is not None:
        event["account"] = account
    return json.dumps(event).encode()


@pytest.fixture
def config() -> Config:
    return parse(CONFIG, env=ENV)


async def deliver(
    db_url: str, config: Config, registry: Registry, *bodies: tuple[str, bytes]
) -> list[httpx.Response]:
    app = create_app(config, registry, db_url)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as c:
            return list(await asyncio.gather(*(post(c, s, b, stripe_headers(b)) for s, b in bodies)))


async def test_an_unkeyable_delivery_fixed_and_replayed_becomes_one_effect(
    db_url: str, conn: db.Conn, config: Config
) -> None:
    body = intent_event("evt_dash", "pi_dash", {})  # an intent created in the Dashboard: no order id
    [answer] = await deliver(db_url, config, by_order(Registry()), ("lenient", body))
    assert (answer.status_code, answer.json()["error"], answer.json()["kept"]) == (
        200,
        "effect_key_failed",
        True,
    )
    assert await rows(conn, "SELECT * FROM effects") == []

    since = datetime.now(UTC) - timedelta(hours=1)
    tenant_of = config.sources["lenient"].tenant_rule.tenant_of
    # Replayed before the fix: it fails the same way, and stays to be replayed again.
    still = await replay_refused(
        conn, by="cli:test", registry=by_order(Registry()), source="lenient", tenant_of=tenant_of, since=since
    )
    assert (still.deliveries, still.key_failed, dict(still.outcomes)) == (1, 1, {})

    fixed = by_intent(Registry())
    result = await replay_refused(
        conn, by="cli:test", registry=fixed, source="lenient", tenant_of=tenant_of, since=since
    )
    assert (result.deliveries, dict(result.outcomes)) == (1, {"accepted": 1})
    # Marked replayed: a second replay finds nothing, and the report shows when and to what.
    again = await replay_refused(
        conn, by="cli:test", registry=fixed, source="lenient", tenant_of=tenant_of, since=since
    )
    assert again.deliveries == 0
    [kept] = await rows(conn, "SELECT refusal FROM deliveries WHERE outcome = 'refused'")
    assert kept["refusal"]["replay_outcomes"] == [
        {"key": "intent-paid:pi_dash", "handler": "shop.fulfil", "outcome": "accepted"}
    ]
    # The provider's own retry after the fix is a duplicate of the replayed claim, not a second effect.
    [retry] = await deliver(db_url, config, fixed, ("lenient", body))
    assert retry.status_code == 200 and retry.json()["effects"][0]["outcome"] == "duplicate"
    effects = await rows(conn, "SELECT effect_key, delivery_count FROM effects")
    assert effects == [{"effect_key": "intent-paid:pi_dash", "delivery_count": 2}]
    assert len(await rows(conn, "SELECT * FROM jobs")) == 1


async def test_a_tenant_refused_by_the_allow_list_is_replayed_under_the_fixed_rule(
    db_url: str, conn: db.Conn, config: Config
) -> None:
    registry = by_intent(Registry(), source="connect")
    body = intent_event("evt_new_acct", "pi_9", {}, account="acct_new")  # outside acct_[0-9]+
    [answer] = await deliver(db_url, config, registry, ("connect", body))
    assert (answer.status_code, answer.json()["error"]) == (200, "tenant_not_allowed")
    since = datetime.now(UTC) - timedelta(hours=1)
    old_rule = config.sources["connect"].tenant_rule.tenant_of
    still = await replay_refused(
        conn, by="cli:test", registry=registry, source="connect", tenant_of=old_rule, since=since
    )
    assert (still.deliveries, still.tenant_unusable) == (1, 1)
    fixed = parse(
        CONFIG.replace('tenant_pattern = "acct_[0-9]+"', 'tenant_pattern = "acct_[a-z0-9]+"'), env=ENV
    )
    new_rule = fixed.sources["connect"].tenant_rule.tenant_of
    result = await replay_refused(
        conn, by="cli:test", registry=registry, source="connect", tenant_of=new_rule, since=since
    )
    assert dict(result.outcomes) == {"accepted": 1}
    assert await rows(conn, "SELECT tenant, effect_key FROM effects") == [
        {"tenant": "acct_new", "effect_key": "intent-paid:pi_9"}
    ]


async def test_a_nul_delivery_arriving_with_fifty_genuine_ones_leaves_fifty_one_claimed(
    db_url: str, conn: db.Conn, config: Config
) -> None:
    genuine = [("lenient", intent_event(f"evt_{n}", f"pi_{n}", {"order_id": str(n)})) for n in range(50)]
    gift_note = (
        b'{"id": "evt_gift", "type": "payment_intent.succeeded", "data": {"object": {"id": "pi_gift", '
        b'"metadata": {"order_id": "gift", "note": "for you \\u0000 love"}}}}'
    )
    bodies = [*genuine[:25], ("lenient", gift_note), *genuine[25:]]
    answers = await deliver(db_url, config, by_order(Registry()), *bodies)
    assert [r.status_code for r in answers] == [202] * 51
    effects = await rows(conn, "SELECT effect_key, payload FROM effects ORDER BY effect_key")
    assert len(effects) == 51 and len(await rows(conn, "SELECT * FROM jobs")) == 51
    [gift] = [e for e in effects if e["effect_key"] == "order-paid:gift"]
    assert gift["payload"]["data"]["object"]["metadata"]["note"] == "for you \ufffd love"
    assert await rows(conn, "SELECT * FROM deliveries WHERE outcome = 'refused'") == []


HANDLERS = """
from effectgate import effect

@effect(source="stripe", events=["payment_intent.succeeded"], name="shop.fulfil",
        key=lambda ev: "intent-paid:" + ev.payload["data"]["object"]["id"])
async def fulfil(ctx, ev):
    return None
"""


def test_the_cli_replays_refused_deliveries_and_lists_them_by_event_id(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from effectgate.handlers.registry import REGISTRY
    from tests.integration.in_process_cli import run_cli

    config = parse(CONFIG, env=ENV)
    body = intent_event("evt_cli", "pi_cli", {})
    # The shop's source answers 4xx (on_refusal = "reject"): kept all the same.
    [answer] = asyncio.run(deliver(db_url, config, by_order(Registry(), source="stripe"), ("stripe", body)))
    assert (answer.status_code, answer.json()["kept"]) == (422, True)

    monkeypatch.setenv("DATABASE_URL", db_url)
    code, out, _ = run_cli(
        capsys, "ledger", "rejects", "--since", "1h", "--kind", "refused", "--event-id", "evt_cli"
    )
    assert code == 0 and "evt_cli" in out and "effect_key_failed" in out and "KeyError" in out
    code, out, _ = run_cli(capsys, "ledger", "delivery-outcomes", "--since", "1h", "--format", "json")
    assert code == 0 and json.loads(out)["items"][0]["refused"] == 1

    (tmp_path / "refused_handlers_mod.py").write_text(HANDLERS)
    (tmp_path / "eg.toml").write_text(
        '[handlers]\nmodules = ["refused_handlers_mod"]\n[sources.stripe]\nscheme = "stripe"\nsecrets = ["S"]\n'
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(REGISTRY, "_kinds", {})  # the module registers into a registry this test throws away
    monkeypatch.setenv("S", "whsec_x")
    replay = ["ledger", "replay", "--refused", "--source", "stripe", "--since", "1h"]
    code, out, _ = run_cli(capsys, *replay, "--config", str(tmp_path / "eg.toml"), "--format", "json")
    assert code == 0 and json.loads(out)["outcomes"] == {"accepted": 1}
    code, out, _ = run_cli(capsys, *replay, "--config", str(tmp_path / "eg.toml"))
    assert code == 0 and "0 refused deliveries of stripe replayed" in out
    code, out, _ = run_cli(capsys, "ledger", "refused-deliveries", "--since", "1h", "--format", "json")
    [item] = json.loads(out)["items"]
    assert item["event_id"] == "evt_cli" and item["replayed_at"] is not None
    with pytest.raises(SystemExit) as exited:
        run_cli(capsys, "ledger", "replay", "--source", "stripe", "--since", "1h")
    assert exited.value.code == 2
    assert "one of the arguments --unmatched --refused is required" in capsys.readouterr().err

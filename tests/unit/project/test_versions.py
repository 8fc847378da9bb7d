"""``@effect(version=...)``: validated at the decorated function, read from signed material only, and turned
into one comparable integer (issue 22, latest wins per object)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from effectgate.gateway.config import ConfigError, parse
from effectgate.handlers.downstream.forward import register_declared
from effectgate.handlers.effect_kind import EffectKind, InvalidEffect
from effectgate.handlers.event import Event
from effectgate.handlers.plan import PlanFailed, check_identity, plan_event
from effectgate.handlers.registry import Registry


async def _noop(ctx: Any, ev: Event) -> None:
    return None


def _lock(ev: Event) -> str:
    return f"order:{ev.payload['order']['id']}"


def _kind(**settings: Any) -> EffectKind:
    return EffectKind(name="sync", source="shop", events=("orders/updated",), fn=_noop, **settings)


def _event(order: dict[str, Any], **other: Any) -> Event:
    return Event("shop", "sha256:" + "cd" * 32, "orders/updated", {"order": order, **other}, "default")


def test_a_version_needs_a_lock_key_and_a_pointer_or_a_function() -> None:
    with pytest.raises(InvalidEffect) as caught:
        _kind(version="/order/updated_at")
    assert caught.value.problems == ("effect 'sync': version needs a lock_key naming the object it versions",)
    with pytest.raises(InvalidEffect, match=r"effect 'sync': version: .*JSON Pointer"):
        _kind(version="order/updated_at", lock_key=_lock)
    with pytest.raises(InvalidEffect, match="version must be a JSON Pointer or a function of the event"):
        _kind(version=7, lock_key=_lock)
    assert _kind(version="/order/updated_at", lock_key=_lock).version is not None


def test_the_decorator_reports_a_version_mistake_at_the_users_line() -> None:
    reg = Registry()
    with pytest.raises(
        InvalidEffect, match=r"test_versions\.py:\d+: effect 'sync': version needs a lock_key"
    ):
        reg.effect(source="shop", events=["orders/updated"], name="sync", version="/order/seq")(_noop)
    assert reg.get("sync") is None


@pytest.mark.parametrize(
    ("found", "expected"),
    [
        (17, 17),
        (1_700_000_000, 1_700_000_000),  # Stripe's `created`, seconds
        ("2031-03-04T12:00:00Z", int(datetime(2031, 3, 4, 12, tzinfo=UTC).timestamp()) * 1_000_000),
        # Shopify's offsets: the same instant in two zones is the same version.
        (
            "2031-03-04T13:00:00.000001+01:00",
            int(datetime(2031, 3, 4, 12, tzinfo=UTC).timestamp()) * 1_000_000 + 1,
        ),
        ("1969-12-31T23:59:59Z", -1_000_000),
    ],
)
def test_versions_are_integers_and_times_with_an_offset(found: object, expected: int) -> None:
    kind = _kind(version="/order/v", lock_key=_lock)
    assert kind.version_for(_event({"id": 1, "v": found})) == expected


@pytest.mark.parametrize(
    ("found", "message"),
    [
        (None, "is not an integer"),
        (True, "is not an integer"),
        (1.5, "is not an integer"),
        ("12", "neither an integer nor an ISO 8601 time"),  # digits in a string are never guessed at
        ("yesterday", "neither an integer nor an ISO 8601 time"),
        ("2031-03-04T12:00:00", "has no UTC offset"),
        (2**63, "is not an integer"),
    ],
)
def test_a_version_that_orders_nothing_fails_the_plan(found: object, message: str) -> None:
    reg = Registry()
    reg.register(_kind(version="/order/v", lock_key=_lock))
    with pytest.raises(PlanFailed, match=message):
        plan_event(reg, _event({"id": 1, "v": found}))
    with pytest.raises(PlanFailed, match="no version at '/order/v'"):
        plan_event(reg, _event({"id": 1}))


def test_the_plan_carries_the_version_and_no_version_without_an_object() -> None:
    reg = Registry()
    reg.register(
        _kind(
            version=lambda ev: datetime(2031, 1, 1, tzinfo=timezone(timedelta(hours=2))),
            lock_key=lambda ev: ev.payload["order"].get("id") and _lock(ev),
        )
    )
    [request] = plan_event(reg, _event({"id": 9})).effects
    assert (request.lock_key, request.version) == (
        "order:9",
        int(datetime(2030, 12, 31, 22, tzinfo=UTC).timestamp()) * 1_000_000,
    )
    [unlocked] = plan_event(reg, _event({"id": None})).effects
    assert (unlocked.lock_key, unlocked.version) == (None, None)


def _version_from_delivery(ev: Event) -> int:
    return int(ev.delivery_id or 0)


def test_a_version_function_cannot_read_unsigned_fields() -> None:
    reg = Registry()
    reg.effect(source="shop", events=["*"], name="sync", lock_key=_lock, version=_version_from_delivery)(
        _noop
    )
    assert check_identity(reg, {"shop": frozenset({"type"})}) == [
        "effect 'sync': its version function reads event.delivery_id, which source 'shop' does not sign (a "
        "replay can rewrite it); use signed payload fields, or declare the effect trust_unsigned=True"
    ]
    with pytest.raises(PlanFailed, match="UnsignedField"):
        plan_event(reg, Event("shop", "e", "orders/updated", {"order": {"id": 1}}, "default", "99"))


DECLARED = """
[sources.shop]
scheme = "standard-webhooks"
secrets = ["S1"]

[effects.sync-order]
source = "shop"
events = ["order.updated"]
key = "order-sync:{/data/event_id}"
lock_key = "order:{/data/order_id}"
version = "/data/updated_at"

[effects.sync-order.forward]
url = "http://127.0.0.1:9/hooks/sync-order"
secret_env = "ORDERS_SECRET"
"""
DECLARED_ENV = {"S1": "whsec_one", "ORDERS_SECRET": "whsec_" + "a2" * 16}


def test_a_declared_effect_takes_a_version_from_the_configuration() -> None:
    config = parse(DECLARED, path="eg.toml", env=DECLARED_ENV, role="gateway")
    registry = Registry()
    register_declared(registry, config.effects[0])
    payload = {"data": {"event_id": "e1", "order_id": "o_1", "updated_at": "2031-03-04T12:00:00Z"}}
    [request] = plan_event(registry, Event("shop", "evt_1", "order.updated", payload)).effects
    assert (request.lock_key, request.version) == (
        "order:o_1",
        int(datetime(2031, 3, 4, 12, tzinfo=UTC).timestamp()) * 1_000_000,
    )
    # The registry's own rules, at start-up, named by file and key: a version needs the object.
    unlocked = DECLARED.replace('lock_key = "order:{/data/order_id}"\n', "")
    with pytest.raises(ConfigError, match=r"eg.toml: effects.sync-order: .*version needs a lock_key"):
        parse(unlocked, path="eg.toml", env=DECLARED_ENV, role="gateway")
    with pytest.raises(ConfigError, match=r"effects.sync-order: .*version: "):
        parse(DECLARED.replace('"/data/updated_at"', '"data/updated_at"'), path="eg.toml", env=DECLARED_ENV)

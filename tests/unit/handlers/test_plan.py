"""handlers.plan: the one plan of a delivery's effects, and identity from signed material only."""

from __future__ import annotations

import operator
from typing import Any

import pytest

from effectgate.handlers.event import Event
from effectgate.handlers.plan import (
    PlanFailed,
    SignedView,
    UnsignedField,
    check_identity,
    check_key_spaces,
    plan_event,
    signed_view,
)
from effectgate.handlers.registry import Registry

BODY_ID = "sha256:" + "ab" * 32


async def _noop(ctx: Any, ev: Event) -> None:
    return None


def github_event(event_type: str = "pull_request.closed", **payload: Any) -> Event:
    # As the GitHub scheme hands it over: the id from the signed body, the delivery id and type unsigned.
    return Event("github", BODY_ID, event_type, payload, "default", "delivery-1", type_signed=False)


def test_a_key_function_cannot_read_an_unsigned_field() -> None:
    view = signed_view(github_event(number=7))
    assert isinstance(view, SignedView) and isinstance(view, Event)
    assert (view.id, view.payload, view.source, view.tenant) == (BODY_ID, {"number": 7}, "github", "default")
    for name in ("type", "delivery_id"):
        with pytest.raises(UnsignedField, match=f"event.{name} is not covered by the signature"):
            getattr(view, name)
    assert "delivery-1" not in repr(view)
    # Where the provider signs the type, the view reads it.
    stripe = signed_view(Event("stripe", "evt_1", "charge.succeeded", {}, type_signed=True))
    assert stripe.type == "charge.succeeded"
    with pytest.raises(UnsignedField):
        _ = stripe.delivery_id


def test_a_key_built_from_the_unsigned_type_fails_the_plan_unless_trusted() -> None:
    reg = Registry()
    reg.effect(source="github", events=["*"], name="typed", key=lambda ev: f"k:{ev.type}")(_noop)
    with pytest.raises(PlanFailed, match=r"'typed'.*UnsignedField"):
        plan_event(reg, github_event())
    trusted = Registry()
    trusted.effect(
        source="github", events=["*"], name="typed", key=lambda ev: f"k:{ev.type}", trust_unsigned=True
    )(_noop)
    [request] = plan_event(trusted, github_event()).effects
    assert request.effect_key == "k:pull_request.closed"


def test_the_default_key_is_built_from_the_signed_id() -> None:
    reg = Registry()
    reg.effect(source="github", events=["*"], name="any")(_noop)
    first = plan_event(reg, github_event())
    # Another unsigned delivery id and type: the same key, so the ledger answers duplicate.
    other = Event("github", BODY_ID, "push", {}, "default", "delivery-2", type_signed=False)
    assert [r.effect_key for r in first.effects] == [r.effect_key for r in plan_event(reg, other).effects]
    assert first.effects[0].effect_key == f"github:{BODY_ID}:any"


def test_require_is_met_only_by_the_signed_payload() -> None:
    reg = Registry()
    reg.effect(
        source="github",
        events=["pull_request.closed"],
        name="deploy",
        require={"/pull_request/merged": True, "/pull_request/base/ref": "main"},
    )(_noop)
    merged = {"pull_request": {"merged": True, "base": {"ref": "main"}}}
    assert [r.handler for r in plan_event(reg, github_event(**merged)).effects] == ["deploy"]
    for payload in (
        {"pull_request": {"merged": False, "base": {"ref": "main"}}},
        {"pull_request": {"merged": 1, "base": {"ref": "main"}}},  # JSON's types: 1 is not true
        {"pull_request": {"base": {"ref": "main"}}},  # missing is not met
        {"pull_request": {"merged": True, "base": {"ref": "dev"}}},
    ):
        plan = plan_event(reg, github_event(**payload))
        assert (plan.effects, plan.unmet) == ([], ["deploy"]), payload


def test_a_require_predicate_sees_the_signed_view() -> None:
    reg = Registry()
    reg.effect(source="github", events=["*"], name="p", require=lambda ev: ev.payload.get("ok") is True)(
        _noop
    )
    assert plan_event(reg, github_event(ok=True)).unmet == []
    assert plan_event(reg, github_event(ok=False)).unmet == ["p"]
    sneaky = Registry()
    sneaky.effect(source="github", events=["*"], name="p", require=lambda ev: ev.type == "push")(_noop)
    with pytest.raises(PlanFailed):
        plan_event(sneaky, github_event())
    not_bool = Registry()
    not_bool.effect(source="github", events=["*"], name="p", require=lambda ev: "yes")(_noop)  # type: ignore[arg-type, return-value]
    with pytest.raises(PlanFailed, match="not True or False"):
        plan_event(not_bool, github_event())


@pytest.mark.parametrize(
    ("require", "message"),
    [
        ({}, "require must name at least one field"),
        ({"financial_status": "paid"}, "require: JSON Pointer 'financial_status' must start with '/'"),
        ({"/x": object()}, "is not a JSON value"),
        ({"/x": float("nan")}, "is not a JSON value"),
    ],
)
def test_a_bad_require_is_refused_at_registration(require: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Registry().effect(source="shopify", events=["orders/paid"], name="r", require=require)(_noop)


def test_the_plan_carries_the_kinds_fingerprint_and_lock_key() -> None:
    reg = Registry()
    reg.effect(
        source="stripe",
        events=["*"],
        name="pay",
        key=lambda ev: f"order:{ev.payload['order']}",
        lock_key=lambda ev: f"customer:{ev.payload['customer']}",
        fingerprint=["/amount"],
    )(_noop)
    event = Event("stripe", "evt_1", "charge.succeeded", {"order": 1, "customer": "c", "amount": 5})
    [request] = plan_event(reg, event).effects
    assert (request.effect_key, request.lock_key) == ("order:1", "customer:c")
    assert request.fingerprint is not None and request.fingerprint == reg.kinds()[0].fingerprint_of(event)


def _reads_type(ev: Event) -> str:
    return f"{ev.type}:{ev.payload['id']}"


def _reads_delivery(ev: Event) -> str:
    def inner() -> str:
        return str(ev.delivery_id)

    return inner()


def test_check_identity_finds_unsigned_reads_before_the_first_delivery() -> None:
    reg = Registry()
    reg.effect(source="github", events=["*"], name="a", key=_reads_type)(_noop)
    reg.effect(source="github", events=["*"], name="b", lock_key=_reads_delivery)(_noop)
    reg.effect(source="github", events=["*"], name="c", require=lambda ev: ev.type == "push")(_noop)
    reg.effect(source="github", events=["*"], name="ok", key=lambda ev: str(ev.payload["id"]))(_noop)
    reg.effect(source="github", events=["*"], name="trusted", key=_reads_type, trust_unsigned=True)(_noop)
    reg.effect(source="stripe", events=["*"], name="signed_type", key=_reads_type)(_noop)
    reg.effect(source="stripe", events=["*"], name="stripe_delivery", key=_reads_delivery)(_noop)
    # An attrgetter has no bytecode: the start-up check cannot see it; the signed view still stops it.
    reg.effect(source="github", events=["*"], name="opaque", key=operator.attrgetter("type"))(_noop)
    problems = check_identity(reg, {"github": frozenset({"type"}), "stripe": frozenset()})
    assert problems == [
        "effect 'a': its key function reads event.type, which source 'github' does not sign (a replay "
        "can rewrite it); use signed payload fields, or declare the effect trust_unsigned=True",
        "effect 'b': its lock_key function reads event.delivery_id, which source 'github' does not sign "
        "(a replay can rewrite it); use signed payload fields, or declare the effect trust_unsigned=True",
        "effect 'c': its require function reads event.type, which source 'github' does not sign (a replay "
        "can rewrite it); use signed payload fields, or declare the effect trust_unsigned=True",
        "effect 'stripe_delivery': its key function reads event.delivery_id, which source 'stripe' does "
        "not sign (a replay can rewrite it); use signed payload fields, or declare the effect "
        "trust_unsigned=True",
    ]
    with pytest.raises(PlanFailed):
        plan_event(_only(reg, "opaque"), github_event(id=1))


def _only(reg: Registry, name: str) -> Registry:
    single = Registry()
    kind = reg.get(name)
    assert kind is not None
    single.register(kind)
    return single


def test_the_examples_guard_their_unsigned_topics() -> None:
    from effectgate.handlers.examples import audit, commerce  # noqa: F401  (they register on import)
    from effectgate.handlers.registry import REGISTRY

    shopify = _only(REGISTRY, "commerce.fulfil_shopify_order")
    order = {"id": 1, "financial_status": "pending", "line_items": []}
    swapped = Event("shopify", BODY_ID, "orders/paid", order, type_signed=False)
    assert plan_event(shopify, swapped).unmet == ["commerce.fulfil_shopify_order"]
    paid = Event("shopify", BODY_ID, "orders/paid", {**order, "financial_status": "paid"}, type_signed=False)
    assert [r.effect_key for r in plan_event(shopify, paid).effects] == ["shopify:shopify-order-paid:1"]

    github = _only(REGISTRY, "audit.github_merged")
    closed = {"number": 3, "repository": {"full_name": "o/r"}, "issue": {"number": 3}}
    assert plan_event(github, github_event(**closed)).unmet == ["audit.github_merged"]
    merged = {**closed, "pull_request": {"merged": True}}
    assert [r.effect_key for r in plan_event(github, github_event(**merged)).effects] == [
        "github:github-merged:o/r#3"
    ]
    examples = Registry()
    for kind in REGISTRY.kinds():
        if kind.name.startswith(("commerce.", "audit.")):
            examples.register(kind)
    assert check_identity(examples, {"github": frozenset({"type"}), "shopify": frozenset({"type"})}) == []


def _stripe(event_type: str, **obj: Any) -> Event:
    return Event("stripe", f"evt_{event_type}", event_type, {"type": event_type, "data": {"object": obj}})


def test_the_stripe_recipe_captures_per_intent_and_ships_only_what_is_captured() -> None:
    """A capture acts on a PaymentIntent: a second intent of one order (a re-authorisation) has a key of
    its own. A shipment acts on the order, and only once the money is taken: ``charge.succeeded`` of a
    manual capture (``captured: false``, https://docs.stripe.com/api/charges/object) does not ship."""
    from effectgate.handlers.examples import commerce  # noqa: F401  (it registers on import)
    from effectgate.handlers.registry import REGISTRY

    capture = _only(REGISTRY, "commerce.capture_payment")
    keys = []
    for pi in ("pi_declined", "pi_again"):
        intent = {
            "id": pi,
            "object": "payment_intent",
            "status": "requires_capture",
            "metadata": {"order_id": "7"},
        }
        planned = plan_event(capture, _stripe("payment_intent.amount_capturable_updated", **intent))
        keys.append([r.effect_key for r in planned.effects])
    assert keys == [["capture:pi_declined"], ["capture:pi_again"]]

    ship = _only(REGISTRY, "commerce.fulfil_order")
    charge = {"id": "ch_1", "object": "charge", "payment_intent": "pi_again", "metadata": {"order_id": "7"}}
    assert plan_event(ship, _stripe("charge.succeeded", **charge, captured=False)).unmet == [
        "commerce.fulfil_order"
    ]
    for shipped in (
        _stripe("charge.succeeded", **charge, captured=True),  # automatic capture
        _stripe("charge.captured", **charge, captured=True),
        _stripe(
            "payment_intent.succeeded",
            id="pi_again",
            object="payment_intent",
            status="succeeded",
            metadata={"order_id": "7"},
        ),
    ):
        assert [r.effect_key for r in plan_event(ship, shipped).effects] == ["order-paid:7"]


def test_a_source_key_space_keeps_two_sources_keys_apart() -> None:
    reg = Registry()
    for source in ("stripe", "partner"):
        reg.effect(
            source=source,
            events=["*"],
            name=f"{source}.paid",
            key=lambda ev: f"order-paid:{ev.payload['order']}",
            key_space="source",
        )(_noop)
    keys = [
        r.effect_key
        for source in ("stripe", "partner")
        for r in plan_event(reg, Event(source, "e1", "paid", {"order": 7})).effects
    ]
    # A partner's signed body naming order 7 can no longer claim the key Stripe's payment for order 7 needs.
    assert keys == ["stripe:order-paid:7", "partner:order-paid:7"]
    with pytest.raises(ValueError, match="key_space applies to a key function"):
        Registry().effect(source="stripe", events=["*"], name="d", key_space="source")(_noop)
    with pytest.raises(ValueError, match="key_space must be 'source' or 'shared'"):
        Registry().effect(source="stripe", events=["*"], name="d", key=str, key_space="tenant")(_noop)  # type: ignore[arg-type]


def test_key_functions_of_two_sources_reaching_one_tenant_must_declare_a_key_space() -> None:
    reg = Registry()
    reg.effect(source="stripe", events=["*"], name="s", key=lambda ev: "k")(_noop)
    reg.effect(source="partner", events=["*"], name="p", key=lambda ev: "k")(_noop)
    reg.effect(source="github", events=["*"], name="g")(_noop)  # default keys start with the source
    [problem] = check_key_spaces(reg, lambda a, b: True)
    assert problem.startswith("effects 'p' (source 'partner') and 's' (source 'stripe') build their own keys")
    assert check_key_spaces(reg, lambda a, b: False) == []
    declared = Registry()
    declared.effect(source="stripe", events=["*"], name="s", key=lambda ev: "k", key_space="shared")(_noop)
    declared.effect(source="partner", events=["*"], name="p", key=lambda ev: "k")(_noop)
    assert check_key_spaces(declared, lambda a, b: True) == []

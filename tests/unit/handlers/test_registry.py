"""Every per-kind setting has one default, is settable per kind, and is validated at registration."""

from __future__ import annotations

import inspect
import math
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from effectgate.handlers import effect_kind
from effectgate.handlers.effect_kind import EffectKind, InvalidEffect
from effectgate.handlers.event import Event
from effectgate.handlers.registry import Registry
from effectgate.ledger.pointers import JsonPointer


async def handler(ctx: Any, ev: Event) -> None:
    return None


def make(**settings: Any) -> EffectKind:
    return EffectKind(name="k", source="stripe", events=("charge.*",), fn=handler, **settings)


EVENT = Event("stripe", "evt_1", "charge.succeeded", {"order": "o-1"}, "acme")


def test_every_setting_has_its_documented_default() -> None:
    kind = make()
    assert (kind.orphan_policy, kind.max_attempts, kind.lease_ttl, kind.slice_budget) == (
        "park",
        60,
        60.0,
        300.0,
    )
    assert kind.max_slice == 900.0  # 3 x the budget
    # None: the worker's [worker] backoff_base / backoff_cap apply.
    assert (kind.backoff_base, kind.backoff_cap) == (None, None)
    # None: the process's reconciler settings apply (ledger.reconciler.DEFAULT_*, or the config file).
    assert (kind.pending_ttl, kind.poison_threshold, kind.lock_key, kind.on_transition) == (
        None,
        None,
        None,
        None,
    )
    assert effect_kind.DEFAULT_SLICE_FACTOR * effect_kind.DEFAULT_SLICE_BUDGET == kind.max_slice


def test_every_setting_is_settable_per_kind_through_the_decorator() -> None:
    registry = Registry()

    async def hook(conn: Any, transition: Any) -> None:
        return None

    registry.effect(
        source="stripe",
        events="charge.succeeded",
        name="custom",
        orphan_policy="redrive",
        max_attempts=2,
        lease_ttl=5,
        slice_budget=1,
        max_slice=None,
        pending_ttl=30,
        poison_threshold=7,
        lock_key=lambda ev: f"order:{ev.payload['order']}",
        on_transition=hook,
    )(handler)
    kind = registry.get("custom")
    assert kind is not None
    assert (kind.events, kind.orphan_policy, kind.max_attempts, kind.lease_ttl, kind.slice_budget) == (
        ("charge.succeeded",),
        "redrive",
        2,
        5,
        1,
    )
    assert (kind.max_slice, kind.pending_ttl, kind.poison_threshold, kind.on_transition) == (
        None,
        30,
        7,
        hook,
    )
    assert kind.lock_key_for(EVENT) == "order:o-1"


def test_max_slice_defaults_to_three_budgets_and_may_not_go_below_two() -> None:
    assert make(slice_budget=10).max_slice == 30
    assert make(slice_budget=10, max_slice=20).max_slice == 20
    with pytest.raises(ValueError, match=r"at least 2 x slice_budget \(20 s\)"):
        make(slice_budget=10, max_slice=19.9)
    assert make(slice_budget=10, max_slice=None).max_slice is None
    with pytest.raises(ValueError, match="2\\*\\*31 - 1 ms"):
        make(slice_budget=10, max_slice=3e6)
    with pytest.raises(ValueError, match="2\\*\\*31 - 1 ms"):
        make(slice_budget=2e6)  # the default 3 x budget would overflow the limit too


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("lease_ttl", 0),
        ("lease_ttl", -1),
        ("lease_ttl", math.nan),
        ("lease_ttl", math.inf),
        ("lease_ttl", "60"),
        ("slice_budget", 0),
        ("slice_budget", math.nan),
        ("max_slice", math.nan),
        ("pending_ttl", 0),
        ("pending_ttl", math.inf),
        ("max_attempts", 0),
        ("max_attempts", 1.5),
        ("max_attempts", True),
        ("backoff_base", 0),
        ("backoff_base", math.inf),
        ("backoff_cap", -5),
        ("backoff_cap", "1h"),
        ("poison_threshold", 0),
        ("orphan_policy", "retry"),
        ("lock_key", "order"),
        ("on_transition", 42),
        ("key", "static"),
    ],
)
def test_a_bad_setting_is_refused_at_registration(setting: str, value: Any) -> None:
    with pytest.raises(ValueError, match=setting):
        Registry().effect(source="stripe", events=["x"], name="k", **{setting: value})(handler)


def test_a_kinds_backoff_cap_below_its_base_is_refused() -> None:
    with pytest.raises(ValueError, match=r"backoff_cap must be >= backoff_base \(60 s\), got 10"):
        make(backoff_base=60, backoff_cap=10)
    assert (make(backoff_base=60).backoff_base, make(backoff_cap=10).backoff_cap) == (60, 10)


def test_a_kind_needs_a_name_a_source_events_and_a_function() -> None:
    with pytest.raises(ValueError, match="name and a source"):
        EffectKind(name="", source="s", events=("x",), fn=handler)
    with pytest.raises(ValueError, match="events"):
        EffectKind(name="k", source="s", events=(), fn=handler)
    with pytest.raises(ValueError, match="async function"):
        EffectKind(name="k", source="s", events=("x",), fn="handler")  # type: ignore[arg-type]


def test_registering_a_kind_or_a_sweep_twice_is_an_error() -> None:
    registry = Registry()
    registry.register(make())
    with pytest.raises(ValueError, match="already registered"):
        registry.register(make())

    async def sweep(conn: Any) -> int:
        return 0

    registry.register_sweep("orphans", sweep)
    with pytest.raises(ValueError, match="already registered"):
        registry.register_sweep("orphans", sweep)
    with pytest.raises(ValueError, match="needs an id"):
        registry.register_sweep("", sweep)
    with pytest.raises(ValueError, match="async function"):
        registry.register_sweep("other", "not callable")  # type: ignore[arg-type]
    assert registry.sweeps() == {"orphans": sweep}
    registry.clear()
    assert (registry.kinds(), registry.sweeps()) == ([], {})


def test_the_lock_key_is_optional_and_checked() -> None:
    assert make().lock_key_for(EVENT) is None
    assert make(lock_key=lambda ev: None).lock_key_for(EVENT) is None
    for bad in ("", 42, "x" * 513):
        with pytest.raises(ValueError, match="lock_key function returned"):
            make(lock_key=lambda ev, bad=bad: bad).lock_key_for(EVENT)


def test_the_effect_key_defaults_to_source_event_and_kind() -> None:
    assert make().effect_key(EVENT) == "stripe:evt_1:k"
    assert make(key=lambda ev: f"order:{ev.payload['order']}").effect_key(EVENT) == "order:o-1"
    with pytest.raises(ValueError, match="not a non-empty string"):
        make(key=lambda ev: "").effect_key(EVENT)


def test_fingerprint_fields_are_parsed_at_registration_and_select_what_is_hashed() -> None:
    registry = Registry()

    async def handler(ctx: Any, ev: Event) -> None:
        return None

    registry.effect(source="s", events=["e"], name="k", fingerprint=["/amount", "/currency"])(handler)
    kind = registry.get("k")
    assert kind is not None and kind.fingerprint is not None
    assert [p.text for p in kind.fingerprint] == ["/amount", "/currency"]
    one = Event("s", "1", "e", {"amount": 5, "currency": "eur", "id": "a"})
    other = Event("s", "2", "e", {"amount": 5, "currency": "eur", "id": "b"})
    assert kind.fingerprint_of(one) == kind.fingerprint_of(other)
    assert kind.fingerprint_of(Event("s", "3", "e", {"amount": 6, "currency": "eur"})) != kind.fingerprint_of(
        one
    )
    registry.effect(source="s", events=["e"], name="whole")(handler)
    whole = registry.get("whole")
    assert whole is not None and whole.fingerprint_of(one) is None  # the delivery's whole-payload fingerprint


@pytest.mark.parametrize(
    ("fingerprint", "message"),
    [
        ("/amount", "must be a list of JSON Pointers"),
        ([], "at least one field"),
        (["amount"], "fingerprint: JSON Pointer 'amount' must start with '/'"),
        (["/a", "/a"], "names a field twice"),
        ([1], "must be a string"),
    ],
)
def test_a_bad_fingerprint_is_refused_at_registration(fingerprint: Any, message: str) -> None:
    async def handler(ctx: Any, ev: Event) -> None:
        return None

    with pytest.raises(ValueError, match=message):
        Registry().effect(source="s", events=["e"], name="k", fingerprint=fingerprint)(handler)


def test_a_declaration_wrong_in_every_concern_is_refused_with_every_problem() -> None:
    # Each concern's check (handlers/effect_kind.py _CHECKS) and each setting that does not parse
    # (_normalised) answers with its own message; the messages are the ones a single check always gave.
    with pytest.raises(InvalidEffect) as caught:
        EffectKind(
            name="k",
            source="s",
            events=(),
            fn=42,  # type: ignore[arg-type]
            orphan_policy="retry",  # type: ignore[arg-type]
            max_attempts=0,
            backoff_base=-1,
            backoff_cap="1h",  # type: ignore[arg-type]
            lease_ttl=0,
            slice_budget=math.nan,
            max_slice=-1,
            pending_ttl=math.inf,
            poison_threshold=0,
            lock_key="order",  # type: ignore[arg-type]
            on_transition=1,  # type: ignore[arg-type]
            fingerprint="/amount",  # type: ignore[arg-type]
            require=[("nope", 1)],  # type: ignore[list-item]
            require_fn=3,  # type: ignore[arg-type]
            trust_unsigned="yes",  # type: ignore[arg-type]
            key_space="shared",
            version="no-slash",
        )
    assert caught.value.problems == (
        "effect 'k': require: JSON Pointer 'nope' must start with '/' (e.g. '/data/object/amount')",
        "effect 'k': fingerprint must be a list of JSON Pointers, got '/amount'",
        "effect 'k': version: JSON Pointer 'no-slash' must start with '/' (e.g. '/data/object/amount')",
        "effect 'k': trust_unsigned must be True or False",
        "effect 'k': key_space applies to a key function; the default key is the source's",
        "effect 'k': the handler must be an async function, got 42",
        "effect 'k': events must be a non-empty list of event types, got ()",
        "effect 'k': orphan_policy must be 'redrive' or 'park', got 'retry'",
        "effect 'k': max_attempts must be an integer >= 1, got 0",
        "effect 'k': backoff_base must be a finite number of seconds > 0, got -1",
        "effect 'k': backoff_cap must be a finite number of seconds > 0, got '1h'",
        "effect 'k': lease_ttl must be a finite number of seconds > 0, got 0",
        "effect 'k': slice_budget must be a finite number of seconds > 0, got nan",
        "effect 'k': pending_ttl must be a finite number of seconds > 0, got inf",
        "effect 'k': poison_threshold must be an integer >= 1, got 0",
        "effect 'k': lock_key must be callable, got 'order'",
        "effect 'k': on_transition must be callable, got 1",
        "effect 'k': require_fn must be callable, got 3",
        "effect 'k': max_slice must be a finite number of seconds > 0, got -1",
    )
    with pytest.raises(InvalidEffect) as versioned:
        make(version=3.5, backoff_base=60, backoff_cap=10, slice_budget=2e6, max_slice=3.9e6)
    assert versioned.value.problems == (
        "effect 'k': version must be a JSON Pointer or a function of the event, got 3.5",
        "effect 'k': version needs a lock_key naming the object it versions",
        "effect 'k': backoff_cap must be >= backoff_base (60 s), got 10",
        "effect 'k': max_slice must be at least 2 x slice_budget (4e+06 s), or None to disable the hard deadline",
        "effect 'k': max_slice must be at most 2.14748e+06 s (2**31 - 1 ms); use None to disable the hard deadline",
    )


def test_the_loose_forms_of_four_settings_are_normalised_in_one_step() -> None:
    kind = make(
        require={"/type": "charge.succeeded"},
        fingerprint=["/amount"],  # type: ignore[arg-type]
        version="/updated",
        lock_key=lambda ev: "order",
        slice_budget=10,
    )
    assert kind.require == ((JsonPointer.parse("/type"), "charge.succeeded"),)
    assert kind.fingerprint == (JsonPointer.parse("/amount"),)
    assert kind.version == JsonPointer.parse("/updated")
    assert kind.max_slice == 30
    # The frozen instance is written in one place only (EffectKind.__post_init__), from _normalised's values.
    assert inspect.getsource(effect_kind).count("object.__setattr__(") == 1


def test_every_mistake_of_a_declaration_is_named_at_the_callers_line() -> None:
    registry = Registry()

    def plain(ctx: Any, ev: Event) -> None:
        return None

    line = sys._getframe().f_lineno + 1
    decorate = registry.effect(source="s", events=["e"], name="k", max_attempts=0, lease_ttl=0)
    with pytest.raises(InvalidEffect) as caught:
        decorate(plain)  # type: ignore[arg-type]
    where = f"{os.path.relpath(__file__)}:{line}"
    assert caught.value.problems == (
        f"{where}: effect 'k': the handler must be a coroutine function (async def), not a plain def",
        f"{where}: effect 'k': max_attempts must be an integer >= 1, got 0",
        f"{where}: effect 'k': lease_ttl must be a finite number of seconds > 0, got 0",
    )
    assert registry.kinds() == []


def test_while_collecting_mistakes_are_recorded_and_the_rest_registered() -> None:
    registry = Registry()

    class Callable:
        async def __call__(self, ctx: Any, ev: Event) -> None:
            return None

    with registry.collecting() as mistakes:
        registry.effect(source="s", events=[], name="no_events")(handler)
        registry.effect(source="s", events=["e"], name="ok")(handler)
        registry.effect(source="s", events=["e"], name="ok")(handler)
        registry.effect(source="s", events=["e"], name="instance")(Callable())
    assert [m.message for m in mistakes] == [
        "effect 'no_events': events must be a non-empty list of event types, got ()",
        "effect 'ok' is already registered",
    ]
    assert all(m.where.startswith(f"{os.path.relpath(__file__)}:") for m in mistakes)
    assert [k.name for k in registry.kinds()] == ["ok", "instance"]
    ok = registry.get("ok")
    assert (
        ok is not None and ok.defined_at is not None and ok.defined_at.startswith(os.path.relpath(__file__))
    )


def test_effect_options_are_declared_once_as_effect_kind_fields() -> None:
    # effect()'s options are one TypedDict; their defaults and meanings are EffectKind's fields. A field
    # added to one and not the other fails here, not in a user's handler module.
    from dataclasses import fields

    from effectgate.handlers.registry import EffectOptions

    kind_fields = {f.name for f in fields(EffectKind) if f.init}
    set_by_effect = {"source", "events", "fn", "require_fn", "defined_at"}
    assert set(EffectOptions.__annotations__) == kind_fields - set_by_effect


def test_an_unknown_effect_option_is_refused_at_the_users_line_naming_it_and_the_likely_one() -> None:
    async def handler(ctx: object, ev: object) -> None:
        return None

    decorator = Registry().effect(source="s", events=["e"], lease_tll=5)  # type: ignore[call-arg]
    with pytest.raises(InvalidEffect) as refused:
        decorator(handler)
    [problem] = refused.value.problems
    assert problem.startswith(f"{Path(__file__).relative_to(Path.cwd())}:")
    assert "unknown option 'lease_tll' (did you mean 'lease_ttl'?)" in problem
    assert "max_attempts" in problem and "TypeError" not in problem


def test_every_unknown_option_of_every_module_is_reported_at_once_at_start_up() -> None:
    registry = Registry()

    async def handler(ctx: object, ev: object) -> None:
        return None

    with registry.collecting() as mistakes:
        registry.effect(source="s", events=["e"], name="a", retries=3)(handler)  # type: ignore[call-arg]
        registry.effect(source="s", events=["e"], name="b", idempotent=True)(handler)  # type: ignore[call-arg]
    assert [m.message.split(";")[0] for m in mistakes] == [
        "effect(): unknown option 'retries'",
        "effect(): unknown option 'idempotent'",
    ]
    assert registry.kinds() == []

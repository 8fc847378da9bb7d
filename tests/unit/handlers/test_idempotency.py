"""Invariant 6: downstream idempotency keys depend only on (tenant, effect key, step name)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from effectgate.handlers.idempotency import idempotency_key


def test_the_key_is_stable_and_short_enough_for_every_provider() -> None:
    key = idempotency_key("default", "order-paid:1234", "capture")
    assert key == idempotency_key("default", "order-paid:1234", "capture")
    assert key.startswith("eg_") and len(key) == 46
    assert key.replace("_", "").replace("-", "").isalnum()


def test_each_part_changes_the_key() -> None:
    base = idempotency_key("t", "k", "s")
    assert (
        len(
            {
                base,
                idempotency_key("t2", "k", "s"),
                idempotency_key("t", "k2", "s"),
                idempotency_key("t", "k", "s2"),
            }
        )
        == 4
    )


def test_moving_a_separator_between_parts_changes_the_key() -> None:
    assert idempotency_key("a", "b:c", "d") != idempotency_key("a:b", "c", "d")
    assert idempotency_key("a", "bc", "d") != idempotency_key("a", "b", "cd")


@given(st.text(), st.text(min_size=1, max_size=600), st.text(min_size=1))
def test_any_input_gives_a_key_within_stripes_255_limit(tenant: str, effect_key: str, step: str) -> None:
    key = idempotency_key(tenant, effect_key, step)
    assert len(key) <= 255 and key.isascii()

"""Values Python's json accepts and Postgres refuses are caught before the write."""

from __future__ import annotations

import pytest

from effectgate.ledger.storable import jsonb_problem, storable_text


@pytest.mark.parametrize(
    "value",
    [{"a": 1}, [1, "x", None, True, 1.5], "ünïcode ✓", {"nested": [{"deep": ["ok"]}]}, 10**30],
)
def test_storable_values_pass(value: object) -> None:
    assert jsonb_problem(value) is None


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (float("nan"), "not JSON"),
        ({"x": float("inf")}, "not JSON"),
        ({"x": "a\x00b"}, "NUL"),
        ({"a\x00": 1}, "NUL"),
        (["\ud800"], "lone surrogate"),
        ({"\udfff": 1}, "lone surrogate"),
        (object(), "not JSON"),
    ],
)
def test_unstorable_values_say_why(value: object, reason: str) -> None:
    problem = jsonb_problem(value)
    assert problem is not None and reason in problem


def test_error_text_is_made_storable() -> None:
    assert storable_text("boom\x00here") == "boom\\x00here"
    assert storable_text("lone \ud800 surrogate").encode("utf-8")
    assert storable_text("plain") == "plain"

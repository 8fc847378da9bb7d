"""Values Python's json accepts and Postgres refuses are caught before the write."""

from __future__ import annotations

import json

import pytest

from effectgate.ledger.storable import jsonb_problem, storable_json, storable_record, storable_text


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


class BadRepr:
    def __repr__(self) -> str:
        raise RuntimeError("repr bug")


def test_an_unstorable_value_is_rewritten_into_one_jsonb_takes() -> None:
    shared: list[object] = []
    shared.append(shared)
    value = {
        "code": BadRepr(),
        "nan": float("nan"),
        "deep": {"a\x00": ["\ud800", b"raw"]},
        (1, 2): "tuple key",
        "huge": 2**20000,
        "loop": shared,
        "fine": [1, 2.5, None, True, "ok"],
    }
    rewritten = storable_json(value)
    assert jsonb_problem(rewritten) is None
    json.dumps(rewritten, allow_nan=False)
    assert rewritten == {
        "code": "<unrepresentable BadRepr>",
        "nan": "nan",
        "deep": {"a\\x00": ["\\ud800", "b'raw'"]},
        "(1, 2)": "tuple key",
        "huge": "<int of 20001 bits>",
        "loop": ["<circular reference>"],
        "fine": [1, 2.5, None, True, "ok"],
    }


def test_a_shared_structure_is_rewritten_in_bounded_work() -> None:
    # 2**60 paths through 60 levels of one list shared twice: a walk that followed every path never ends.
    node: list[object] = []
    for _ in range(60):
        node = [node, node]
    rewritten = storable_json(node)
    assert jsonb_problem(rewritten) is None
    assert "<truncated>" in json.dumps(rewritten)


def test_an_error_record_keeps_what_it_can_and_says_what_was_wrong() -> None:
    record = storable_record({"type": "E", "message": "m\x00", "code": {"x": float("inf")}})
    assert record["type"] == "E" and record["message"] == "m\\x00" and record["code"] == {"x": "inf"}
    assert "not JSON: contains NaN or Infinity" in record["unstorable"]
    assert storable_record({"type": "E", "code": "c"}) == {"type": "E", "code": "c"}

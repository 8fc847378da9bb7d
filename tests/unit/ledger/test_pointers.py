"""JSON Pointers (RFC 6901) and the fingerprint of the fields they select."""

from __future__ import annotations

from typing import Any

import pytest

from effectgate.ledger.fingerprints import fingerprint, fingerprint_selected
from effectgate.ledger.pointers import JsonPointer, PointerMissing

# RFC 6901, section 5.
DOC: dict[str, Any] = {
    "foo": ["bar", "baz"],
    "": 0,
    "a/b": 1,
    "c%d": 2,
    "e^f": 3,
    "g|h": 4,
    "i\\j": 5,
    'k"l': 6,
    " ": 7,
    "m~n": 8,
}


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("", DOC),
        ("/foo", ["bar", "baz"]),
        ("/foo/0", "bar"),
        ("/", 0),
        ("/a~1b", 1),
        ("/c%d", 2),
        ("/e^f", 3),
        ("/g|h", 4),
        ("/i\\j", 5),
        ('/k"l', 6),
        ("/ ", 7),
        ("/m~0n", 8),
    ],
)
def test_the_rfc_examples_resolve(text: str, value: Any) -> None:
    assert JsonPointer.parse(text).resolve(DOC) == value


@pytest.mark.parametrize(
    "text", ["/nope", "/foo/2", "/foo/-", "/foo/01", "/foo/x", "/foo/0/deeper", "/foo/²"]
)
def test_what_is_not_there_is_missing(text: str) -> None:
    with pytest.raises(PointerMissing):
        JsonPointer.parse(text).resolve(DOC)


@pytest.mark.parametrize(
    ("text", "message"), [("foo", "must start with '/'"), ("/a~2", "'~' must be"), (1, "string")]
)
def test_a_malformed_pointer_is_refused_when_parsed(text: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        JsonPointer.parse(text)


def payment(type_: str, **fields: Any) -> dict[str, Any]:
    obj = {"id": "pi_1", "object": "payment_intent", "amount": 1000, "currency": "eur", **fields}
    return {"id": f"evt_{type_}", "type": type_, "data": {"object": obj}}


SAME_PAYMENT = [JsonPointer.parse("/data/object/amount"), JsonPointer.parse("/data/object/currency")]


def test_events_that_agree_on_the_selected_fields_have_one_fingerprint() -> None:
    intent = payment("payment_intent.succeeded")
    charge = payment("charge.succeeded", id="ch_1", object="charge", payment_intent="pi_1")
    assert fingerprint(intent) != fingerprint(charge)
    assert fingerprint_selected(intent, SAME_PAYMENT) == fingerprint_selected(charge, SAME_PAYMENT)


def test_another_amount_absent_or_null_fields_are_other_requests() -> None:
    base = fingerprint_selected(payment("a"), SAME_PAYMENT)
    assert fingerprint_selected(payment("a", amount=1001), SAME_PAYMENT) != base
    no_currency = payment("a")
    del no_currency["data"]["object"]["currency"]
    null_currency = payment("a", currency=None)
    assert (
        len(
            {
                base,
                fingerprint_selected(no_currency, SAME_PAYMENT),
                fingerprint_selected(null_currency, SAME_PAYMENT),
            }
        )
        == 3
    )


def test_the_selected_fingerprint_is_the_canonical_json_of_the_values_by_pointer() -> None:
    # Invariant 4 with a selection: SHA-256 of canonical JSON, here of {pointer: value}.
    expected = fingerprint({"/data/object/amount": 1000, "/data/object/currency": "eur"})
    assert fingerprint_selected(payment("x"), list(reversed(SAME_PAYMENT))) == expected

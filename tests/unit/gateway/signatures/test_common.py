"""The shared helpers, where their edge cases are easier to pin down than through a scheme."""

import json

import pytest
from starlette.datastructures import Headers

from effectgate.gateway.signatures import (
    PayloadError,
    SignatureMalformed,
    SignatureMissing,
    TimestampOutOfTolerance,
)
from effectgate.gateway.signatures._common import (
    check_timestamp,
    decode_digest,
    event_from_json,
    lower_headers,
    parse_timestamp,
    require_header,
)
from effectgate.gateway.signatures._matching import DIAGNOSE_MAX_BYTES, reencodings


def test_lower_headers_keeps_the_first_value_and_skips_non_strings() -> None:
    raw = Headers(raw=[(b"x-a", b"1"), (b"X-A", b"2")])
    assert lower_headers(raw) == {"x-a": "1"}
    assert lower_headers({"X-A": "1", b"x-b": "2", "x-c": b"3"}) == {"x-a": "1"}  # type: ignore[dict-item]


@pytest.mark.parametrize("value", ["", " ", "\t"])
def test_blank_headers_are_missing(value: str) -> None:
    with pytest.raises(SignatureMissing, match=r"^X-Sig header is missing or blank$"):
        require_header({"x-sig": value}, "X-Sig")


def test_require_header_takes_the_first_present_alias() -> None:
    assert require_header({"svix-id": "b"}, "webhook-id", "svix-id") == "b"
    assert require_header({"svix-id": "b", "webhook-id": "a"}, "webhook-id", "svix-id") == "a"


@pytest.mark.parametrize("raw", ["0", "1700000000", "000001", "9" * 18])
def test_parse_timestamp_accepts_plain_digits(raw: str) -> None:
    assert parse_timestamp(raw, "T") == int(raw)


@pytest.mark.parametrize(
    "raw",
    ["", " 1", "1 ", "+1", "-1", "1.0", "1e3", "nan", "inf", "0x10", "1_000", "\u0663", "\u00b2", "9" * 19],
)
def test_parse_timestamp_refuses_everything_else(raw: str) -> None:
    with pytest.raises(SignatureMalformed, match=r"^T: timestamp is not a whole number of seconds$"):
        parse_timestamp(raw, "T")


@pytest.mark.parametrize("now", [float("nan"), float("inf"), float("-inf")])
def test_a_non_finite_clock_fails_closed(now: float) -> None:
    with pytest.raises(TimestampOutOfTolerance):
        check_timestamp(1_700_000_000, now, 300)


def test_huge_timestamps_are_just_far_in_the_future() -> None:
    with pytest.raises(TimestampOutOfTolerance, match="in the future"):
        check_timestamp(10**18 - 1, 1_700_000_000.0, 300)


def test_decode_digest() -> None:
    assert decode_digest("AB" * 32, "hex", 32) == b"\xab" * 32
    assert decode_digest("ab " * 21 + "a", "hex", 32) is None  # bytes.fromhex would skip the spaces
    assert decode_digest("q83vEjRWeJA=", "base64", 8) == bytes.fromhex("abcdef1234567890")
    assert decode_digest("q83vEjRWeJA", "base64", 8) is None
    assert decode_digest("q83v\nEjRWeJA=", "base64", 8) is None
    assert decode_digest("q83vEjRWeJA=", "base64", 9) is None


def test_reencodings_cover_default_compact_sorted_indented_and_ascii_forms() -> None:
    document = {"b": "é", "a": [1, 2]}
    compact = json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()
    forms = set(reencodings(compact))
    assert compact not in forms
    assert json.dumps(document).encode() in forms
    assert json.dumps(document, sort_keys=True, separators=(",", ":")).encode() in forms
    assert json.dumps(document, indent=2, ensure_ascii=False).encode() in forms
    assert len(forms) == len(list(reencodings(compact)))


@pytest.mark.parametrize("body", [b"not json", b"[" * 100_000, b"\xff", b" " * (DIAGNOSE_MAX_BYTES + 1)])
def test_reencodings_of_non_json_or_oversized_bodies_are_empty(body: bytes) -> None:
    assert list(reencodings(body)) == []


def test_event_from_json_accepts_integer_ids_but_not_integer_types() -> None:
    assert event_from_json(b'{"id": 7, "type": "t"}').id == "7"
    with pytest.raises(PayloadError):
        event_from_json(b'{"id": "7", "type": 7}')
    with pytest.raises(PayloadError):
        event_from_json(b'{"id": true, "type": "t"}')

"""What a failure says: the deferred re-encoded-body hint, and never a secret or a full signature."""

import json

import pytest

from effectgate.gateway.signatures import (
    SignatureInvalid,
    TimestampOutOfTolerance,
    UnsupportedSignatureVersion,
    VerificationError,
)
from effectgate.gateway.signatures._matching import REENCODED_HINT
from tests.unit.gateway.signatures.signing import CASE_IDS, CASES, EVENT_BODY, NOW, Case

# Compact and non-ASCII, as many providers send it; json.dumps(json.loads(...)) changes both.
ORIGINAL = json.dumps(
    {"id": "evt_1", "type": "t.x", "event_id": "E1", "event": {"type": "m"}, "name": "Zoë"},
    separators=(",", ":"),
    ensure_ascii=False,
).encode()


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_a_re_encoded_body_is_invalid_and_its_deferred_diagnosis_gives_the_hint(case: Case) -> None:
    headers = case.sign(ORIGINAL)
    reencoded = json.dumps(json.loads(ORIGINAL)).encode()
    with pytest.raises(SignatureInvalid) as caught:
        case.build().verify(reencoded, headers, now=NOW)
    assert "1 configured secret" in caught.value.detail
    # The sender's detail never waits for the diagnosis; the operator gets it from the rejects report.
    assert "re-encoded" not in caught.value.detail
    assert caught.value.diagnose is not None
    assert caught.value.diagnose() == REENCODED_HINT


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_a_genuinely_different_body_gets_no_hint(case: Case) -> None:
    headers = case.sign(ORIGINAL)
    with pytest.raises(SignatureInvalid) as caught:
        case.build().verify(ORIGINAL.replace(b"Zo", b"Jo"), headers, now=NOW)
    assert "re-encoded" not in caught.value.detail
    assert caught.value.diagnose is not None and caught.value.diagnose() is None


def test_detail_counts_the_secrets_tried() -> None:
    case = CASES[0]
    with pytest.raises(SignatureInvalid, match="any of the 3 configured secret"):
        case.build("whsec_a", "whsec_b", "whsec_c").verify(ORIGINAL, case.sign(ORIGINAL), now=NOW)


def failures(case: Case) -> list[VerificationError]:
    """Every failure we can provoke from one scheme with a secret and a real signature in play."""
    scheme = case.build()
    good = case.sign(ORIGINAL)
    attempts: list[tuple[bytes, dict[str, str], float]] = [
        (ORIGINAL + b" ", good, NOW),  # invalid
        (json.dumps(json.loads(ORIGINAL)).encode(), good, NOW),  # invalid, with hint
        (ORIGINAL, good, NOW + 10_000),  # stale (where timestamped)
        (b"nope", case.sign(b"nope"), NOW),  # payload
    ]
    for name in case.headers:
        attempts.append((ORIGINAL, {k: v for k, v in good.items() if k != name}, NOW))
        for mangled in (good.get(name, "") + "x", good.get(name, "")[:-1], "v9=" + good.get(name, "")):
            attempts.append((ORIGINAL, {**good, name: mangled}, NOW))
    caught = []
    for body, headers, now in attempts:
        try:
            scheme.verify(body, headers, now=now)
        except VerificationError as exc:
            caught.append(exc)
    return caught


def signature_values(headers: dict[str, str]) -> list[str]:
    """Each signature header value whole, and every long piece of it (the digests inside)."""
    values = []
    for name, value in headers.items():
        if "sig" in name.lower() or "hmac" in name.lower():
            values.append(value)
            values += [
                piece for piece in value.replace(",", " ").replace("=", " ").split() if len(piece) >= 20
            ]
    return values


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_no_error_ever_shows_a_secret_or_a_signature(case: Case) -> None:
    caught = failures(case)
    assert len({type(exc) for exc in caught}) >= 3
    secret_material = [case.secret, case.secret.removeprefix("whsec_")]
    signatures = signature_values(case.sign(ORIGINAL))
    assert signatures
    for exc in caught:
        for text in (str(exc), repr(exc), exc.detail):
            for forbidden in secret_material + signatures:
                assert forbidden not in text


@pytest.mark.parametrize(
    ("name", "headers", "shown"),
    [
        (
            "stripe",
            {"Stripe-Signature": f"t={NOW},v0=abc,v2=def"},
            "only 'v0', 'v2'; the gateway verifies v1",
        ),
        ("github", {"X-Hub-Signature-256": "sha512=abc"}, "expected sha256=, got 'sha512'"),
        ("slack", {"X-Slack-Signature": "v1=abc", "X-Slack-Request-Timestamp": str(NOW)}, "version 'v1'"),
        (
            "standard-webhooks",
            {"webhook-id": "m", "webhook-timestamp": str(NOW), "webhook-signature": "v2,abc v3,def"},
            "only 'v2', 'v3'",
        ),
    ],
)
def test_an_unknown_version_is_named_in_the_detail(name: str, headers: dict[str, str], shown: str) -> None:
    case = next(c for c in CASES if c.name == name)
    with pytest.raises(UnsupportedSignatureVersion) as caught:
        case.build().verify(ORIGINAL, headers, now=NOW)
    assert shown in caught.value.detail


def test_a_version_label_that_is_not_a_plain_token_is_not_echoed() -> None:
    case = next(c for c in CASES if c.name == "stripe")
    smuggled = "a" * 64  # e.g. a digest pasted where the version goes
    headers = {"Stripe-Signature": f"t={NOW},{smuggled}=x,v0=y,<script>=z"}
    with pytest.raises(UnsupportedSignatureVersion) as caught:
        case.build().verify(ORIGINAL, headers, now=NOW)
    assert smuggled not in caught.value.detail and "<script>" not in caught.value.detail
    assert "'v0', 2 other(s) not shown" in caught.value.detail


def test_skew_is_given_in_seconds_and_direction() -> None:
    case = next(c for c in CASES if c.name == "stripe")
    scheme = case.build()
    with pytest.raises(
        TimestampOutOfTolerance, match=r"^timestamp is 1000 s in the past; tolerance is 300 s"
    ):
        scheme.verify(EVENT_BODY, case.sign(EVENT_BODY), now=NOW + 1000)
    with pytest.raises(
        TimestampOutOfTolerance, match=r"^timestamp is 400 s in the future; tolerance is 300 s"
    ):
        scheme.verify(EVENT_BODY, case.sign(EVENT_BODY), now=NOW - 400)

import json

import pytest

from effectgate.gateway.signatures import (
    PayloadError,
    SignatureInvalid,
    SignatureMalformed,
    SignatureMissing,
    TimestampOutOfTolerance,
    UnsupportedSignatureVersion,
    Verified,
    build_scheme,
)
from tests.unit.gateway.signatures.signing import NOW, slack_headers

SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
BODY = json.dumps(
    {"type": "event_callback", "event_id": "Ev08MFMKH6", "event": {"type": "app_mention", "text": "hi"}}
).encode()


def verify(
    body: bytes, headers: dict[str, str], *, now: float = NOW, secrets: tuple[str, ...] = (SECRET,)
) -> Verified:
    return build_scheme("slack", secrets).verify(body, headers, now=now)


def test_published_vector_from_slacks_documentation() -> None:
    # "Verifying requests from Slack", https://api.slack.com/authentication/verifying-requests-from-slack
    # (the slash-command walkthrough): signing secret, timestamp and body as given there.
    body = (
        b"token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V"
        b"&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text="
        b"&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN"
        b"&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c"
    )
    headers = {
        "X-Slack-Request-Timestamp": "1531420618",
        "X-Slack-Signature": "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503",
    }
    # A slash-command form body: the signature passes, then the Events API scheme refuses the payload.
    with pytest.raises(PayloadError, match="not valid JSON"):
        verify(body, headers, now=1531420618)
    with pytest.raises(SignatureInvalid):
        verify(body + b"&x=1", headers, now=1531420618)


def test_event_callback() -> None:
    verified = verify(BODY, slack_headers(BODY, SECRET))
    (event,) = verified.events
    assert (event.id, event.type) == ("Ev08MFMKH6", "app_mention")
    assert verified.challenge is None


def test_url_verification_answers_the_challenge_and_claims_nothing() -> None:
    body = json.dumps(
        {
            "token": "t",
            "challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P",
            "type": "url_verification",
        }
    ).encode()
    verified = verify(body, slack_headers(body, SECRET))
    assert verified.events == ()
    assert verified.challenge == {"challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"}


def test_url_verification_must_be_signed_too() -> None:
    body = b'{"type": "url_verification", "challenge": "c"}'
    with pytest.raises(SignatureInvalid):
        verify(body, slack_headers(body, "not the secret"))


def test_rotation() -> None:
    assert verify(BODY, slack_headers(BODY, SECRET), secrets=("old", SECRET)).secret_index == 1


@pytest.mark.parametrize("missing", ["X-Slack-Signature", "X-Slack-Request-Timestamp"])
def test_missing_headers(missing: str) -> None:
    headers = slack_headers(BODY, SECRET)
    del headers[missing]
    with pytest.raises(SignatureMissing, match=missing):
        verify(BODY, headers)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("X-Slack-Signature", "a" * 64),
        ("X-Slack-Signature", "v0=" + "x" * 64),
        ("X-Slack-Signature", "v0="),
        ("X-Slack-Signature", "v0=" + "é" * 64),
        ("X-Slack-Request-Timestamp", "soon"),
        ("X-Slack-Request-Timestamp", "NaN"),
        ("X-Slack-Request-Timestamp", "1" * 19),
        ("X-Slack-Request-Timestamp", "\uff11\uff17\uff10\uff10"),  # fullwidth digits
    ],
)
def test_malformed_headers(name: str, value: str) -> None:
    with pytest.raises(SignatureMalformed):
        verify(BODY, {**slack_headers(BODY, SECRET), name: value})


def test_other_version_is_unsupported() -> None:
    with pytest.raises(UnsupportedSignatureVersion):
        verify(BODY, {**slack_headers(BODY, SECRET), "X-Slack-Signature": "v1=" + "a" * 64})


def test_invalid_signature() -> None:
    with pytest.raises(SignatureInvalid):
        verify(BODY + b" ", slack_headers(BODY, SECRET))


@pytest.mark.parametrize(("shift", "direction"), [(301, "past"), (-301, "future")])
def test_stale_and_future_timestamps(shift: int, direction: str) -> None:
    with pytest.raises(TimestampOutOfTolerance, match=f"301 s in the {direction}"):
        verify(BODY, slack_headers(BODY, SECRET), now=NOW + shift)


@pytest.mark.parametrize(
    "body",
    [
        b"payload=%7B%7D",
        b'{"type": "event_callback", "event": {"type": "message"}}',
        b'{"type": "event_callback", "event_id": "Ev1"}',
        b'{"type": "url_verification"}',
        b'{"type": "url_verification", "challenge": 7}',
    ],
)
def test_verified_but_unusable_body(body: bytes) -> None:
    with pytest.raises(PayloadError):
        verify(body, slack_headers(body, SECRET))

import hashlib
import hmac
import json

import pytest

from effectgate.gateway.signatures import (
    PayloadError,
    SchemeConfigError,
    SignatureInvalid,
    SignatureMalformed,
    SignatureMissing,
    UnsupportedSignatureVersion,
    Verified,
    body_event_id,
    build_scheme,
)
from tests.unit.gateway.signatures.signing import github_headers, hex_mac

SECRET = "gh-webhook-secret"
BODY = json.dumps({"action": "opened", "issue": {"number": 1}}).encode()


def verify(
    body: bytes, headers: dict[str, str], *, secrets: tuple[str, ...] = (SECRET,), **options: bool
) -> Verified:
    return build_scheme("github", secrets, options=options).verify(body, headers)


def test_published_vector_from_githubs_documentation() -> None:
    # "Testing the webhook payload validation", https://docs.github.com/en/webhooks/using-webhooks/
    # validating-webhook-deliveries: secret "It's a Secret to Everybody", payload "Hello, World!".
    secret, payload = "It's a Secret to Everybody", b"Hello, World!"
    expected = "757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
    assert hmac.new(secret.encode(), payload, hashlib.sha256).hexdigest() == expected
    headers = {
        "X-Hub-Signature-256": f"sha256={expected}",
        "X-GitHub-Delivery": "d",
        "X-GitHub-Event": "ping",
    }
    # The signature passes; only then is the body found not to be JSON, hence 400 rather than 401.
    with pytest.raises(PayloadError, match="not valid JSON"):
        verify(payload, headers, secrets=(secret,))
    with pytest.raises(SignatureInvalid):
        verify(payload, {**headers, "X-Hub-Signature-256": "sha256=" + "0" * 64}, secrets=(secret,))


def test_event_type_gets_the_body_action() -> None:
    verified = verify(BODY, github_headers(BODY, SECRET, event="issues"))
    (event,) = verified.events
    # X-GitHub-Delivery is unsigned: identity is the body's digest, the delivery id is kept for logs.
    assert (event.id, event.delivery_id, event.type) == (
        body_event_id(BODY),
        "72d3162e-cc78-11e3-81ab-4c9367dc0958",
        "issues.opened",
    )
    assert not event.type_signed
    assert event.payload == {"action": "opened", "issue": {"number": 1}}


@pytest.mark.parametrize("body", [b'{"ref": "refs/heads/main"}', b'{"action": 3}', b'{"action": ""}', b"[]"])
def test_event_type_without_a_string_action_is_the_header(body: bytes) -> None:
    assert verify(body, github_headers(body, SECRET)).events[0].type == "push"


def test_rotation() -> None:
    assert verify(BODY, github_headers(BODY, SECRET), secrets=("older", SECRET)).secret_index == 1


def sha1_header(body: bytes, secret: str = SECRET) -> str:
    return "sha1=" + hex_mac(secret, body, "sha1")


def test_sha1_only_when_allowed() -> None:
    headers = github_headers(BODY, SECRET)
    headers["X-Hub-Signature"] = sha1_header(BODY)
    del headers["X-Hub-Signature-256"]
    with pytest.raises(UnsupportedSignatureVersion, match="allow_sha1"):
        verify(BODY, headers)
    assert verify(BODY, headers, allow_sha1=True).secret_index == 0
    with pytest.raises(SignatureInvalid):
        verify(BODY + b" ", headers, allow_sha1=True)


def test_sha256_wins_over_sha1_when_both_are_sent() -> None:
    headers = github_headers(BODY, SECRET)
    headers["X-Hub-Signature"] = sha1_header(BODY, "wrong")
    assert verify(BODY, headers, allow_sha1=True).secret_index == 0
    headers = github_headers(BODY, "wrong")
    headers["X-Hub-Signature"] = sha1_header(BODY)
    with pytest.raises(SignatureInvalid):
        verify(BODY, headers, allow_sha1=True)


def test_missing_signature() -> None:
    headers = github_headers(BODY, SECRET)
    del headers["X-Hub-Signature-256"]
    with pytest.raises(SignatureMissing, match="X-Hub-Signature-256"):
        verify(BODY, headers)
    with pytest.raises(SignatureMissing):
        verify(BODY, {**headers, "X-Hub-Signature-256": ""})


@pytest.mark.parametrize(
    "value",
    ["sha256", "sha256=", "sha256=" + "g" * 64, "sha256=" + "a" * 40, "sha256=" + "ä" * 64, "=" + "a" * 64],
)
def test_malformed_signature(value: str) -> None:
    headers = {**github_headers(BODY, SECRET), "X-Hub-Signature-256": value}
    with pytest.raises(SignatureMalformed):
        verify(BODY, headers)


def test_other_algorithm_is_unsupported() -> None:
    headers = {**github_headers(BODY, SECRET), "X-Hub-Signature-256": "sha512=" + "a" * 128}
    with pytest.raises(UnsupportedSignatureVersion):
        verify(BODY, headers)


@pytest.mark.parametrize(
    ("body", "secret"), [(BODY + b" ", SECRET), (BODY, "other")], ids=["tampered", "wrong-secret"]
)
def test_invalid_signature(body: bytes, secret: str) -> None:
    with pytest.raises(SignatureInvalid, match="1 configured secret"):
        verify(body, github_headers(BODY, secret))


@pytest.mark.parametrize("missing", ["X-GitHub-Delivery", "X-GitHub-Event"])
def test_missing_delivery_or_event_header_is_a_payload_error(missing: str) -> None:
    headers = github_headers(BODY, SECRET)
    del headers[missing]
    with pytest.raises(PayloadError):
        verify(BODY, headers)


def test_option_is_validated() -> None:
    with pytest.raises(SchemeConfigError, match="allow_sha1"):
        build_scheme("github", [SECRET], options={"allow_sha1": 1})

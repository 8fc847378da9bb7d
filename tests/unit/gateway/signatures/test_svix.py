"""Svix deliveries (``svix-*`` headers), signed and judged by the ``svix`` package's own ``Webhook``."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from svix.webhooks import Webhook, WebhookVerificationError

from effectgate.gateway.signatures import (
    SignatureInvalid,
    TimestampOutOfTolerance,
    VerificationError,
    build_scheme,
)

SECRET = "whsec_" + base64.b64encode(b"svix test secret, 32 bytes long!").decode()
OTHER = "whsec_" + base64.b64encode(b"another svix secret, also 32 b!!").decode()
MSG_ID = "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W"
BODY = json.dumps({"type": "invoice.paid", "data": {"id": "in_1", "amount": 1200}})


def svix_headers(body: str = BODY, secret: str = SECRET, timestamp: float | None = None) -> dict[str, str]:
    ts = time.time() if timestamp is None else timestamp
    when = datetime.fromtimestamp(int(ts), tz=UTC)
    return {
        "svix-id": MSG_ID,
        "svix-timestamp": str(int(ts)),
        "svix-signature": Webhook(secret).sign(MSG_ID, when, body),
    }


def svix_accepts(body: str, headers: dict[str, str], secret: str = SECRET) -> bool:
    try:
        Webhook(secret).verify(body, headers)
    except WebhookVerificationError:
        return False
    return True


def ours_accepts(body: str, headers: dict[str, str], secrets: tuple[str, ...] = (SECRET,)) -> bool:
    try:
        build_scheme("standard-webhooks", list(secrets)).verify(body.encode(), headers)
    except VerificationError:
        return False
    return True


def test_what_svix_signs_is_accepted_by_both() -> None:
    headers = svix_headers()
    assert svix_accepts(BODY, headers)
    verified = build_scheme("standard-webhooks", [OTHER, SECRET]).verify(BODY.encode(), headers)
    (event,) = verified.events
    assert (event.id, event.type, verified.secret_index) == (MSG_ID, "invoice.paid", 1)


@pytest.mark.parametrize(
    ("body", "make_headers", "error"),
    [
        (BODY.replace("1200", "1"), lambda: svix_headers(), SignatureInvalid),
        (BODY, lambda: svix_headers(secret=OTHER), SignatureInvalid),
        (BODY, lambda: {**svix_headers(), "svix-id": "msg_other"}, SignatureInvalid),
        (BODY, lambda: svix_headers(timestamp=time.time() - 600), TimestampOutOfTolerance),
        (BODY, lambda: svix_headers(timestamp=time.time() + 600), TimestampOutOfTolerance),
    ],
    ids=["tampered", "other-secret", "other-id", "stale", "future"],
)
def test_what_we_reject_svix_rejects_too(
    body: str, make_headers: Callable[[], dict[str, str]], error: type[Exception]
) -> None:
    # Signed when the test runs, not at collection: svix and we both judge against the real clock.
    headers = make_headers()
    with pytest.raises(error):
        build_scheme("standard-webhooks", [SECRET]).verify(body.encode(), headers)
    assert not svix_accepts(body, headers)


def test_several_signatures_in_one_header_as_svix_sends_during_rotation() -> None:
    old, new = svix_headers(secret=OTHER), svix_headers()
    both = {**new, "svix-signature": f"{old['svix-signature']} {new['svix-signature']}"}
    assert svix_accepts(BODY, both) and ours_accepts(BODY, both)
    assert build_scheme("standard-webhooks", [SECRET]).verify(BODY.encode(), both).secret_index == 0


@settings(max_examples=100, deadline=None, database=None)
@given(
    body=st.text(max_size=200),
    flip=st.sampled_from(["none", "body", "id", "timestamp", "signature"]),
)
def test_svix_and_we_agree_on_every_delivery(body: str, flip: str) -> None:
    headers = svix_headers(body)
    if flip == "body":
        body += " "
    elif flip == "id":
        headers["svix-id"] += "x"
    elif flip == "timestamp":
        headers["svix-timestamp"] = str(int(headers["svix-timestamp"]) - 1)
    elif flip == "signature":
        headers["svix-signature"] = "v1," + base64.b64encode(b"\0" * 32).decode()
    # Our verdict on the signature alone: a body that is not JSON with a type is authentic but unusable.
    try:
        build_scheme("standard-webhooks", [SECRET]).verify(body.encode(), headers)
        ours = True
    except SignatureInvalid:
        ours = False
    except VerificationError as exc:
        assert exc.code == "malformed_payload"
        ours = True
    assert ours == svix_accepts(body, headers) == (flip == "none")

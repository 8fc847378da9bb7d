"""An unauthenticated sender cannot make verification do unbounded work by presenting many signatures."""

from __future__ import annotations

import base64
import time

import pytest
import stripe
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from effectgate.gateway.signatures import SignatureMalformed, build_scheme
from effectgate.gateway.signatures._matching import MAX_PRESENTED_SIGNATURES

BODY = b'{"type": "invoice.paid", "pad": "' + b"x" * 200_000 + b'"}'


def ed25519_scheme() -> tuple[Ed25519PrivateKey, object]:
    key = Ed25519PrivateKey.generate()
    public = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return key, build_scheme("standard-webhooks", ["whpk_" + base64.b64encode(public).decode()])


def test_thousands_of_ed25519_signatures_are_refused_before_any_is_checked() -> None:
    _, scheme = ed25519_scheme()
    # Last byte 0 passes OpenSSL's cheap early rejection: each would cost a full hash of the body.
    fake = base64.b64encode(b"\x01" * 63 + b"\x00").decode()
    headers = {
        "webhook-id": "msg_1",
        "webhook-timestamp": str(int(time.time())),
        "webhook-signature": " ".join(["v1a," + fake] * 2000),
    }
    # Refused by count before any check: without the cap this is a SignatureInvalid after 2,000
    # verifications of a 200 KB body (seconds of a blocked event loop).
    with pytest.raises(SignatureMalformed, match="2000 signatures presented"):
        scheme.verify(BODY, headers)  # type: ignore[attr-defined]


def test_a_rotation_sized_list_with_the_valid_signature_last_still_verifies() -> None:
    key, scheme = ed25519_scheme()
    ts = str(int(time.time()))
    good = base64.b64encode(key.sign(b"msg_1." + ts.encode() + b"." + BODY)).decode()
    junk = base64.b64encode(b"\x01" * 64).decode()
    signatures = ["v1a," + junk] * (MAX_PRESENTED_SIGNATURES - 1) + ["v1a," + good]
    headers = {"webhook-id": "msg_1", "webhook-timestamp": ts, "webhook-signature": " ".join(signatures)}
    verified = scheme.verify(BODY, headers)  # type: ignore[attr-defined]
    assert verified.secret_index == 0


def test_stripe_headers_with_too_many_v1_entries_are_refused() -> None:
    scheme = build_scheme("stripe", ["whsec_flood"])
    header = stripe.WebhookSignature.generate_signature_header(BODY.decode(), "whsec_other")
    t, v1 = header.split(",")
    flood = ",".join([t] + [v1] * (MAX_PRESENTED_SIGNATURES + 1))
    with pytest.raises(SignatureMalformed, match="at most 8 are accepted"):
        scheme.verify(BODY, {"stripe-signature": flood})

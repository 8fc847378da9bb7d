"""A PayPal scheme on the tests' own CA with an in-memory fetcher, a delivery body and PayPal's headers for it: the
scheme's tests, its fetch budget's and the attacks on it start from these."""

from __future__ import annotations

import json
from typing import Any

from effectgate.gateway.signatures import Scheme, build_scheme
from tests.unit.gateway.signatures.paypal_pki import CERT_URL, MemoryFetcher, Pki, iso
from tests.unit.gateway.signatures.signing import NOW, PAYPAL_CA_FILE, PAYPAL_PKI, PAYPAL_WEBHOOK_ID

BODY = json.dumps(
    {
        "id": "WH-2WR32451HC0233532-67976317FL4543714",
        "event_version": "1.0",
        "create_time": "2023-11-14T22:13:19.000Z",
        "resource_type": "capture",
        "event_type": "PAYMENT.CAPTURE.COMPLETED",
        "summary": "Payment completed for $ 7.47 USD",
        "resource": {"id": "42311647XV020574X", "status": "COMPLETED"},
    }
).encode()


def make(
    fetcher: MemoryFetcher | None = None, secrets: tuple[str, ...] = (PAYPAL_WEBHOOK_ID,), **options: Any
) -> tuple[Scheme, MemoryFetcher]:
    fetcher = fetcher or MemoryFetcher({CERT_URL: PAYPAL_PKI.chain_pem})
    scheme = build_scheme(
        "paypal",
        list(secrets),
        options={"ca_bundle": PAYPAL_CA_FILE, "fetcher": fetcher, "confirm": "off", **options},
    )
    return scheme, fetcher


def signed(
    body: bytes = BODY, webhook_id: str = PAYPAL_WEBHOOK_ID, pki: Pki = PAYPAL_PKI, **kw: Any
) -> dict[str, str]:
    return pki.headers(body, webhook_id=webhook_id, time=kw.pop("time", iso(NOW)), **kw)

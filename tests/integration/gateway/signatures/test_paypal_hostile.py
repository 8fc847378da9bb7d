"""PayPal deliveries from a hostile sender, through the whole gateway against a real ledger.

The gateway fetches its certificate from the fake PayPal API over loopback HTTPS (a CA made here) and,
unless a source says ``confirm = "off"``, asks that API about each event. The attacks: a body forged to the CRC32
of a captured one (``crc_forge``), replayed under the captured signature; a 20-day-old transmission; a
forged body that arrives before the genuine one; the same forged transmission raced against the genuine
one; a PayPal API that is down; a certificate URL that cannot be fetched. Each is counted in the ledger.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
import zlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from effectgate.gateway.app import create_app
from effectgate.gateway.config import parse
from effectgate.gateway.fakes.paypal import FakePayPal, SentTransmission
from effectgate.handlers.event import Event
from effectgate.handlers.registry import Registry
from effectgate.ledger import db
from effectgate.ledger.signature_failures import FailureFlusher
from tests.integration.gateway.signatures.paypal_server import serve_fake_paypal
from tests.unit.gateway.signatures.crc_forge import FILLER, forge
from tests.unit.gateway.signatures.paypal_pki import Pki, iso

pytestmark = pytest.mark.anyio

WEBHOOK_ID = "8PT597110X687430LKGECATA"
CLIENT_ID, CLIENT_SECRET = "AeA1QIZXiflr1_-fake-client", "EGnHDxD_fake-secret"
ENV = {"PAYPAL_WEBHOOK_ID": WEBHOOK_ID, "PAYPAL_CLIENT_ID": CLIENT_ID, "PAYPAL_CLIENT_SECRET": CLIENT_SECRET}
SOURCES = ("paypal", "paypal_default", "paypal_verify", "paypal_unreachable")
CERT_NAME = "CERT-360caa42-fca2a594-a5cafa77"


@dataclass
class PayPal:
    """The fake PayPal, its signing PKI and where it listens."""

    fake: FakePayPal
    pki: Pki
    base: str

    @property
    def cert_url(self) -> str:
        return f"{self.base}/v1/notifications/certs/{CERT_NAME}"

    def deliver(self, event: dict[str, Any], *, at: float | None = None) -> tuple[bytes, dict[str, str]]:
        """What PayPal sends for ``event`` now (or at ``at``), recorded in the fake as sent."""
        body = json.dumps(event).encode()
        headers = self.pki.headers(
            body,
            webhook_id=WEBHOOK_ID,
            time=iso(time.time() if at is None else at),
            transmission_id=str(uuid.uuid1()),
            url=self.cert_url,
        )
        self.fake.sent(event, SentTransmission.from_headers(headers, WEBHOOK_ID))
        return body, {**headers, "content-type": "application/json"}


@pytest.fixture(scope="module")
def paypal(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PayPal]:
    workdir = tmp_path_factory.mktemp("paypal")
    pki = Pki.around(time.time())
    fake = FakePayPal(CLIENT_ID, CLIENT_SECRET, certificates={CERT_NAME: pki.chain_pem})
    with serve_fake_paypal(fake, pki, workdir) as base:
        yield PayPal(fake, pki, base)


def config_text(paypal: PayPal, ca_file: str) -> str:
    common = (
        f'cert_url_bases = ["{paypal.base}/v1/notifications/certs/"], ca_bundle = "{ca_file}", '
        f'fetch_ca_bundle = "{ca_file}"'
    )
    api = (
        f'api_base = "{paypal.base}", client_id_env = "PAYPAL_CLIENT_ID", '
        'client_secret_env = "PAYPAL_CLIENT_SECRET"'
    )
    # Nothing listens on port 9 of the loopback (discard): every fetch there fails to connect.
    unreachable = f'cert_url_bases = ["https://127.0.0.1:9/v1/notifications/certs/"], ca_bundle = "{ca_file}"'
    return f"""
[sources.paypal]
scheme = "paypal"
secrets = ["PAYPAL_WEBHOOK_ID"]
options = {{ {common}, confirm = "off" }}

# No confirm: the default (fetch_event), as an operator who only gives the credentials gets it.
[sources.paypal_default]
scheme = "paypal"
secrets = ["PAYPAL_WEBHOOK_ID"]
options = {{ {common}, {api} }}

[sources.paypal_verify]
scheme = "paypal"
secrets = ["PAYPAL_WEBHOOK_ID"]
options = {{ {common}, confirm = "verify_api", {api} }}

[sources.paypal_unreachable]
scheme = "paypal"
secrets = ["PAYPAL_WEBHOOK_ID"]
options = {{ {unreachable}, confirm = "off" }}
"""


async def _capture(ctx: Any, ev: Event) -> None:
    return None


def make_registry() -> Registry:
    registry = Registry()
    for source in SOURCES:
        registry.effect(source=source, events=["PAYMENT.CAPTURE.COMPLETED"], name=f"{source}.capture")(
            _capture
        )
    return registry


@pytest.fixture
async def app(paypal: PayPal, db_url: str, tmp_path: Path) -> AsyncIterator[Starlette]:
    ca_file = paypal.pki.write_root(tmp_path)
    # Failed verifications are written by hand (flusher.flush()), not by a background pass mid-test.
    app = create_app(
        parse(config_text(paypal, ca_file), env=ENV), make_registry(), db_url, failure_flush_interval=3600
    )
    async with app.router.lifespan_context(app):
        yield app


@pytest.fixture
async def client(app: Starlette) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as c:
        yield c


def capture_event(value: str = "7.47") -> dict[str, Any]:
    return {
        "id": f"WH-{uuid.uuid4().hex[:20].upper()}",
        "event_version": "1.0",
        "create_time": "2026-12-01T14:00:00.000Z",
        "resource_type": "capture",
        "event_type": "PAYMENT.CAPTURE.COMPLETED",
        "summary": f"Payment completed for $ {value} USD",
        "resource": {
            "id": uuid.uuid4().hex[:17].upper(),
            "status": "COMPLETED",
            "amount": {"currency_code": "USD", "value": value},
        },
    }


def forged_copy(genuine: bytes, value: str) -> bytes:
    """Another capture (new event id, ``value``) given ``genuine``'s CRC32 through a note field."""
    document = json.loads(genuine)
    document["id"] = f"WH-FORGED-{uuid.uuid4().hex[:12].upper()}"
    document["resource"]["amount"]["value"] = value
    document["resource"]["note_to_payer"] = FILLER.decode()
    return forge(json.dumps(document).encode(), zlib.crc32(genuine))


async def effects(conn: db.Conn) -> list[str]:
    cursor = await conn.execute("SELECT effect_key FROM effects ORDER BY effect_key")
    return [row["effect_key"] for row in await cursor.fetchall()]


def event_id(body: bytes) -> str:
    return str(json.loads(body)["id"])


async def test_a_crc_forged_body_under_a_captured_signature_claims_nothing(
    app: Starlette, client: httpx.AsyncClient, conn: db.Conn, paypal: PayPal
) -> None:
    body, headers = paypal.deliver(capture_event())
    first = await client.post("/webhooks/paypal", content=body, headers=headers)
    assert first.status_code == 202, first.text
    forged_ids = []
    for value in ("9999.00", "123456.00"):
        forged = forged_copy(body, value)
        forged_ids.append(event_id(forged))
        r = await client.post("/webhooks/paypal", content=forged, headers=headers)
        assert (r.status_code, r.json().get("error")) == (401, "transmission_reused"), r.text
    # PayPal's own retry of the same transmission (or a plain replay) is a duplicate, not a reuse.
    again = await client.post("/webhooks/paypal", content=body, headers=headers)
    assert again.status_code == 200, again.text
    assert await effects(conn) == [f"paypal:{event_id(body)}:paypal.capture"]
    flusher: FailureFlusher = app.state.signature_failure_flusher
    await flusher.flush()
    cursor = await conn.execute("SELECT reason, count FROM signature_failures WHERE source = 'paypal'")
    assert [(r["reason"], r["count"]) for r in await cursor.fetchall()] == [("transmission_reused", 2)]


async def test_a_twenty_day_old_transmission_is_refused_by_default(
    client: httpx.AsyncClient, conn: db.Conn, paypal: PayPal
) -> None:
    body, headers = paypal.deliver(capture_event(), at=time.time() - 20 * 86_400)
    r = await client.post("/webhooks/paypal", content=body, headers=headers)
    assert (r.status_code, r.json().get("error")) == (401, "timestamp_out_of_tolerance")
    assert "tolerance is 300 s" in r.json()["detail"]
    assert await effects(conn) == []


async def test_genuine_and_forged_racing_on_one_transmission_claim_one_of_them(
    client: httpx.AsyncClient, conn: db.Conn, paypal: PayPal
) -> None:
    # The memory is the ledger's table, so concurrent requests (as on several replicas) agree on one body.
    body, headers = paypal.deliver(capture_event())
    forged = forged_copy(body, "9999.00")
    answers = await asyncio.gather(
        *(client.post("/webhooks/paypal", content=b, headers=headers) for b in [body, forged] * 8)
    )
    codes = sorted({(r.status_code, r.json().get("error")) for r in answers}, key=str)
    assert (401, "transmission_reused") in codes
    claimed = await effects(conn)
    assert claimed in (
        [f"paypal:{event_id(body)}:paypal.capture"],
        [f"paypal:{event_id(forged)}:paypal.capture"],
    )


async def test_by_default_a_forgery_that_arrives_before_the_genuine_delivery_claims_nothing(
    client: httpx.AsyncClient, conn: db.Conn, paypal: PayPal
) -> None:
    body, headers = paypal.deliver(capture_event())
    calls = paypal.fake.calls["webhooks-events"]
    for forged in (forged_copy(body, "9999.00"), forged_copy(body, "123456.00")):
        r = await client.post("/webhooks/paypal_default", content=forged, headers=headers)
        assert (r.status_code, r.json().get("error")) == (401, "confirmation_failed"), r.text
    # Same event id, another amount: PayPal's stored event differs.
    document = json.loads(body)
    document["resource"]["amount"]["value"] = "9999.00"
    document["summary"] = document["summary"] + FILLER.decode()
    same_id = forge(json.dumps(document).encode(), zlib.crc32(body))
    r = await client.post("/webhooks/paypal_default", content=same_id, headers=headers)
    assert (r.status_code, r.json().get("error")) == (401, "confirmation_failed")
    assert "resource" in r.json()["detail"]
    assert await effects(conn) == []
    # The forgeries were not remembered as the transmission's body: the genuine delivery still passes.
    ok = await client.post("/webhooks/paypal_default", content=body, headers=headers)
    assert ok.status_code == 202, ok.text
    # PayPal's retry of it is a duplicate: the genuine delivery is claimed once.
    again = await client.post("/webhooks/paypal_default", content=body, headers=headers)
    assert again.status_code == 200, again.text
    assert await effects(conn) == [f"paypal_default:{event_id(body)}:paypal_default.capture"]
    assert paypal.fake.calls["webhooks-events"] == calls + 5


async def test_with_confirm_off_a_forgery_that_arrives_first_is_claimed(
    client: httpx.AsyncClient, conn: db.Conn, paypal: PayPal
) -> None:
    # The risk an operator accepts by writing confirm = "off": why it is not the default.
    body, headers = paypal.deliver(capture_event())
    forged = forged_copy(body, "9999.00")
    r = await client.post("/webhooks/paypal", content=forged, headers=headers)
    assert r.status_code == 202, r.text
    genuine = await client.post("/webhooks/paypal", content=body, headers=headers)
    assert (genuine.status_code, genuine.json().get("error")) == (401, "transmission_reused")
    assert await effects(conn) == [f"paypal:{event_id(forged)}:paypal.capture"]


async def test_verify_api_confirms_what_paypal_sent_and_refuses_what_it_did_not(
    client: httpx.AsyncClient, conn: db.Conn, paypal: PayPal
) -> None:
    body, headers = paypal.deliver(capture_event())
    ok = await client.post("/webhooks/paypal_verify", content=body, headers=headers)
    assert ok.status_code == 202, ok.text
    # Signed with PayPal's key but never sent by this PayPal: the verify API says FAILURE.
    unsent = json.dumps(capture_event()).encode()
    unsent_headers = paypal.pki.headers(
        unsent, webhook_id=WEBHOOK_ID, time=iso(time.time()), transmission_id="t-unsent", url=paypal.cert_url
    )
    r = await client.post("/webhooks/paypal_verify", content=unsent, headers=unsent_headers)
    assert (r.status_code, r.json().get("error")) == (401, "confirmation_failed")
    assert await effects(conn) == [f"paypal_verify:{event_id(body)}:paypal_verify.capture"]


async def test_an_unavailable_paypal_api_is_a_503_that_claims_nothing_and_says_nothing_inside(
    client: httpx.AsyncClient, conn: db.Conn, paypal: PayPal
) -> None:
    body, headers = paypal.deliver(capture_event())
    paypal.fake.failing = True
    try:
        r = await client.post("/webhooks/paypal_default", content=body, headers=headers)
    finally:
        paypal.fake.failing = False
    assert (r.status_code, r.json().get("error")) == (503, "confirmation_unavailable")
    assert "INTERNAL_SERVICE_ERROR" not in r.text and "500" not in r.text
    assert await effects(conn) == []
    # PayPal's retry, once the API is back, is claimed.
    retry = await client.post("/webhooks/paypal_default", content=body, headers=headers)
    assert retry.status_code == 202, retry.text


async def test_a_failing_certificate_fetch_is_not_echoed(
    client: httpx.AsyncClient, conn: db.Conn, paypal: PayPal
) -> None:
    body = json.dumps(capture_event()).encode()
    headers = paypal.pki.headers(
        body,
        webhook_id=WEBHOOK_ID,
        time=iso(time.time()),
        url=f"https://127.0.0.1:9/v1/notifications/certs/{CERT_NAME}",
    )
    r = await client.post("/webhooks/paypal_unreachable", content=body, headers=headers)
    assert (r.status_code, r.json().get("error")) == (401, "certificate_untrusted")
    detail = r.json()["detail"]
    assert detail.startswith("could not fetch the signing certificate")
    for leaked in ("ConnectError", "Errno", "127.0.0.1", "refused", "attempts"):
        assert leaked not in r.text
    assert await effects(conn) == []

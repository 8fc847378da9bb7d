"""Certificate fetches an unauthenticated sender can cause, counted at the certificate server.

The gateway runs whole (``create_app`` against a real ledger) and fetches certificates over loopback HTTPS
from the fake PayPal, which counts every fetch (``FakePayPal.calls["certs"]``). Clients are told apart by
their address, as the edge limits tell them apart. The scheme's clock is injected, so a budget refills
and a remembered failure expires when the test moves the clock, never while it waits.

The penalty box is off: on a direct peer its default mode still serves a boxed client's requests one at a
time, each able to cause a fetch, so it is no bound on fetches; the budgets are what is under test here.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from effectgate.gateway import metrics
from effectgate.gateway.app import create_app
from effectgate.gateway.config import Config, parse
from effectgate.gateway.fakes.paypal import FakePayPal
from effectgate.gateway.signatures import build_scheme
from effectgate.gateway.signatures._fetch_budget import (
    ALL_FETCH_BURST,
    ALL_FETCH_INTERVAL,
    CLIENT_FETCH_BURST,
    CLIENT_FETCH_INTERVAL,
)
from effectgate.gateway.signatures.paypal import FAILURE_TTL
from effectgate.handlers.event import Event
from effectgate.handlers.registry import Registry
from effectgate.ledger import db
from tests.integration.gateway.signatures.paypal_server import serve_fake_paypal
from tests.prometheus import value
from tests.unit.gateway.signatures.paypal_pki import Pki, iso

pytestmark = pytest.mark.anyio

WEBHOOK_ID = "8PT597110X687430LKGECATA"
CERT_NAME = "CERT-360caa42-fca2a594-a5cafa77"
PAYPAL_ADDRESS = "173.0.82.126"
FAILURES = "effectgate_verification_failures_total"


class Clock:
    """The scheme's wall clock, moved only by the test."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclasses.dataclass
class Setup:
    app: Starlette
    clock: Clock
    fake: FakePayPal
    pki: Pki
    base: str

    def url(self, name: str) -> str:
        return f"{self.base}/v1/notifications/certs/{name}"

    @property
    def fetches(self) -> int:
        return self.fake.calls["certs"]

    @asynccontextmanager
    async def client(self, address: str) -> AsyncIterator[httpx.AsyncClient]:
        transport = httpx.ASGITransport(app=self.app, client=(address, 40_000))
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as c:
            yield c

    def unsigned(self, cert: str) -> tuple[bytes, dict[str, str]]:
        """A well-formed delivery naming ``cert`` on the allowed host, with a signature nobody made."""
        body = json.dumps(capture_event()).encode()
        return body, {
            "PAYPAL-TRANSMISSION-ID": str(uuid.uuid4()),
            "PAYPAL-TRANSMISSION-TIME": iso(self.clock()),
            "PAYPAL-TRANSMISSION-SIG": base64.b64encode(os.urandom(256)).decode(),
            "PAYPAL-CERT-URL": self.url(cert),
            "PAYPAL-AUTH-ALGO": "SHA256withRSA",
        }

    def genuine(self) -> tuple[bytes, dict[str, str]]:
        body = json.dumps(capture_event()).encode()
        headers = self.pki.headers(
            body,
            webhook_id=WEBHOOK_ID,
            time=iso(self.clock()),
            transmission_id=str(uuid.uuid1()),
            url=self.url(CERT_NAME),
        )
        return body, headers


def capture_event() -> dict[str, Any]:
    return {
        "id": f"WH-{uuid.uuid4().hex[:20].upper()}",
        "event_type": "PAYMENT.CAPTURE.COMPLETED",
        "resource": {
            "id": uuid.uuid4().hex[:17].upper(),
            "amount": {"currency_code": "USD", "value": "7.47"},
        },
    }


@pytest.fixture(scope="module")
def paypal(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FakePayPal, Pki, str]]:
    workdir = tmp_path_factory.mktemp("paypal-certs")
    pki = Pki.around(time.time())
    fake = FakePayPal("client", "secret", certificates={CERT_NAME: pki.chain_pem})
    with serve_fake_paypal(fake, pki, workdir) as base:
        yield fake, pki, base


async def _capture(ctx: Any, ev: Event) -> None:
    return None


def configured(base: str, ca_file: str, clock: Clock) -> Config:
    options = {
        "cert_url_bases": [f"{base}/v1/notifications/certs/"],
        "ca_bundle": ca_file,
        "fetch_ca_bundle": ca_file,
        "confirm": "off",
    }
    text = f"""
[gateway.penalty_box]
enabled = false

[sources.paypal]
scheme = "paypal"
secrets = ["PAYPAL_WEBHOOK_ID"]
options = {{ {", ".join(f"{k} = {json.dumps(v)}" for k, v in options.items())} }}
"""
    config = parse(text, env={"PAYPAL_WEBHOOK_ID": WEBHOOK_ID})
    # The clock cannot be set from a file: the same source, its scheme built with the test's clock.
    scheme = build_scheme("paypal", [WEBHOOK_ID], options={**options, "clock": clock})
    source = dataclasses.replace(config.sources["paypal"], scheme=scheme)
    return dataclasses.replace(config, sources={"paypal": source})


@pytest.fixture
async def setup(paypal: tuple[FakePayPal, Pki, str], db_url: str, tmp_path: Path) -> AsyncIterator[Setup]:
    fake, pki, base = paypal
    clock = Clock()
    registry = Registry()
    registry.effect(source="paypal", events=["PAYMENT.CAPTURE.COMPLETED"], name="capture")(_capture)
    app = create_app(configured(base, pki.write_root(tmp_path), clock), registry, db_url)
    async with app.router.lifespan_context(app):
        yield Setup(app, clock, fake, pki, base)


async def effects(conn: db.Conn) -> list[str]:
    cursor = await conn.execute("SELECT effect_key FROM effects ORDER BY effect_key")
    return [row["effect_key"] for row in await cursor.fetchall()]


def answer(r: httpx.Response) -> tuple[int, str]:
    return r.status_code, r.json().get("error")


async def test_one_client_naming_200_new_certificates_causes_its_budget_of_fetches(
    setup: Setup, conn: db.Conn, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "effectgate.gateway.paypal")
    before, metrics_before = setup.fetches, metrics.render()
    answers = []
    async with setup.client("203.0.113.7") as attacker:
        for n in range(200):
            body, headers = setup.unsigned(f"CERT-attacker-{n}")
            answers.append(answer(await attacker.post("/webhooks/paypal", content=body, headers=headers)))
        assert setup.fetches - before == CLIENT_FETCH_BURST
        # The fetched ones failed (PayPal's host has no such certificate); the rest were never fetched.
        assert answers[:CLIENT_FETCH_BURST] == [(401, "certificate_untrusted")] * CLIENT_FETCH_BURST
        assert answers[CLIENT_FETCH_BURST:] == [(401, "certificate_fetch_limited")] * (
            200 - CLIENT_FETCH_BURST
        )
        limited = {"source": "paypal", "reason": "certificate_fetch_limited"}
        grew = value(metrics.render(), FAILURES, **limited) - value(metrics_before, FAILURES, **limited)
        assert grew == 200 - CLIENT_FETCH_BURST
        # One warning for the whole episode, naming the client, not one per refusal.
        (record,) = [r for r in caplog.records if r.getMessage() == "paypal.certificate_fetches_limited"]
        assert (record.__dict__["client"], record.__dict__["budget"]) == ("203.0.113.7", "client")

        # PayPal, from its own address, is served while the attacker's budget is spent: its certificate,
        # not cached yet, is fetched and the delivery claimed.
        body, headers = setup.genuine()
        async with setup.client(PAYPAL_ADDRESS) as paypal:
            ok = await paypal.post("/webhooks/paypal", content=body, headers=headers)
        assert ok.status_code == 202, ok.text
        assert setup.fetches - before == CLIENT_FETCH_BURST + 1
        assert await effects(conn) == [f"paypal:{json.loads(body)['id']}:capture"]

        # The budget refills with the clock, one fetch per interval.
        setup.clock.advance(CLIENT_FETCH_INTERVAL)
        for n in range(200, 210):
            body, headers = setup.unsigned(f"CERT-attacker-{n}")
            await attacker.post("/webhooks/paypal", content=body, headers=headers)
        assert setup.fetches - before == CLIENT_FETCH_BURST + 2


async def test_many_clients_together_cause_at_most_the_shared_budget_of_fetches(
    setup: Setup, conn: db.Conn
) -> None:
    # PayPal's certificate is cached before the flood, as it is on any gateway already receiving.
    body, headers = setup.genuine()
    async with setup.client(PAYPAL_ADDRESS) as paypal:
        assert (await paypal.post("/webhooks/paypal", content=body, headers=headers)).status_code == 202
    # That fetch was paid from the shared budget too: refilled before the flood, so the flood finds it full.
    setup.clock.advance(ALL_FETCH_INTERVAL)
    before = setup.fetches
    codes: list[tuple[int, str]] = []
    details = set()
    for n in range(CLIENT_FETCH_BURST):
        for address in range(50):
            async with setup.client(f"198.51.100.{address}") as c:
                body, headers = setup.unsigned(f"CERT-{address}-{n}")
                r = await c.post("/webhooks/paypal", content=body, headers=headers)
                codes.append(answer(r))
                if answer(r) == (401, "certificate_fetch_limited"):
                    details.add(r.json()["detail"])
    assert setup.fetches - before == ALL_FETCH_BURST
    assert codes.count((401, "certificate_fetch_limited")) == 50 * CLIENT_FETCH_BURST - ALL_FETCH_BURST
    assert details == {
        "the signing certificate was not fetched: too many certificate fetches for unverified requests from "
        "all clients; try again later"
    }
    # Concurrent this time: a flood racing the genuine delivery, whose certificate is cached, delays nothing.
    setup.clock.advance(ALL_FETCH_INTERVAL)
    genuine = setup.genuine()

    async def flood(address: int) -> None:
        async with setup.client(f"192.0.2.{address}") as c:
            for n in range(4):
                body, headers = setup.unsigned(f"CERT-race-{address}-{n}")
                await c.post("/webhooks/paypal", content=body, headers=headers)

    async def deliver() -> httpx.Response:
        async with setup.client(PAYPAL_ADDRESS) as paypal:
            return await paypal.post("/webhooks/paypal", content=genuine[0], headers=genuine[1])

    *_, ok = await asyncio.gather(*(flood(a) for a in range(50)), deliver())
    assert ok.status_code == 202, ok.text
    assert setup.fetches - before <= ALL_FETCH_BURST + 1
    assert len(await effects(conn)) == 2


async def test_a_failing_certificate_url_is_fetched_once_per_failure_ttl(setup: Setup) -> None:
    before = setup.fetches

    async def name_it(address: str, cert: str, times: int) -> list[httpx.Response]:
        async with setup.client(address) as c:
            sent = [setup.unsigned(cert) for _ in range(times)]
            return await asyncio.gather(*(c.post("/webhooks/paypal", content=b, headers=h) for b, h in sent))

    answers = await name_it("203.0.113.9", "CERT-gone", 50)
    assert setup.fetches - before == 1
    assert {answer(r) for r in answers} == {(401, "certificate_untrusted")}
    assert {r.json()["detail"] for r in answers} == {
        "could not fetch the signing certificate (the gateway log has the reason)"
    }
    # More failing URLs than the certificate cache holds (16), each from its own client, do not push the
    # failure out: it is remembered apart from the certificates.
    for n in range(24):
        setup.clock.advance(1.0)
        await name_it(f"198.51.100.{n}", f"CERT-other-{n}", 1)
    assert setup.fetches - before == 1 + 24
    answers = await name_it("203.0.113.9", "CERT-gone", 50)
    assert {answer(r) for r in answers} == {(401, "certificate_untrusted")}
    assert setup.fetches - before == 1 + 24
    # Past the window it is fetched again, once.
    setup.clock.advance(FAILURE_TTL - 24)
    await name_it("203.0.113.9", "CERT-gone", 50)
    assert setup.fetches - before == 1 + 24 + 1

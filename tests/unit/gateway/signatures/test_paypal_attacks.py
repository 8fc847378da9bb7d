"""PayPal under attack, at the scheme: a body forged to a captured CRC32, certificate fetches that
unauthenticated requests trigger, and what a failure tells the sender.

The ledger-backed memory and the whole gateway are attacked in tests/integration/gateway/signatures/test_paypal_hostile.py;
here the memory is a dict with the same contract.
"""

from __future__ import annotations

import asyncio
import json
import zlib

import pytest

from effectgate.gateway.signatures import (
    CertificateFetchLimited,
    CertificateUntrusted,
    Scheme,
    TransmissionReused,
    Verified,
)
from effectgate.gateway.signatures.paypal import MAX_INFLIGHT_FETCHES
from tests.unit.gateway.signatures.crc_forge import FILLER, forge
from tests.unit.gateway.signatures.paypal_pki import CERT_URL, iso
from tests.unit.gateway.signatures.paypal_scheme import make
from tests.unit.gateway.signatures.signing import NOW, PAYPAL_PKI, PAYPAL_WEBHOOK_ID

GENUINE = json.dumps(
    {
        "id": "WH-58D329510W468432D-8HN650336L201105X",
        "event_type": "PAYMENT.CAPTURE.COMPLETED",
        "resource_type": "capture",
        "resource": {"id": "42311647XV020574X", "amount": {"currency_code": "USD", "value": "7.47"}},
    }
).encode()
CERTS = "https://api.paypal.com/v1/notifications/certs/"


def forged_copy(genuine: bytes, value: str, event_id: str) -> bytes:
    """A body with another amount and event id, given ``genuine``'s CRC32 through a note field."""
    document = json.loads(genuine)
    document["id"] = event_id
    document["resource"]["amount"]["value"] = value
    document["resource"]["note_to_payer"] = FILLER.decode()
    return forge(json.dumps(document).encode(), zlib.crc32(genuine))


class DictMemory:
    """``ReplayMemory`` in a dict: what the ledger's table does, for one process."""

    def __init__(self) -> None:
        self.seen: dict[tuple[str, str], str] = {}
        self.expiries: list[float] = []

    async def remember_first(
        self, *, source: str, transmission_id: str, body_sha256: str, expires_at: float
    ) -> str:
        self.expiries.append(expires_at)
        return self.seen.setdefault((source, transmission_id), body_sha256)


def receive(scheme: Scheme, body: bytes, headers: dict[str, str], memory: DictMemory) -> Verified:
    """What the gateway does: prepare, verify, then confirm."""

    async def run() -> Verified:
        await scheme.prepare(body, headers, now=NOW)
        verified = scheme.verify(body, headers, now=NOW)
        await scheme.confirm(verified, body, headers, source="paypal", memory=memory, now=NOW)
        return verified

    return asyncio.run(run())


def test_a_forged_body_with_the_captured_crc_passes_the_signature_alone() -> None:
    # The weakness itself: the RSA signature is over the CRC, so verify cannot tell the bodies apart.
    scheme, _ = make()
    headers = PAYPAL_PKI.headers(GENUINE, webhook_id=PAYPAL_WEBHOOK_ID, time=iso(NOW))
    for value, event_id in (("9999.00", "WH-FORGED-1"), ("123456.00", "WH-FORGED-2")):
        forged = forged_copy(GENUINE, value, event_id)
        asyncio.run(scheme.prepare(forged, headers, now=NOW))
        (event,) = scheme.verify(forged, headers, now=NOW).events
        assert (event.id, event.payload["resource"]["amount"]["value"]) == (event_id, value)


def test_the_forged_body_under_the_captured_transmission_id_is_refused() -> None:
    scheme, _ = make()
    memory = DictMemory()
    headers = PAYPAL_PKI.headers(GENUINE, webhook_id=PAYPAL_WEBHOOK_ID, time=iso(NOW))
    receive(scheme, GENUINE, headers, memory)
    for value, event_id in (("9999.00", "WH-FORGED-1"), ("123456.00", "WH-FORGED-2")):
        with pytest.raises(TransmissionReused) as caught:
            receive(scheme, forged_copy(GENUINE, value, event_id), headers, memory)
        assert caught.value.code == "transmission_reused"
    # The genuine body again (PayPal's retry of one transmission, or a replay) is no reuse: the ledger
    # answers it as a duplicate.
    receive(scheme, GENUINE, headers, memory)
    # Remembered until the signed time leaves the window, and no longer.
    assert set(memory.expiries) == {float(NOW + 300)}


def test_concurrent_deliveries_naming_one_url_cause_one_fetch() -> None:
    started, release = asyncio.Event(), asyncio.Event()
    calls: list[str] = []

    async def gated(url: str) -> bytes:
        calls.append(url)
        started.set()
        await release.wait()
        return PAYPAL_PKI.chain_pem

    scheme, _ = make(gated)  # type: ignore[arg-type]
    headers = PAYPAL_PKI.headers(GENUINE, webhook_id=PAYPAL_WEBHOOK_ID, time=iso(NOW))

    async def burst() -> None:
        waiting = [asyncio.ensure_future(scheme.prepare(GENUINE, headers, now=NOW)) for _ in range(50)]
        await started.wait()
        # Every request is queued on the one fetch in flight before it completes.
        assert calls == [CERT_URL]
        release.set()
        await asyncio.gather(*waiting)

    asyncio.run(burst())
    assert calls == [CERT_URL]
    assert scheme.verify(GENUINE, headers, now=NOW).secret_index == 0


def test_a_hanging_fetch_delays_no_other_url() -> None:
    # One lock for every URL (the old design) would keep the second delivery waiting on the first fetch.
    hang = asyncio.Event()
    slow = CERTS + "CERT-slow"

    async def fetcher(url: str) -> bytes:
        if url == slow:
            await hang.wait()
        return PAYPAL_PKI.chain_pem

    scheme, _ = make(fetcher, fetch_timeout=3600)  # type: ignore[arg-type]
    slow_headers = PAYPAL_PKI.headers(GENUINE, webhook_id=PAYPAL_WEBHOOK_ID, time=iso(NOW), url=slow)
    fast_headers = PAYPAL_PKI.headers(GENUINE, webhook_id=PAYPAL_WEBHOOK_ID, time=iso(NOW))

    async def run() -> bool:
        stuck = asyncio.ensure_future(scheme.prepare(GENUINE, slow_headers, now=NOW))
        fast = asyncio.ensure_future(scheme.prepare(GENUINE, fast_headers, now=NOW))
        # Event-loop turns, not time: the fast URL's fetch needs a handful; behind one lock for every URL
        # it cannot finish before the slow fetch is released.
        for _ in range(200):
            if fast.done():
                break
            await asyncio.sleep(0)
        finished_first = fast.done()
        hang.set()
        await asyncio.gather(stuck, fast)
        return finished_first

    assert asyncio.run(run()), "the fast URL waited for the hanging one"
    assert scheme.verify(GENUINE, fast_headers, now=NOW).secret_index == 0


def test_fresh_urls_beyond_the_in_flight_bound_are_not_fetched() -> None:
    hang = asyncio.Event()
    calls: list[str] = []

    async def hanging(url: str) -> bytes:
        calls.append(url)
        await hang.wait()
        raise OSError("HTTP 404")

    scheme, _ = make(hanging, fetch_timeout=3600)  # type: ignore[arg-type]
    urls = [CERTS + f"CERT-attacker-{n}" for n in range(MAX_INFLIGHT_FETCHES + 3)]

    async def run() -> None:
        waiting = []
        for url in urls:
            headers = PAYPAL_PKI.headers(GENUINE, webhook_id=PAYPAL_WEBHOOK_ID, time=iso(NOW), url=url)
            waiting.append(asyncio.ensure_future(scheme.prepare(GENUINE, headers, now=NOW)))
        # The requests past the bound return without a fetch while the others still wait on theirs.
        done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        assert done == set(waiting[MAX_INFLIGHT_FETCHES:]) or done <= set(waiting[MAX_INFLIGHT_FETCHES:])
        hang.set()
        await asyncio.gather(*waiting)

    asyncio.run(run())
    assert calls == urls[:MAX_INFLIGHT_FETCHES]
    headers = PAYPAL_PKI.headers(GENUINE, webhook_id=PAYPAL_WEBHOOK_ID, time=iso(NOW), url=urls[-1])
    with pytest.raises(CertificateFetchLimited, match="too many certificate fetches in flight"):
        scheme.verify(GENUINE, headers, now=NOW)


@pytest.mark.parametrize(
    "change",
    [
        {"PAYPAL-TRANSMISSION-TIME": iso(NOW - 20 * 86_400)},
        {"PAYPAL-TRANSMISSION-SIG": "c2ln"},
        {"PAYPAL-AUTH-ALGO": "none"},
        {"PAYPAL-TRANSMISSION-ID": ""},
    ],
    ids=["old", "short-signature", "algorithm", "no-id"],
)
def test_a_request_failing_the_cheap_checks_fetches_nothing(change: dict[str, str]) -> None:
    scheme, fetcher = make()
    headers = {**PAYPAL_PKI.headers(GENUINE, webhook_id=PAYPAL_WEBHOOK_ID, time=iso(NOW)), **change}
    asyncio.run(scheme.prepare(GENUINE, headers, now=NOW))
    assert fetcher.calls == []


def test_verify_reports_an_unfetched_certificate_without_detail_from_the_fetch() -> None:
    async def refusing(url: str) -> bytes:
        raise ConnectionRefusedError("[Errno 111] Connect call failed ('10.1.2.3', 443)")

    scheme, _ = make(refusing)  # type: ignore[arg-type]
    headers = PAYPAL_PKI.headers(GENUINE, webhook_id=PAYPAL_WEBHOOK_ID, time=iso(NOW))
    with pytest.raises(CertificateUntrusted) as caught:
        receive(scheme, GENUINE, headers, DictMemory())
    assert "10.1.2.3" not in caught.value.detail and "Errno" not in caught.value.detail

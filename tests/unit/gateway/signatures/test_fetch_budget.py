"""The fetch budget: a token bucket per client and one for all clients, paid from both or from neither."""

from __future__ import annotations

import asyncio

import pytest

from effectgate.gateway.signatures import CertificateUntrusted, Scheme, Verified
from effectgate.gateway.signatures._fetch_budget import (
    CLIENT_FETCH_BURST,
    CLIENT_FETCH_INTERVAL,
    FetchBudget,
    Refusal,
)
from tests.unit.gateway.signatures.paypal_pki import CERT_URL, MemoryFetcher
from tests.unit.gateway.signatures.paypal_scheme import BODY, make, signed
from tests.unit.gateway.signatures.signing import NOW, PAYPAL_PKI

CERTS = "https://api.paypal.com/v1/notifications/certs/"


def test_a_client_gets_its_burst_then_one_fetch_per_interval() -> None:
    budget = FetchBudget()
    assert [budget.take("a", 0.0) for _ in range(CLIENT_FETCH_BURST)] == [None] * CLIENT_FETCH_BURST
    assert budget.take("a", 0.0) == Refusal("client", first=True)
    assert budget.take("a", CLIENT_FETCH_INTERVAL - 0.001) == Refusal("client", first=False)
    assert budget.take("a", CLIENT_FETCH_INTERVAL) is None
    assert budget.take("a", CLIENT_FETCH_INTERVAL) == Refusal("client", first=True)
    # Another client is not affected.
    assert budget.take("b", CLIENT_FETCH_INTERVAL) is None


def test_all_clients_share_one_budget_and_a_refusal_takes_from_neither() -> None:
    budget = FetchBudget(client_burst=2, all_burst=3, all_interval=10.0)
    assert [budget.take(c, 0.0) for c in "abc"] == [None, None, None]
    assert budget.take("d", 0.0) == Refusal("all", first=True)
    # d's refusal by the shared budget cost d nothing: it has its burst when the shared one refills.
    assert budget.take("d", 20.0) is None
    assert budget.take("d", 20.0) is None
    assert budget.take("d", 20.0) == Refusal("client", first=True)


def test_a_clock_stepping_back_refills_nothing() -> None:
    budget = FetchBudget(client_burst=1, client_interval=10.0)
    assert budget.take("a", 100.0) is None
    assert budget.take("a", 50.0) == Refusal("client", first=True)
    assert budget.take("a", 105.0) == Refusal("client", first=False)
    assert budget.take("a", 110.0) is None


def test_clients_kept_are_bounded() -> None:
    budget = FetchBudget(client_burst=1, all_burst=10_000, max_clients=2)
    for client in ("a", "b", "c"):
        assert budget.take(client, 0.0) is None
    # "a", least recently charged, was forgotten and starts over; "c" was not.
    assert budget.take("a", 0.0) is None
    assert budget.take("c", 0.0) == Refusal("client", first=True)


@pytest.mark.parametrize("options", [{"client_burst": 0}, {"all_interval": 0.0}, {"max_clients": 0}])
def test_nonsense_is_refused(options: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        FetchBudget(**options)  # type: ignore[arg-type]


def test_past_its_budget_a_client_is_refused_without_a_fetch_and_others_are_served() -> None:
    scheme, fetcher = make(MemoryFetcher({}))
    codes = []
    for n in range(CLIENT_FETCH_BURST + 5):
        headers = signed(url=CERTS + f"CERT-attacker-{n}")
        with pytest.raises(CertificateUntrusted) as caught:
            deliver(scheme, headers, client="203.0.113.7")
        codes.append(caught.value.code)
    assert codes == ["certificate_untrusted"] * CLIENT_FETCH_BURST + ["certificate_fetch_limited"] * 5
    assert "this client caused too many certificate fetches" in caught.value.detail
    assert len(fetcher.calls) == CLIENT_FETCH_BURST
    # Another client's fetch is paid from its own budget.
    fetcher.served[CERT_URL] = PAYPAL_PKI.chain_pem
    assert deliver(scheme, signed(), client="173.0.82.126").secret_index == 0
    assert len(fetcher.calls) == CLIENT_FETCH_BURST + 1


def deliver(scheme: Scheme, headers: dict[str, str], *, client: str) -> Verified:
    asyncio.run(scheme.prepare(BODY, headers, now=NOW, client=client))
    return scheme.verify(BODY, headers, now=NOW)

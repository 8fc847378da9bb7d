"""The fake provider APIs (``effectgate fake-providers``) served for a test, and ``Services`` that point
every client a handler can reach at them — the providers' SDKs included, through their public settings.

A handler built on a provider's SDK (``stripe_steps(ctx)``, ``easypost_for(ctx)``) builds its client from
``ctx.downstream(NAME).config``: Stripe's ``StripeClient(base_addresses={"api": base_url})``, EasyPost's
``api_base``. So a test needs no patching of either SDK: give the handler a context whose ``[downstream]``
configs name the fakes, and the SDKs send their real requests there::

    with fake_providers() as fakes:                       # or the plugin's effectgate_fake_providers
        async with fakes.services() as services:
            run = await effectgate_ledger.run_job("shop.capture", services=services)
        assert fakes.stats("stripe")["captures"] == 1
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from effectgate.gateway.fakes.providers import MOUNTS, create_all
from effectgate.handlers.context import Services
from effectgate.handlers.downstream import DownstreamConfig, clients
from effectgate.handlers.downstream.payments import PaymentsClient
from effectgate.handlers.downstream.shipping import ShippingClient
from effectgate.handlers.providers.paypal import IDEMPOTENCY_HEADER as PAYPAL_IDEMPOTENCY_HEADER
from effectgate.handlers.providers.stripe import close_clients as close_stripe_clients

# Bounds a fake that does not come up (or go down) in a test: seconds.
_START_TIMEOUT = 10.0
_SHOPIFY_API = "/admin/api/2025-01"


@dataclass(frozen=True, slots=True)
class FakeProviders:
    """Where the running fakes answer, the ``[downstream.NAME]`` configs that reach them, and their controls.

    ``url`` is the root (Stripe, and the generic payments and shipping APIs); EasyPost, Shopify and
    PayPal/Adyen answer under their prefixes, each with its own state and ``/_fake/…`` controls
    (docs/provider_sdks.md, "Running the fake providers").
    """

    url: str

    def downstreams(self) -> Mapping[str, DownstreamConfig]:
        """The ``[downstream.NAME]`` configs a handler's clients are built from, each at its fake, with
        test keys and the provider's own auth and idempotency headers: ``payments``, ``shipping``,
        ``stripe``, ``easypost``, ``shopify``, ``paypal`` and ``adyen``."""
        return {
            "payments": DownstreamConfig(self.url, "sk_test_effectgate"),
            "shipping": DownstreamConfig(self.url, "shp_test_effectgate"),
            "stripe": DownstreamConfig(self.url, "sk_test_effectgate"),
            "easypost": DownstreamConfig(
                self.url + MOUNTS["easypost"], "EZTK_test_effectgate", idempotency_header=None
            ),
            "shopify": DownstreamConfig(
                self.url + MOUNTS["shopify"] + _SHOPIFY_API,
                "shpat_test_effectgate",
                auth_scheme="X-Shopify-Access-Token",
                idempotency_header=None,
            ),
            "paypal": DownstreamConfig(
                self.url + MOUNTS["paypal_adyen"],
                "A21AA_test_effectgate",
                idempotency_header=PAYPAL_IDEMPOTENCY_HEADER,
            ),
            "adyen": DownstreamConfig(
                self.url + MOUNTS["paypal_adyen"] + "/v71", "AQE_test_effectgate", auth_scheme="X-API-Key"
            ),
        }

    @asynccontextmanager
    async def services(self) -> AsyncIterator[Services]:
        """``Services`` for ``context_for(…, services=…)`` or ``TestLedger.run_job(services=…)``:
        ``ctx.payments``, ``ctx.shipping`` and ``ctx.downstream(NAME)`` for every name of
        ``downstreams()``. On leaving the block their HTTP client is closed, and so are the Stripe SDK
        clients the handlers built (``providers.stripe.close_clients``): their connections would otherwise
        outlive the test's event loop and the fakes."""
        configs = self.downstreams()
        async with httpx.AsyncClient() as client:
            try:
                # Not paced, unlike a worker's clients: a test runs the next attempt at once (backoff off), where
                # a pace would hold it for a 429's Retry-After on the real clock.
                yield Services(
                    http=client,
                    payments=PaymentsClient(client, configs["payments"]),
                    shipping=ShippingClient(client, configs["shipping"]),
                    downstreams=clients(client, configs.items()),
                )
            finally:
                await close_stripe_clients()

    def control_url(self, api: str, path: str) -> str:
        """The URL of a fake's ``path`` (``/_fake/stats``, ``/_fake/payment_intents``, …) for ``api``:
        ``stripe`` (the root), ``easypost``, ``shopify`` or ``paypal_adyen``."""
        prefix = "" if api == "stripe" else MOUNTS[api]
        return f"{self.url}{prefix}{path}"

    def stats(self, api: str = "stripe") -> dict[str, Any]:
        """What ``api``'s fake counted (``GET /_fake/stats``): captures, labels, fulfilments, replays."""
        answer = httpx.get(self.control_url(api, "/_fake/stats"), timeout=10)
        answer.raise_for_status()
        result: dict[str, Any] = answer.json()
        return result

    def reset(self) -> None:
        """Forget every fake's state (``POST /_fake/reset`` on each)."""
        for api in ("stripe", *MOUNTS):
            httpx.post(self.control_url(api, "/_fake/reset"), timeout=10).raise_for_status()


@contextmanager
def fake_providers(host: str = "127.0.0.1") -> Iterator[FakeProviders]:
    """Serve every fake API (what ``effectgate fake-providers`` serves) on a free port of ``host`` in a
    thread of this process, fresh state, for the ``with`` block; yields its ``FakeProviders``."""
    import uvicorn

    # Bound here and handed to uvicorn: no window in which another process takes the port.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(create_all(), log_level="warning", timeout_graceful_shutdown=1, lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="effectgate-fakes", daemon=True
    )
    thread.start()
    try:
        # uvicorn says it is serving only through `started`; the thread ending first is a failed start.
        deadline = time.monotonic() + _START_TIMEOUT
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the fake providers did not start on {host} within {_START_TIMEOUT} s")
            time.sleep(0.01)
        yield FakeProviders(f"http://{host}:{port}")
    finally:
        server.should_exit = True
        thread.join(_START_TIMEOUT)
        sock.close()

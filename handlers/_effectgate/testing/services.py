"""Downstream clients for tests: the real payment, shipping and ``[downstream.NAME]`` clients, over an
httpx transport the test supplies (``httpx.MockTransport(answer)``, a respx router's handler, or an ASGI
app), so a handler's calls — paths, bodies, ``Idempotency-Key`` headers, how answers are classified —
are exactly what production sends and sees."""

from __future__ import annotations

from collections.abc import Iterable

import httpx

from effectgate.handlers.context import Services
from effectgate.handlers.downstream import DownstreamClient, DownstreamConfig
from effectgate.handlers.downstream.payments import PaymentsClient
from effectgate.handlers.downstream.shipping import ShippingClient

PAYMENTS_URL = "https://payments.effectgate.test"
SHIPPING_URL = "https://shipping.effectgate.test"


def services_over(transport: httpx.AsyncBaseTransport, *, downstreams: Iterable[str] = ()) -> Services:
    """``Services`` whose ``ctx.payments`` (at ``PAYMENTS_URL``), ``ctx.shipping`` (``SHIPPING_URL``) and
    ``ctx.downstream(name)`` for each of ``downstreams`` (at ``https://NAME.effectgate.test``) send every
    request to ``transport``. Each request carries the step's key in ``Idempotency-Key``."""
    http = httpx.AsyncClient(transport=transport)
    return Services(
        http=http,
        payments=PaymentsClient(http, DownstreamConfig(PAYMENTS_URL, "sk_test_effectgate")),
        shipping=ShippingClient(http, DownstreamConfig(SHIPPING_URL, "shp_test_effectgate")),
        downstreams={
            name: DownstreamClient(name, http, DownstreamConfig(f"https://{name}.effectgate.test", None))
            for name in downstreams
        },
    )

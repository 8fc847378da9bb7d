"""The delivery plane's request metrics over the real app: one count per HTTP request, whatever answered it."""

from __future__ import annotations

import httpx
import pytest

from effectgate.gateway import metrics
from effectgate.gateway.app import create_app
from effectgate.gateway.config import parse
from tests.integration.gateway.ingress.ingress_app import (
    CONFIG,
    ENV,
    make_registry,
    stripe_event,
    stripe_headers,
)
from tests.prometheus import value

pytestmark = pytest.mark.anyio


async def test_every_request_is_counted_by_source_and_status_apart_from_effects(db_url: str) -> None:
    app = create_app(parse(CONFIG, env=ENV), make_registry(), db_url)
    body = stripe_event(order_id="metrics-1", event_id="evt_metrics_1")
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            before = metrics.render()
            answers = [
                # Two effects (fulfil and notify) claimed by one request, then the same again: a duplicate.
                await client.post("/webhooks/stripe", content=body, headers=stripe_headers(body)),
                await client.post("/webhooks/stripe", content=body, headers=stripe_headers(body)),
                await client.post("/webhooks/stripe", content=body, headers=stripe_headers(body, "whsec_x")),
                await client.post("/webhooks/stripe", content=b"x" * 5000, headers=stripe_headers(b"x")),
                await client.post("/webhooks/no-such-source", content=body),
                await client.post("/webhooks/another-unknown", content=body),
            ]
            after = metrics.render()
    assert [a.status_code for a in answers] == [202, 200, 401, 413, 404, 404]

    def grew(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    for status, n in (("202", 1), ("200", 1), ("401", 1), ("413", 1)):
        assert grew("effectgate_webhook_requests_total", source="stripe", status=status) == n, status
    # Unknown source names share one series, so a scan of URLs cannot crowd out the configured sources.
    assert grew("effectgate_webhook_requests_total", source=metrics.UNKNOWN_SOURCE, status="404") == 2
    assert grew("effectgate_webhook_requests_total", source="no-such-source", status="404") == 0
    # The deliveries counter still counts effects: the first request claimed two.
    assert grew("effectgate_deliveries_total", source="stripe", outcome="accepted") == 2
    assert grew("effectgate_deliveries_total", source="stripe", outcome="duplicate") == 2
    assert grew("effectgate_webhook_request_seconds_count", source="stripe", status_class="2xx") == 2
    assert grew("effectgate_webhook_request_seconds_count", source="stripe", status_class="4xx") == 2
    assert (
        grew("effectgate_webhook_request_seconds_count", source=metrics.UNKNOWN_SOURCE, status_class="4xx")
        == 2
    )


def test_build_info_names_the_version_and_python() -> None:
    import platform
    from importlib.metadata import version

    text = metrics.render()
    assert (
        value(text, "effectgate_build_info", version=version("effectgate"), python=platform.python_version())
        == 1
    )

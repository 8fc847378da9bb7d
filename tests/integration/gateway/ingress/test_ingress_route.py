"""The delivery route as raw ASGI (gateway.app.Gateway): what Starlette's stack used to answer around the
endpoint is answered the same way without it, and everything that is not a delivery still takes that stack."""

from __future__ import annotations

import json
from typing import Any

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


async def test_an_answer_carries_the_headers_and_body_jsonresponse_sent(db_url: str) -> None:
    app = create_app(parse(CONFIG, env=ENV), make_registry(), db_url)
    body = stripe_event(order_id="route-1", event_id="evt_route_1")
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
            answer = await client.post("/webhooks/stripe", content=body, headers=stripe_headers(body))
    assert answer.status_code == 202
    assert list(answer.headers.keys()) == ["content-length", "content-type"]
    assert answer.headers["content-type"] == "application/json"
    assert int(answer.headers["content-length"]) == len(answer.content)
    document = answer.json()
    assert document["event_ids"] == ["evt_route_1"]
    assert {e["outcome"] for e in document["effects"]} == {"accepted"}
    # Compact, as Starlette's JSONResponse wrote it.
    assert b": " not in answer.content and b", " not in answer.content


async def test_what_is_not_a_delivery_still_gets_starlettes_answers(db_url: str) -> None:
    app = create_app(parse(CONFIG, env=ENV), make_registry(), db_url)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
            other_method = await client.get("/webhooks/stripe")
            no_source = await client.post("/webhooks/", content=b"{}")
            two_segments = await client.post("/webhooks/stripe/more", content=b"{}")
            health = await client.get("/healthz")
    assert other_method.status_code == 405
    assert no_source.status_code == 404 and two_segments.status_code == 404
    assert health.json() == {"status": "ok"}


async def test_a_delivery_under_a_root_path_takes_the_starlette_route_to_the_same_ingress(
    db_url: str,
) -> None:
    app = create_app(parse(CONFIG, env=ENV), make_registry(), db_url)
    body = stripe_event(order_id="route-2", event_id="evt_route_2")
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, root_path="/edge")
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            answer = await client.post("/edge/webhooks/stripe", content=body, headers=stripe_headers(body))
    assert answer.status_code == 202
    assert answer.json()["event_ids"] == ["evt_route_2"]


class _Exploding:
    def check_room(self) -> None:
        pass

    async def claim(self, items: Any) -> Any:
        raise RuntimeError("a bug in the claim path")


async def test_an_exception_in_the_pipeline_is_answered_500_counted_and_raised(db_url: str) -> None:
    app = create_app(parse(CONFIG, env=ENV), make_registry(), db_url)
    body = stripe_event(order_id="route-3", event_id="evt_route_3")
    async with app.router.lifespan_context(app):
        app.state.batcher = _Exploding()
        before = metrics.render()
        # As Starlette's error middleware did: the 500 is sent, and the exception still reaches the server.
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            answer = await client.post("/webhooks/stripe", content=body, headers=stripe_headers(body))
        raising = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=raising, base_url="http://gw") as client:
            with pytest.raises(RuntimeError, match="a bug in the claim path"):
                await client.post("/webhooks/stripe", content=body, headers=stripe_headers(body))
        after = metrics.render()
    assert answer.status_code == 500
    assert answer.text == "Internal Server Error"
    grew = value(after, "effectgate_webhook_requests_total", source="stripe", status="500") - value(
        before, "effectgate_webhook_requests_total", source="stripe", status="500"
    )
    assert grew == 2


async def test_a_client_gone_before_its_body_is_answered_400_and_counted(db_url: str) -> None:
    app = create_app(parse(CONFIG, env=ENV), make_registry(), db_url)
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/webhooks/stripe",
        "raw_path": b"/webhooks/stripe",
        "root_path": "",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json"), (b"x-request-id", b"gone-1")],
        "client": ("192.0.2.7", 40000),
        "server": ("gw", 80),
    }
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async with app.router.lifespan_context(app):
        before = metrics.render()
        await app(scope, receive, send)
        after = metrics.render()
    assert sent[0]["status"] == 400
    assert json.loads(sent[1]["body"])["error"] == "client_disconnected"
    grew = value(after, "effectgate_webhook_requests_total", source="stripe", status="400") - value(
        before, "effectgate_webhook_requests_total", source="stripe", status="400"
    )
    assert grew == 1

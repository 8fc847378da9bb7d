"""Tracing over a real ledger: a signed delivery through the gateway app, its job run by a worker against the
fake providers, the spans read from the OpenTelemetry SDK's in-memory exporter and the ``traceparent``
read from the fake provider's recorded requests."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import stripe
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from effectgate.gateway.app import create_app
from effectgate.gateway.config import parse
from effectgate.gateway.fakes.providers import create_app as create_fake
from effectgate.gateway.logs import JsonFormatter
from effectgate.handlers import EffectContext, Event, tracing
from effectgate.handlers.context import Services
from effectgate.handlers.downstream import DownstreamConfig
from effectgate.handlers.downstream.payments import PaymentsClient
from effectgate.handlers.downstream.shipping import ShippingClient
from effectgate.handlers.examples.commerce import order_key
from effectgate.handlers.registry import Registry
from effectgate.handlers.worker.runtime import Worker
from effectgate.ledger import db
from effectgate.ledger.handle import Ledger
from tests.integration import jobs_and_workers as jf

pytestmark = pytest.mark.anyio

SECRET = "whsec_tracing"
CONFIG = """
[gateway]
run_reconciler = false

[sources.stripe]
scheme = "stripe"
secrets = ["TRACING_STRIPE_SECRET"]
"""
FAKE = "http://fake.test"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install(provider)
    try:
        yield exporter
    finally:
        tracing.uninstall()
        provider.shutdown()


async def capture_and_ship(ctx: EffectContext, ev: Event) -> None:
    """Two steps on two downstreams, so the test sees a step span per call (not the examples' flow)."""
    obj = ev.payload["data"]["object"]
    await ctx.step("capture", lambda key: ctx.payments.capture_payment_intent(obj["id"], idempotency_key=key))
    await ctx.step(
        "ship",
        lambda key: ctx.shipping.create_shipment(
            order_id=obj["metadata"]["order_id"],
            address={"name": "Ada", "country": "DE"},
            items=[{"sku": "demo", "quantity": 1}],
            idempotency_key=key,
        ),
    )


def registry() -> Registry:
    reg = Registry()
    reg.effect(source="stripe", events=["payment_intent.succeeded"], key=order_key, name="fulfil")(
        capture_and_ship
    )
    return reg


def delivery(order: str) -> tuple[bytes, dict[str, str]]:
    obj = {"id": f"pi_{order}", "object": "payment_intent", "metadata": {"order_id": order}}
    body = json.dumps({"id": f"evt_{order}", "type": "payment_intent.succeeded", "data": {"object": obj}})
    signature = stripe.WebhookSignature.generate_signature_header(body, SECRET)
    return body.encode(), {"stripe-signature": signature, "content-type": "application/json"}


@pytest.fixture
async def fake() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_fake()), base_url=FAKE) as client:
        yield client


async def deliver_and_run(db_url: str, pool: db.Pool, fake: httpx.AsyncClient, order: str) -> httpx.Response:
    reg = registry()
    app = create_app(parse(CONFIG, env={"TRACING_STRIPE_SECRET": SECRET}), reg, db_url)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as gateway,
    ):
        body, headers = delivery(order)
        answer = await gateway.post("/webhooks/stripe", content=body, headers=headers)
    services = Services(
        http=fake,
        payments=PaymentsClient(fake, DownstreamConfig(FAKE, "sk_test_tracing")),
        shipping=ShippingClient(fake, DownstreamConfig(FAKE, None)),
    )
    worker = Worker(
        Ledger(pool), reg, config=jf.worker_config(), services=services, owner=f"test-{uuid.uuid4().hex[:6]}"
    )
    assert await worker.run_until_idle() == 1
    return answer


def one(spans: list[ReadableSpan], name: str) -> ReadableSpan:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, f"{name}: {[s.name for s in spans]}"
    return found[0]


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def traceparent(span: ReadableSpan) -> str:
    context = span.get_span_context()
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


async def recorded(fake: httpx.AsyncClient) -> list[dict[str, Any]]:
    requests: list[dict[str, Any]] = (await fake.get("/_fake/requests")).json()
    return requests


async def test_a_delivery_and_its_job_are_traced_and_the_provider_receives_traceparent(
    db_url: str, pool: db.Pool, fake: httpx.AsyncClient, spans: InMemorySpanExporter
) -> None:
    answer = await deliver_and_run(db_url, pool, fake, "42")
    assert answer.status_code == 202, answer.text
    finished = list(spans.get_finished_spans())

    delivery_span = one(finished, "POST /webhooks/{source}")
    assert delivery_span.kind is SpanKind.SERVER
    assert dict(delivery_span.attributes or {}) == {
        "http.request.method": "POST",
        "http.route": "/webhooks/{source}",
        "url.path": "/webhooks/stripe",
        "url.scheme": "http",
        "network.protocol.version": "1.1",
        "client.address": "127.0.0.1",
        "user_agent.original": f"python-httpx/{httpx.__version__}",
        "effectgate.source": "stripe",
        "http.response.status_code": 202,
    }
    assert delivery_span.status.status_code is StatusCode.UNSET
    verify = one(finished, "effectgate.verify")
    claim = one(finished, "effectgate.claim")
    assert parent_of(verify) == parent_of(claim) == delivery_span.context.span_id
    assert dict(verify.attributes or {}) == {"effectgate.source": "stripe", "effectgate.scheme": "stripe"}
    assert claim.attributes is not None
    assert list(claim.attributes["effectgate.effect_keys"]) == ["order-paid:42"]  # type: ignore[arg-type]
    assert list(claim.attributes["effectgate.outcomes"]) == ["accepted"]  # type: ignore[arg-type]

    job = one(finished, "effectgate.job")
    assert job.attributes is not None
    # The job's trace is its own, linked to the delivery span that claimed it (stored on the job at claim).
    assert job.context.trace_id != delivery_span.context.trace_id
    assert [(link.context.trace_id, link.context.span_id) for link in job.links] == [
        (delivery_span.context.trace_id, delivery_span.context.span_id)
    ]
    assert {
        k: job.attributes[k] for k in ("effectgate.effect_key", "effectgate.kind", "effectgate.attempt")
    } == {
        "effectgate.effect_key": "order-paid:42",
        "effectgate.kind": "fulfil",
        "effectgate.attempt": 1,
    }
    assert job.attributes["effectgate.job.outcome"] == "succeeded"
    steps = {
        s.attributes["effectgate.step"]: s for s in finished if s.name == "effectgate.step" and s.attributes
    }
    assert set(steps) == {"capture", "ship"}
    for step in steps.values():
        assert parent_of(step) == job.context.span_id
        assert step.context.trace_id == job.context.trace_id
        assert step.attributes is not None
        assert step.attributes["effectgate.effect_key"] == "order-paid:42"
        assert step.attributes["effectgate.step.replayed"] is False

    # The provider saw each mutating call carry the trace context of the step that made it.
    calls = {r["path"]: r["headers"] for r in await recorded(fake) if r["method"] == "POST"}
    assert calls["/v1/payment_intents/pi_42/capture"]["traceparent"] == traceparent(steps["capture"])
    assert calls["/v1/shipments"]["traceparent"] == traceparent(steps["ship"])


async def test_a_failed_signature_is_recorded_on_the_verify_span(
    db_url: str, spans: InMemorySpanExporter
) -> None:
    app = create_app(parse(CONFIG, env={"TRACING_STRIPE_SECRET": SECRET}), registry(), db_url)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as gateway,
    ):
        body, _ = delivery("7")
        answer = await gateway.post(
            "/webhooks/stripe", content=body, headers={"stripe-signature": "t=1,v1=00"}
        )
    assert answer.status_code == 401
    finished = list(spans.get_finished_spans())
    verify = one(finished, "effectgate.verify")
    assert verify.status.status_code is StatusCode.ERROR
    assert [e.name for e in verify.events] == ["exception"]
    delivery_span = one(finished, "POST /webhooks/{source}")
    assert delivery_span.attributes is not None
    assert delivery_span.attributes["http.response.status_code"] == 401
    # A 4xx is the sender's error, not the server's: the SERVER span's status stays unset.
    assert delivery_span.status.status_code is StatusCode.UNSET
    assert not [s for s in finished if s.name == "effectgate.claim"]


async def test_with_tracing_off_no_span_is_recorded_and_no_traceparent_is_sent(
    db_url: str, pool: db.Pool, fake: httpx.AsyncClient
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    # A provider exists in the process, but effectgate was never told to use it.
    assert not tracing.enabled()
    answer = await deliver_and_run(db_url, pool, fake, "43")
    assert answer.status_code == 202
    posts = [r for r in await recorded(fake) if r["method"] == "POST"]
    assert len(posts) == 2
    assert all("traceparent" not in r["headers"] for r in posts)
    assert all(r["headers"]["idempotency-key"] for r in posts)
    assert exporter.get_finished_spans() == ()
    provider.shutdown()


async def test_log_lines_written_inside_a_span_carry_its_trace_and_span_ids(
    spans: InMemorySpanExporter,
) -> None:
    formatter = JsonFormatter()

    def line(event: str) -> dict[str, Any]:
        record = logging.LogRecord("effectgate.test", logging.INFO, __file__, 1, event, None, None)
        entry: dict[str, Any] = json.loads(formatter.format(record))
        return entry

    assert "trace_id" not in line("outside")
    with tracing.span("effectgate.test"):
        inside = line("inside")
    [finished] = spans.get_finished_spans()
    assert inside["trace_id"] == f"{finished.context.trace_id:032x}"
    assert inside["span_id"] == f"{finished.context.span_id:016x}"


def test_with_tracing_off_log_lines_carry_no_trace_ids() -> None:
    record = logging.LogRecord("effectgate.test", logging.INFO, __file__, 1, "off", None, None)
    assert "trace_id" not in json.loads(JsonFormatter().format(record))


async def test_a_5xx_answer_marks_the_server_span_failed(spans: InMemorySpanExporter) -> None:
    # A ledger nothing listens on: the claim cannot get a connection, the answer is 503 ledger_unavailable.
    unreachable = "postgresql://postgres@127.0.0.1:1/nothing"
    app = create_app(
        parse(CONFIG, env={"TRACING_STRIPE_SECRET": SECRET}), registry(), unreachable, pool_timeout=0.5
    )
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as gateway,
    ):
        body, headers = delivery("9")
        answer = await gateway.post("/webhooks/stripe", content=body, headers=headers)
    assert answer.status_code == 503, answer.text
    delivery_span = one(list(spans.get_finished_spans()), "POST /webhooks/{source}")
    assert delivery_span.status.status_code is StatusCode.ERROR
    assert delivery_span.attributes is not None
    assert delivery_span.attributes["http.response.status_code"] == 503

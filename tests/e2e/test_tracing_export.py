"""``[tracing]`` end to end: real ``serve`` and ``worker`` processes export their spans over OTLP/HTTP to a
collector stand-in, and the fake provider records the ``traceparent`` of the steps that called it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from .conftest import SECRET, event, headers
from .processes import Process, free_port, wait_until


class Collector:
    """An OTLP/HTTP trace receiver: keeps every decoded export request."""

    def __init__(self) -> None:
        self.requests: list[ExportTraceServiceRequest] = []
        self.content_types: list[str] = []
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                collector.content_types.append(self.headers["content-type"])
                collector.requests.append(request)
                self.send_response(200 if self.path == "/v1/traces" else 404)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"

    def spans(self) -> list[tuple[dict[str, str], Any]]:
        """(resource attributes, span) for every span received."""
        found = []
        for request in self.requests:
            for resource_spans in request.resource_spans:
                resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
                for scope in resource_spans.scope_spans:
                    found.extend((resource, span) for span in scope.spans)
        return found


@pytest.fixture
def collector() -> Iterator[Collector]:
    c = Collector()
    thread = threading.Thread(target=c.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield c
    finally:
        c.server.shutdown()
        c.server.server_close()


def test_serve_and_worker_export_spans_over_otlp_and_the_provider_sees_traceparent(
    db_url: str, tmp_path: Path, collector: Collector
) -> None:
    gateway_port, fake_port = free_port(), free_port()
    config = tmp_path / "effectgate.toml"
    config.write_text(
        f"""
[handlers]
modules = ["tests.e2e.e2e_handlers"]
skip_sources = ["connect"]

[sources.shop]
scheme = "stripe"
secrets = ["E2E_STRIPE_SECRET"]

[worker]
poll_interval = 0.2

[downstream.payments]
base_url = "http://127.0.0.1:{fake_port}"

[downstream.shipping]
base_url = "http://127.0.0.1:{fake_port}"

[tracing]
endpoint = "{collector.url}"
service_name = "effectgate-e2e"
"""
    )
    env = {"DATABASE_URL": db_url, "E2E_STRIPE_SECRET": SECRET}
    fake = Process(["fake-providers", "--port", str(fake_port)], env, tmp_path / "fake.log")
    gateway = Process(
        ["serve", "--config", str(config), "--no-migrate", "--port", str(gateway_port)],
        env,
        tmp_path / "gateway.log",
    )
    worker = Process(["worker", "--config", str(config), "--no-migrate"], env, tmp_path / "worker.log")
    fake_url = f"http://127.0.0.1:{fake_port}"
    try:
        fake.wait_http(f"{fake_url}/_fake/stats")
        gateway.wait_http(f"http://127.0.0.1:{gateway_port}/readyz")
        body = event("77", "evt_77")
        answer = httpx.post(
            f"http://127.0.0.1:{gateway_port}/webhooks/shop", content=body, headers=headers(body), timeout=30
        )
        assert answer.status_code == 202, answer.text
        wait_until(
            lambda: httpx.get(f"{fake_url}/_fake/stats", timeout=5).json()["shipments"] == 1,
            what="the job's shipment",
        )
        recorded = httpx.get(f"{fake_url}/_fake/requests", timeout=5).json()
    finally:
        # Stopping flushes what each process still buffers (serve from its lifespan, as its SIGTERM exit
        # skips exit handlers).
        worker.stop()
        gateway.stop()
        fake.stop()

    assert set(collector.content_types) == {"application/x-protobuf"}
    spans = collector.spans()
    by_name: dict[str, list[Any]] = {}
    for resource, span in spans:
        assert resource["service.name"] == "effectgate-e2e"
        by_name.setdefault(span.name, []).append((resource["effectgate.role"], span))
    roles = {name: {role for role, _ in found} for name, found in by_name.items()}
    assert roles == {
        "POST /webhooks/{source}": {"gateway"},
        "effectgate.verify": {"gateway"},
        "effectgate.claim": {"gateway"},
        "effectgate.job": {"worker"},
        "effectgate.step": {"worker"},
    }, f"{roles}\n{gateway.log()}\n{worker.log()}"
    steps = {
        next(a.value.string_value for a in span.attributes if a.key == "effectgate.step"): span
        for _, span in by_name["effectgate.step"]
    }
    # The job ran in another process, in a trace of its own, linked to the delivery span that claimed it.
    [(_, delivery_span)] = by_name["POST /webhooks/{source}"]
    [(_, job_span)] = by_name["effectgate.job"]
    assert job_span.trace_id != delivery_span.trace_id
    assert [(link.trace_id, link.span_id) for link in job_span.links] == [
        (delivery_span.trace_id, delivery_span.span_id)
    ]
    posts = {r["path"]: r["headers"]["traceparent"] for r in recorded if r["method"] == "POST"}
    assert posts["/v1/payment_intents/pi_77/capture"].split("-")[1:3] == [
        steps["capture"].trace_id.hex(),
        steps["capture"].span_id.hex(),
    ]
    assert posts["/v1/shipments"].split("-")[1:3] == [
        steps["ship"].trace_id.hex(),
        steps["ship"].span_id.hex(),
    ]

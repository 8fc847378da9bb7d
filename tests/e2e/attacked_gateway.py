"""A real ``serve`` process taking Stripe, as the attack tests run it: started on a free port with a configuration of
the test's (``serving``), read back through its ledger and /metrics (``Gateway``); genuine and forged Stripe
deliveries; and a raw request sent from a chosen loopback address, read until the gateway closes the connection."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import psycopg
import stripe

from .processes import Process, free_port
from .schemes import SECRETS


class Gateway:
    def __init__(self, port: int, db_url: str) -> None:
        self.port, self.url, self.db_url = port, f"http://127.0.0.1:{port}", db_url

    def client(self, local_address: str = "127.0.0.1") -> httpx.Client:
        return httpx.Client(
            base_url=self.url, transport=httpx.HTTPTransport(local_address=local_address), timeout=30
        )

    def effects(self, event_id: str) -> int:
        with psycopg.connect(self.db_url) as conn:
            row = conn.execute(
                "SELECT count(*) FROM effects WHERE source = 'stripe' AND effect_key LIKE %s",
                (f"%{event_id}%",),
            ).fetchone()
            assert row is not None
            return int(row[0])

    def delivery_count(self, event_id: str) -> int:
        with psycopg.connect(self.db_url) as conn:
            row = conn.execute(
                "SELECT delivery_count FROM effects WHERE source = 'stripe' AND effect_key LIKE %s",
                (f"%{event_id}%",),
            ).fetchone()
            assert row is not None
            return int(row[0])

    def metric(self, name: str, **labels: str) -> float:
        page = httpx.get(f"{self.url}/metrics", timeout=10).text
        wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        for line in page.splitlines():
            series = line.rsplit(" ", 1)[0]
            if series == (f"{name}{{{wanted}}}" if labels else name):
                return float(line.rsplit(" ", 1)[1])
        return 0.0


@contextmanager
def serving(config: str, db_url: str, tmp_path: Path) -> Iterator[Gateway]:
    """A real ``serve`` process with ``config`` on a free port, ready, stopped afterwards."""
    port = free_port()
    path = tmp_path / "effectgate.toml"
    path.write_text(config)
    process = Process(
        ["serve", "--config", str(path), "--no-migrate", "--port", str(port)],
        {"DATABASE_URL": db_url, **SECRETS},
        tmp_path / "gateway.log",
    )
    try:
        process.wait_http(f"http://127.0.0.1:{port}/readyz")
        yield Gateway(port, db_url)
    finally:
        process.stop()


def genuine(event_id: str) -> tuple[bytes, dict[str, str]]:
    body = json.dumps({"id": event_id, "type": "payment_intent.succeeded", "data": {}})
    header = stripe.WebhookSignature.generate_signature_header(body, SECRETS["STRIPE_SECRET"])
    return body.encode(), {"Stripe-Signature": header, "Content-Type": "application/json"}


def forged() -> tuple[bytes, dict[str, str]]:
    return b"{}", {"Stripe-Signature": f"t={int(time.time())},v1={'0' * 64}"}


def send_raw(port: int, source_address: str, body: bytes, headers: dict[str, str]) -> socket.socket:
    """One request on a new connection from ``source_address``, sent; read it with ``read_to_close``."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=60, source_address=(source_address, 0))
    head = f"POST /webhooks/stripe HTTP/1.1\r\nHost: gateway\r\nContent-Length: {len(body)}\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    sock.sendall(head.encode() + b"\r\n" + body)
    return sock


def read_to_close(sock: socket.socket) -> bytes:
    """Everything the gateway sent before it closed the connection (b"" for a refused one)."""
    with sock:
        received = b""
        while chunk := _recv(sock):
            received += chunk
        return received


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except ConnectionResetError:
        return b""

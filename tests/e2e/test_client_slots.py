"""Per-client request slots, attacked: one client's many connections wait for its own requests to finish,
while another client's deliveries go straight through. A real ``serve`` process; nothing is timed: the
gateway's own counters say when a request is waiting."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from .attacked_gateway import Gateway, genuine, read_to_close, send_raw, serving
from .processes import wait_until

CONFIG = """
[handlers]
modules = ["tests.e2e.attack_handlers"]
# attack_handlers serves every scheme; this gateway takes Stripe only.
skip_sources = ["github", "standard", "shopify", "slack", "hmac", "hmac_headers", "twilio", "paypal", "adyen", "bare"]

[gateway]
client_concurrency = 2
header_timeout = 60
body_timeout = 60

[sources.stripe]
scheme = "stripe"
secrets = ["STRIPE_SECRET"]
"""

CROWD = "127.0.0.2"
OTHER = "127.0.0.3"


@pytest.fixture
def gateway(db_url: str, tmp_path: Path) -> Iterator[Gateway]:
    with serving(CONFIG, db_url, tmp_path) as running:
        yield running


def half_sent(port: int, event_id: str) -> tuple[socket.socket, bytes]:
    """A genuine delivery whose head is sent and read by the gateway (it answered ``100 Continue``, so the
    request is in flight), with its body still to send."""
    body, headers = genuine(event_id)
    sock = socket.create_connection(("127.0.0.1", port), timeout=60, source_address=(CROWD, 0))
    head = f"POST /webhooks/stripe HTTP/1.1\r\nHost: gateway\r\nContent-Length: {len(body)}\r\nExpect: 100-continue\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    sock.sendall(head.encode() + b"\r\n")
    interim = b""
    while b"\r\n\r\n" not in interim:
        interim += sock.recv(4096)
    assert interim.startswith(b"HTTP/1.1 100"), interim
    return sock, body


def answer_of(sock: socket.socket) -> int:
    """The status of the one answer on ``sock``, read until the gateway closes it."""
    return int(read_to_close(sock).split(b" ", 2)[1])


def test_a_client_over_its_share_waits_for_its_own_requests_and_no_one_else_does(gateway: Gateway) -> None:
    ids = [f"evt_{uuid.uuid4().hex}" for _ in range(2)]
    in_flight = [half_sent(gateway.port, event_id) for event_id in ids]

    # Its third request waits, unread: counted by the gateway before anything else happens.
    waiting_id = f"evt_{uuid.uuid4().hex}"
    body, headers = genuine(waiting_id)
    waiting = send_raw(gateway.port, CROWD, body, {**headers, "Connection": "close"})
    wait_until(
        lambda: gateway.metric("effectgate_client_slot_waits_total") == 1, what="the third request waiting"
    )

    # Another client is served meanwhile, its effect claimed once; the waiting request has no answer yet.
    other_id = f"evt_{uuid.uuid4().hex}"
    with gateway.client(OTHER) as other:
        body, headers = genuine(other_id)
        assert other.post("/webhooks/stripe", content=body, headers=headers).status_code == 202
    assert gateway.effects(other_id) == 1
    waiting.setblocking(False)
    with pytest.raises(BlockingIOError):
        waiting.recv(1)
    waiting.setblocking(True)
    assert gateway.effects(waiting_id) == 0

    # One of its own finishes: the waiting one is read and answered.
    sock, rest = in_flight[0]
    sock.sendall(rest)
    assert int(sock.recv(4096).split(b" ", 2)[1]) == 202
    assert answer_of(waiting) == 202
    sock.close()
    sock, rest = in_flight[1]
    sock.sendall(rest)
    assert int(sock.recv(4096).split(b" ", 2)[1]) == 202
    sock.close()
    assert [gateway.effects(event_id) for event_id in [*ids, waiting_id]] == [1, 1, 1]
    assert gateway.metric("effectgate_client_slot_waits_total") == 1

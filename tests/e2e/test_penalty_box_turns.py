"""The penalty box's default mode, attacked from the genuine sender's own address (a shared NAT).

One real ``serve`` process. An attacker at 127.0.0.2 sends bad signatures until that address is boxed,
then keeps flooding from many kept-alive connections. A provider on the same address opens new
connections meanwhile: each of its genuinely signed deliveries gets 202 and is claimed once, and its
resend is a duplicate. The flood is still answered, one request at a time, at most one request per
``TURN_INTERVAL``: its 401s are counted, and their number is bounded by the time it ran, not by how many
connections it used. Every count is read back; the one bound on time is the flood's own duration.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from effectgate.gateway.edge.turns import TURN_INTERVAL

from .attacked_gateway import Gateway, forged, genuine, serving

CONFIG = """
[handlers]
modules = ["tests.e2e.attack_handlers"]
skip_sources = ["github", "standard", "shopify", "slack", "hmac", "hmac_headers", "twilio", "paypal", "adyen", "bare"]

[gateway]
header_timeout = 20

[gateway.penalty_box]
failures = 5
window = 600
cooling = 600

[sources.stripe]
scheme = "stripe"
secrets = ["STRIPE_SECRET"]
"""

SHARED = "127.0.0.2"
FAILURES = 5
FLOOD_CONNECTIONS = 24


@pytest.fixture
def gateway(db_url: str, tmp_path: Path) -> Iterator[Gateway]:
    with serving(CONFIG, db_url, tmp_path) as running:
        yield running


class Flood:
    """Bad signatures from ``SHARED`` on many kept-alive connections until stopped; counts the answers.

    Raw sockets on one event loop in a thread of its own: thousands of requests a second against a
    gateway that served them all, so the bound below is the gateway's, not this client's.
    """

    def __init__(self, gateway: Gateway) -> None:
        self.port = gateway.port
        self.stop = threading.Event()
        self.statuses: list[int] = []
        body, headers = forged()
        head = f"POST /webhooks/stripe HTTP/1.1\r\nHost: gateway\r\nContent-Length: {len(body)}\r\n"
        self.request = (head + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n").encode() + body
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()))

    async def _run(self) -> None:
        await asyncio.gather(*(self._connection() for _ in range(FLOOD_CONNECTIONS)))

    async def _connection(self) -> None:
        while not self.stop.is_set():
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", self.port, local_addr=(SHARED, 0))
            except OSError:
                await asyncio.sleep(0.1)
                continue
            try:
                while not self.stop.is_set():
                    writer.write(self.request)
                    status = int((await reader.readuntil(b"\r\n")).split()[1])
                    head = await reader.readuntil(b"\r\n\r\n")
                    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                    await reader.readexactly(length)
                    self.statuses.append(status)
            except (OSError, asyncio.IncompleteReadError):
                # Closed unanswered after a wait in vain: a new connection.
                pass
            finally:
                writer.close()

    def __enter__(self) -> Flood:
        self.started = time.monotonic()
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=60)
        self.seconds = time.monotonic() - self.started


def test_a_genuine_delivery_from_a_boxed_address_is_served_while_the_flood_costs_one_request_a_turn(
    gateway: Gateway,
) -> None:
    with gateway.client(SHARED) as attacker:
        for _ in range(FAILURES):
            body, headers = forged()
            assert attacker.post("/webhooks/stripe", content=body, headers=headers).status_code == 401
    assert gateway.metric("effectgate_penalty_box_entries_total", source="stripe", reason="failures") == 1

    delivered = []
    with Flood(gateway) as flood:
        # Let the flood fill the queue first: the deliveries below arrive behind its waiting requests.
        time.sleep(1.0)
        for _ in range(3):
            event_id = f"evt_{uuid.uuid4().hex}"
            body, headers = genuine(event_id)
            # A new connection each time, as a provider without keep-alive would make.
            with gateway.client(SHARED) as provider:
                assert provider.post("/webhooks/stripe", content=body, headers=headers).status_code == 202
            with gateway.client(SHARED) as provider:
                assert provider.post("/webhooks/stripe", content=body, headers=headers).status_code == 200
            delivered.append(event_id)
        time.sleep(1.0)
        answered_during = len(flood.statuses)

    assert [gateway.effects(event_id) for event_id in delivered] == [1, 1, 1]
    assert [gateway.delivery_count(event_id) for event_id in delivered] == [2, 2, 2]
    # The flood was answered (one at a time), with 401s only, and kept going while the provider was served.
    assert answered_during > 0 and set(flood.statuses) == {401}
    # Bounded by its duration, not by its connections: at most one flood request per turn (plus the
    # connections' first requests, which may have been in flight when the turn was first taken).
    bound = flood.seconds / TURN_INTERVAL + FLOOD_CONNECTIONS
    assert len(flood.statuses) <= bound, (len(flood.statuses), flood.seconds)
    assert gateway.metric("effectgate_penalty_box_refusals_total", source="stripe", how="waited") > 0
    failures = gateway.metric(
        "effectgate_verification_failures_total", source="stripe", reason="signature_invalid"
    )
    assert failures == FAILURES + len(flood.statuses)

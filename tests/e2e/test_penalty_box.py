"""The penalty box in its ``held`` mode, attacked: a real ``serve`` process, clients on their own loopback addresses.

An attacker at 127.0.0.2 sends bad signatures until it is boxed; then its requests get no answer at all
(held, then closed by the header timeout; past the hold limit, closed at once), counted in ``/metrics``,
while genuine signed deliveries from 127.0.0.1 still get 202 and their effect is claimed once. A
connection of 127.0.0.2 that authenticated before keeps its service; a new one from that address is
held off with the attacker (the shared-address worst case). Behind a trusted proxy the box keys on the
forwarded address and answers 429. A client replaying one captured (correctly signed) delivery more than
``replays`` times is boxed the same way, after its first replays were answered as duplicates; one
redelivering many different events is not. Every count is read back; nothing is timed.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from .attacked_gateway import Gateway, forged, genuine, read_to_close, send_raw, serving

CONFIG = """
[handlers]
modules = ["tests.e2e.attack_handlers"]
# attack_handlers serves every scheme; this gateway takes Stripe only.
skip_sources = ["github", "standard", "shopify", "slack", "hmac", "hmac_headers", "twilio", "paypal", "adyen", "bare"]

[gateway]
forwarded_allow_ips = ["127.0.0.1"]
header_timeout = 6

[gateway.penalty_box]
failures = 5
window = 600
cooling = 600
hold = 2
replays = 5
# The silent mode; the default (one_at_a_time) is attacked in test_penalty_box_turns.py.
mode = "held"

[sources.stripe]
scheme = "stripe"
secrets = ["STRIPE_SECRET"]
"""

ATTACKER = "127.0.0.2"
FAILURES = 5
HOLD = 2
REPLAYS = 5


@pytest.fixture
def gateway(db_url: str, tmp_path: Path) -> Iterator[Gateway]:
    with serving(CONFIG, db_url, tmp_path) as running:
        yield running


def test_a_boxed_address_gets_no_answer_while_other_senders_keep_theirs(gateway: Gateway) -> None:
    with (
        gateway.client(ATTACKER) as proven,
        gateway.client(ATTACKER) as attacker,
        gateway.client() as provider,
    ):
        # A connection of the attacker's address on which a delivery authenticated before the box.
        first = f"evt_{uuid.uuid4().hex}"
        assert (
            proven.post("/webhooks/stripe", content=genuine(first)[0], headers=genuine(first)[1]).status_code
            == 202
        )

        for _ in range(FAILURES):
            body, headers = forged()
            assert attacker.post("/webhooks/stripe", content=body, headers=headers).status_code == 401
        assert gateway.metric("effectgate_penalty_box_entries_total", source="stripe", reason="failures") == 1
        # The connection that proved itself before the box keeps its service (while it is kept alive).
        later = f"evt_{uuid.uuid4().hex}"
        assert (
            proven.post("/webhooks/stripe", content=genuine(later)[0], headers=genuine(later)[1]).status_code
            == 202
        )
        assert gateway.effects(later) == 1

        # Boxed: new connections from that address get nothing at all, the first HOLD held until the
        # header timeout, the rest closed at once; with a genuine signature as well (the shared-address case).
        # All sent before any is read: the held ones are held at once.
        shared_id = f"evt_{uuid.uuid4().hex}"
        sent = [send_raw(gateway.port, ATTACKER, *forged()) for _ in range(3)]
        sent.append(send_raw(gateway.port, ATTACKER, *genuine(shared_id)))
        assert [read_to_close(sock) for sock in sent] == [b""] * 4
        assert gateway.effects(shared_id) == 0
        held = gateway.metric("effectgate_penalty_box_refusals_total", source="stripe", how="held")
        closed = gateway.metric("effectgate_penalty_box_refusals_total", source="stripe", how="closed")
        assert (held, closed) == (HOLD, 4 - HOLD)

        # Genuine deliveries from another address: accepted, each effect claimed once.
        for _ in range(3):
            event_id = f"evt_{uuid.uuid4().hex}"
            body, headers = genuine(event_id)
            assert provider.post("/webhooks/stripe", content=body, headers=headers).status_code == 202
            assert provider.post("/webhooks/stripe", content=body, headers=headers).status_code == 200
            assert gateway.effects(event_id) == 1
        assert (
            gateway.metric(
                "effectgate_verification_failures_total", source="stripe", reason="signature_invalid"
            )
            == FAILURES
        )


def test_behind_a_trusted_proxy_the_forwarded_client_is_boxed_and_answered_429(gateway: Gateway) -> None:
    # 127.0.0.1 is the trusted proxy here; the clients are the addresses it forwards for.
    with gateway.client() as proxy:
        attacker = {"X-Forwarded-For": "203.0.113.9"}
        for _ in range(FAILURES):
            body, headers = forged()
            assert (
                proxy.post("/webhooks/stripe", content=body, headers={**headers, **attacker}).status_code
                == 401
            )
        body, headers = forged()
        refused = proxy.post("/webhooks/stripe", content=body, headers={**headers, **attacker})
        assert refused.status_code == 429
        assert refused.json()["error"] == "client_penalised"
        assert int(refused.headers["retry-after"]) > 0 and refused.headers["connection"] == "close"
        # Refused before the signature is checked: a genuine one from the boxed client is refused too.
        boxed_id = f"evt_{uuid.uuid4().hex}"
        body, headers = genuine(boxed_id)
        assert (
            proxy.post("/webhooks/stripe", content=body, headers={**headers, **attacker}).status_code == 429
        )
        assert gateway.effects(boxed_id) == 0

        event_id = f"evt_{uuid.uuid4().hex}"
        body, headers = genuine(event_id)
        answer = proxy.post(
            "/webhooks/stripe", content=body, headers={**headers, "X-Forwarded-For": "198.51.100.7"}
        )
        assert answer.status_code == 202
        assert gateway.effects(event_id) == 1
        # The proxy's own address is not boxed either.
        direct = f"evt_{uuid.uuid4().hex}"
        body, headers = genuine(direct)
        assert proxy.post("/webhooks/stripe", content=body, headers=headers).status_code == 202
    assert gateway.metric("effectgate_penalty_box_refusals_total", source="stripe", how="answered") == 2


def test_a_replayed_delivery_boxes_its_sender_after_replays_answers(gateway: Gateway) -> None:
    captured = f"evt_{uuid.uuid4().hex}"
    body, headers = genuine(captured)
    with gateway.client() as provider, gateway.client(ATTACKER) as attacker:
        # The genuine delivery, then the same signed bytes replayed from another address.
        assert provider.post("/webhooks/stripe", content=body, headers=headers).status_code == 202
        answers = [
            attacker.post("/webhooks/stripe", content=body, headers=headers) for _ in range(REPLAYS + 1)
        ]
        assert [a.status_code for a in answers] == [200] * REPLAYS + [429]
        assert [o["outcome"] for a in answers[:REPLAYS] for o in a.json()["effects"]] == [
            "duplicate"
        ] * REPLAYS
        refused = answers[-1]
        assert refused.json()["error"] == "client_penalised"
        assert int(refused.headers["retry-after"]) > 0 and refused.headers["connection"] == "close"
        assert gateway.metric("effectgate_penalty_box_entries_total", source="stripe", reason="replays") == 1
        assert gateway.metric("effectgate_penalty_box_entries_total", source="stripe", reason="failures") == 0

        # Boxed: a new connection from that address gets no answer, whatever it sends.
        other = f"evt_{uuid.uuid4().hex}"
        sent = [
            send_raw(gateway.port, ATTACKER, body, headers),
            send_raw(gateway.port, ATTACKER, *genuine(other)),
        ]
        assert [read_to_close(sock) for sock in sent] == [b"", b""]
        assert gateway.metric("effectgate_penalty_box_refusals_total", source="stripe", how="held") == 2

        # The genuine sender keeps its service, even for the replayed delivery (its own second sight).
        for _ in range(3):
            event_id = f"evt_{uuid.uuid4().hex}"
            assert (
                provider.post(
                    "/webhooks/stripe", content=genuine(event_id)[0], headers=genuine(event_id)[1]
                ).status_code
                == 202
            )
            assert gateway.effects(event_id) == 1
        assert provider.post("/webhooks/stripe", content=body, headers=headers).status_code == 200

    # One effect; its count is what was answered: the delivery, REPLAYS duplicates, the provider's resend.
    assert gateway.effects(captured) == 1
    assert gateway.delivery_count(captured) == 1 + REPLAYS + 1
    assert gateway.effects(other) == 0


def test_a_sender_redelivering_many_different_events_is_never_boxed(gateway: Gateway) -> None:
    # After an outage a provider resends its backlog: every event a duplicate, some several times over.
    event_ids = [f"evt_{uuid.uuid4().hex}" for _ in range(4 * REPLAYS)]
    with gateway.client(ATTACKER) as sender:
        for event_id in event_ids:
            assert (
                sender.post(
                    "/webhooks/stripe", content=genuine(event_id)[0], headers=genuine(event_id)[1]
                ).status_code
                == 202
            )
        # Each event sent REPLAYS times in all (the most allowed): far more duplicates than REPLAYS.
        for _ in range(REPLAYS - 1):
            statuses = {
                sender.post("/webhooks/stripe", content=body, headers=headers).status_code
                for body, headers in map(genuine, event_ids)
            }
            assert statuses == {200}
    assert gateway.metric("effectgate_penalty_box_entries_total", source="stripe", reason="replays") == 0
    assert [gateway.effects(event_id) for event_id in event_ids] == [1] * len(event_ids)


def test_behind_a_trusted_proxy_a_replaying_client_is_answered_429(gateway: Gateway) -> None:
    captured = f"evt_{uuid.uuid4().hex}"
    body, headers = genuine(captured)
    replayer = {**headers, "X-Forwarded-For": "203.0.113.9"}
    with gateway.client() as proxy:
        statuses = [
            proxy.post("/webhooks/stripe", content=body, headers=replayer).status_code
            for _ in range(REPLAYS + 2)
        ]
        # The first is the delivery itself, the next REPLAYS - 1 duplicates; past REPLAYS, 429 before a claim.
        assert statuses == [202] + [200] * (REPLAYS - 1) + [429, 429]
        # Another client the proxy forwards for, and the proxy itself, keep their service.
        for forwarded in ({"X-Forwarded-For": "198.51.100.7"}, {}):
            event_id = f"evt_{uuid.uuid4().hex}"
            fresh, signed = genuine(event_id)
            assert (
                proxy.post("/webhooks/stripe", content=fresh, headers={**signed, **forwarded}).status_code
                == 202
            )
            assert gateway.effects(event_id) == 1
    assert gateway.effects(captured) == 1
    assert gateway.delivery_count(captured) == REPLAYS
    assert gateway.metric("effectgate_penalty_box_entries_total", source="stripe", reason="replays") == 1
    assert gateway.metric("effectgate_penalty_box_refusals_total", source="stripe", how="answered") == 2

"""Small, realistic example events per scheme, for ``effectgate send --example TYPE``.

Each body is a pure function of the scheme, the type and the event id: sending the same ``--event-id``
again sends the same bytes, so the gateway answers it as a duplicate, while a fresh id (the default)
is a new event. Anything that would differ per event (an order id, a payment intent, a timestamp in
the body) is derived from the event id for that reason; the example handlers key Stripe payments by
order, so a fresh event for the same order would be a key conflict rather than a new order.

Types listed in ``EXAMPLE_TYPES`` get bodies shaped like the provider's; any other type gets a
generic body of the provider's shape with that type, since providers define hundreds.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any
from urllib.parse import urlencode

from ..signatures.base import FORM_CONTENT_TYPE, JSON_CONTENT_TYPE
from .demo import payment_intent_event

# A fixed origin for timestamps inside example bodies: derived from the event id, never the clock.
_EPOCH = 1_767_225_600  # 2026-01-01T00:00:00Z


@dataclass(frozen=True, slots=True)
class Example:
    """An unsigned example delivery: the body, the event id and type the scheme may carry in headers,
    and the content type it is sent with."""

    body: bytes
    event_id: str
    event_type: str
    content_type: str = JSON_CONTENT_TYPE


class UnknownScheme(LookupError):
    """No example events exist for this scheme."""


def _digest(event_id: str, salt: str = "") -> str:
    return hashlib.sha256(f"{salt}:{event_id}".encode()).hexdigest()


def _number(event_id: str, salt: str, digits: int) -> int:
    number: int = int(_digest(event_id, salt), 16) % 10**digits
    return number


def _created(event_id: str) -> int:
    return _EPOCH + _number(event_id, "created", 7)


def _iso(event_id: str) -> str:
    return datetime.fromtimestamp(_created(event_id), UTC).isoformat().replace("+00:00", "Z")


def _order_id(event_id: str) -> str:
    return str(1000 + _number(event_id, "order", 6))


def _json(document: Any) -> bytes:
    # Providers send UTF-8 JSON; indent like Stripe and GitHub do, so the bytes look familiar.
    return json.dumps(document, indent=2).encode("utf-8")


# --- Stripe ------------------------------------------------------------------------------------


def _stripe(event_type: str, event_id: str) -> Example:
    order = _order_id(event_id)
    if event_type in ("payment_intent.succeeded", "payment_intent.amount_capturable_updated"):
        event = payment_intent_event(order, event_type, event_id=event_id)
    else:
        charge = f"ch_{_digest(event_id, 'charge')[:24]}"
        obj: dict[str, Any] = {
            "id": charge,
            "object": "charge",
            "amount": 4200,
            "currency": "eur",
            "payment_intent": f"pi_{_digest(event_id, 'intent')[:24]}",
            "metadata": {"order_id": order},
        }
        if event_type == "charge.succeeded":
            # The demo's payments use manual capture: Stripe reports the charge at the authorisation,
            # not yet captured (https://docs.stripe.com/api/charges/object).
            obj.update(captured=False, amount_captured=0)
        elif event_type == "charge.captured":
            obj.update(captured=True, amount_captured=4200)
        elif event_type == "charge.refunded":
            obj.update(captured=True, amount_captured=4200, refunded=True, amount_refunded=4200)
        else:
            kind = event_type.split(".", 1)[0]
            obj = {
                "id": f"{kind[:3]}_{_digest(event_id, kind)[:24]}",
                "object": kind,
                "metadata": obj["metadata"],
            }
        event = {
            "id": event_id,
            "object": "event",
            "type": event_type,
            "created": _created(event_id),
            "data": {"object": obj},
        }
    event.update(api_version="2024-06-20", livemode=False)
    return Example(_json(event), event_id, event_type)


# --- GitHub ------------------------------------------------------------------------------------


def _github(event_type: str, event_id: str) -> Example:
    event, _, action = event_type.partition(".")
    repository = {"id": 1296269, "full_name": "octocat/hello-world", "private": False}
    sender = {"login": "octocat", "id": 1, "type": "User"}
    document: dict[str, Any] = {}
    if action:
        document["action"] = action
    number = 1 + _number(event_id, "number", 4)
    if event == "push":
        document.update(
            ref="refs/heads/main",
            before=_digest(event_id, "before")[:40],
            after=_digest(event_id, "after")[:40],
            pusher={"name": "octocat"},
        )
    elif event == "issues":
        document["issue"] = {"number": number, "title": "Found a bug", "state": "open", "user": sender}
    elif event == "pull_request":
        document["number"] = number
        document["pull_request"] = {"number": number, "title": "Fix the bug", "state": "open", "user": sender}
    document.update(repository=repository, sender=sender)
    return Example(_json(document), event_id, event_type)


# --- Standard Webhooks ---------------------------------------------------------------------------


def _standard(event_type: str, event_id: str) -> Example:
    data: dict[str, Any] = {"id": f"obj_{_digest(event_id, 'object')[:16]}"}
    if event_type == "invoice.paid":
        data = {
            "id": f"in_{_digest(event_id, 'invoice')[:16]}",
            "customer": "cus_example",
            "amount_paid": 4200,
            "currency": "eur",
        }
    elif event_type == "user.created":
        data = {"id": f"user_{_digest(event_id, 'user')[:16]}", "email": "ada@example.com"}
    document = {"type": event_type, "timestamp": _iso(event_id), "data": data}
    return Example(_json(document), event_id, event_type)


# --- Shopify -----------------------------------------------------------------------------------


def _shopify(event_type: str, event_id: str) -> Example:
    order = 820982911946154508 + _number(event_id, "order", 6)
    if event_type.startswith("orders/"):
        document: dict[str, Any] = {
            "id": order,
            "admin_graphql_api_id": f"gid://shopify/Order/{order}",
            "name": f"#{_order_id(event_id)}",
            "email": "jon@example.com",
            "created_at": _iso(event_id),
            "currency": "EUR",
            "total_price": "42.00",
            "financial_status": "paid" if event_type == "orders/paid" else "pending",
            "line_items": [{"id": 866550311766439020, "sku": "demo", "quantity": 1, "price": "42.00"}],
        }
    else:
        document = {"id": order, "admin_graphql_api_id": f"gid://shopify/Object/{order}"}
    return Example(_json(document), event_id, event_type)


# --- Slack -------------------------------------------------------------------------------------


def _slack(event_type: str, event_id: str) -> Example:
    if event_type == "url_verification":
        document: dict[str, Any] = {
            "token": "Jhj5dZrVaK7ZwHHjRyZWjbDl",
            "challenge": _digest(event_id, "challenge")[:32],
            "type": "url_verification",
        }
        return Example(_json(document), event_id, event_type)
    event: dict[str, Any] = {
        "type": event_type,
        "user": "U061F7AUR",
        "channel": "C0LAN2Q65",
        "ts": f"{_created(event_id)}.000100",
    }
    if event_type in ("app_mention", "message"):
        event["text"] = "<@U0LAN0Z89> is it everything a river should be?"
    document = {
        "token": "Jhj5dZrVaK7ZwHHjRyZWjbDl",
        "team_id": "T061EG9R6",
        "api_app_id": "A0PNCHHK2",
        "type": "event_callback",
        "event_id": event_id,
        "event_time": _created(event_id),
        "event": event,
    }
    return Example(_json(document), event_id, event_type)


# --- Twilio ------------------------------------------------------------------------------------


def _twilio(event_type: str, event_id: str) -> Example:
    account = "AC" + _digest("account")[:32]
    if "." in event_type:
        # Dotted types are Event Streams' (com.twilio.messaging.message.delivered): JSON CloudEvents.
        document = {
            "specversion": "1.0",
            "type": event_type,
            "source": f"/2010-04-01/Accounts/{account}/Messages/{event_id}.json",
            "id": event_id,
            "time": _iso(event_id),
            "datacontenttype": "application/json",
            "data": {"messageSid": event_id, "accountSid": account, "to": "+15558675310"},
        }
        return Example(_json(document), event_id, event_type)
    # Otherwise a message status callback, form-encoded as Twilio posts it; the type is the status.
    fields = {
        "AccountSid": account,
        "ApiVersion": "2010-04-01",
        "From": "+15017122661",
        "MessageSid": event_id,
        "MessageStatus": event_type,
        "SmsSid": event_id,
        "SmsStatus": event_type,
        "To": "+15558675310",
    }
    return Example(urlencode(fields).encode("ascii"), event_id, event_type, FORM_CONTENT_TYPE)


# --- Adyen -------------------------------------------------------------------------------------


def _adyen(event_type: str, event_id: str) -> Example:
    item = {
        "additionalData": {},
        "amount": {"currency": "EUR", "value": 4200},
        "eventCode": event_type,
        "eventDate": _iso(event_id),
        "merchantAccountCode": "ExampleMerchantECOM",
        "merchantReference": f"order-{_order_id(event_id)}",
        "paymentMethod": "visa",
        "pspReference": event_id,
        "success": "true",
    }
    if event_type in ("CAPTURE", "REFUND", "CANCELLATION"):
        item["originalReference"] = f"{_number(event_id, 'original', 16):016d}"
    document = {"live": "false", "notificationItems": [{"NotificationRequestItem": item}]}
    return Example(_json(document), event_id, event_type)


# --- generic HMAC, PayPal ----------------------------------------------------------------------


def _hmac(event_type: str, event_id: str) -> Example:
    document = {
        "id": event_id,
        "type": event_type,
        "created": _created(event_id),
        "data": {"object": {"id": f"obj_{_digest(event_id, 'object')[:16]}"}},
    }
    return Example(_json(document), event_id, event_type)


def _paypal(event_type: str, event_id: str) -> Example:
    document = {
        "id": event_id,
        "event_version": "1.0",
        "create_time": _iso(event_id),
        "resource_type": "capture",
        "event_type": event_type,
        "resource": {"id": _digest(event_id, "capture")[:17].upper(), "status": "COMPLETED"},
    }
    return Example(_json(document), event_id, event_type)


def _fresh_id(prefix: str, length: int = 24) -> Callable[[], str]:
    return lambda: prefix + secrets.token_hex(length)[:length]


_Builder = Callable[[str, str], Example]

_BUILDERS: Mapping[str, tuple[_Builder, Callable[[], str]]] = MappingProxyType(
    {
        "stripe": (_stripe, _fresh_id("evt_")),
        "github": (_github, lambda: str(uuid.uuid4())),
        "standard-webhooks": (_standard, _fresh_id("msg_", 26)),
        "shopify": (_shopify, lambda: str(uuid.uuid4())),
        "slack": (_slack, lambda: "Ev" + secrets.token_hex(5).upper()),
        "twilio": (_twilio, _fresh_id("SM", 32)),
        "adyen": (_adyen, lambda: f"{secrets.randbelow(10**16):016d}"),
        "hmac": (_hmac, _fresh_id("evt_")),
        "paypal": (_paypal, lambda: "WH-" + secrets.token_hex(10).upper()),
    }
)

EXAMPLE_TYPES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "stripe": (
            "payment_intent.succeeded",
            "payment_intent.amount_capturable_updated",
            "charge.succeeded",
            "charge.captured",
            "charge.refunded",
        ),
        "github": ("push", "issues.opened", "pull_request.opened"),
        "standard-webhooks": ("invoice.paid", "user.created"),
        "shopify": ("orders/create", "orders/paid"),
        "slack": ("app_mention", "message", "url_verification"),
        "twilio": ("delivered", "sent", "failed", "com.twilio.messaging.message.delivered"),
        "adyen": ("AUTHORISATION", "CAPTURE", "REFUND"),
        "hmac": ("thing.happened",),
        "paypal": ("PAYMENT.CAPTURE.COMPLETED",),
    }
)
"""The types each scheme's examples are shaped for (the first is the default); others get a generic body."""


def example(scheme: str, event_type: str | None = None, event_id: str | None = None) -> Example:
    """An example delivery for ``scheme`` of ``event_type`` (the scheme's first listed type when None)
    with ``event_id`` (a fresh one in the provider's style when None). ``UnknownScheme`` for a scheme
    without examples."""
    entry = _BUILDERS.get(scheme)
    if entry is None:
        raise UnknownScheme(scheme)
    build, fresh = entry
    return build(event_type or EXAMPLE_TYPES[scheme][0], event_id or fresh())

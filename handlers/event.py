"""What a handler is given: the verified event, and a terminal transition as ``on_transition`` sees it.

A module of its own, importing nothing else of the handler side, so the context and the registry can
both name ``Event`` without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from effectgate.ledger.vocabulary import JobState


@dataclass(frozen=True, slots=True)
class Event:
    """A verified event as a handler sees it.

    ``id`` comes from signed material: the provider's event id where its signature covers it, else the
    digest of the signed body (``sha256:…``). ``delivery_id`` is the provider's delivery-id header when
    that is unsigned (GitHub, Shopify, Twilio, a generic ``hmac`` with ``id_header``): for logs, never for
    keys; it is ``None`` when a worker runs the effect. ``type_signed`` is false when the type came from
    an unsigned header: a sender holding one captured delivery can change it. Both are the gateway's view,
    for key, lock-key and ``require`` functions; the worker rebuilds the event from the ledger, which does
    not keep them (there ``type_signed`` reads true: an effect that cares checks ``require`` at claim time).
    """

    source: str
    id: str
    type: str
    payload: Any
    tenant: str = "default"
    delivery_id: str | None = None
    type_signed: bool = True


@dataclass(frozen=True, slots=True)
class Transition:
    """A terminal transition, as the ``on_transition`` hook sees it (inside the same transaction)."""

    job_id: int
    effect_key: str
    state: JobState
    reason: str | None

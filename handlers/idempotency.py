"""Downstream idempotency keys.

A key depends only on (tenant, effect key, step name): the same on every attempt, lease, process and
redrive, so a provider that honours idempotency keys performs the step once however often it is
asked. Never the attempt number or the lease token — those change exactly when the key must not.
"""

from __future__ import annotations

import base64
import hashlib

PREFIX = "eg_"


def idempotency_key(tenant: str, effect_key: str, step: str) -> str:
    """``eg_`` + 43 URL-safe characters: short enough for every provider (Stripe allows 255)."""
    # The unit separator cannot occur by accident in the parts, so ("a:b", "c") and ("a", "b:c") differ.
    material = "\x1f".join((tenant, effect_key, step)).encode("utf-8")
    digest = hashlib.sha256(material).digest()
    return PREFIX + base64.urlsafe_b64encode(digest).decode("ascii").rstrip("=")

"""The fingerprint that tells a duplicate from a reject.

SHA-256 of the canonical form of the event payload: JSON with sorted keys and no insignificant
whitespace, so a provider re-serialising the same event (key order, spacing) is still a duplicate;
bytes that are not JSON are hashed as they came.

An effect may say which parts of the payload make "the same request" (``fingerprint=[pointers]``):
then the fingerprint is the SHA-256 of the canonical JSON of those values only, so two different
events that agree on them (Stripe's ``payment_intent.succeeded`` and ``charge.succeeded`` for one
payment) are duplicates, and disagreeing on them (another amount) is a conflict.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from .pointers import JsonPointer, PointerMissing

# Made once: json.dumps with options builds a new encoder per call, and this runs on every delivery.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def canonical_json(payload: Any) -> bytes:
    """The canonical encoding of a JSON value: sorted keys, compact separators, UTF-8."""
    return _CANONICAL.encode(payload).encode("utf-8")


def fingerprint(payload: Any) -> str:
    """Hex SHA-256 of the canonical JSON of ``payload``."""
    return hashlib.sha256(canonical_json(payload)).hexdigest()


def fingerprint_selected(payload: Any, pointers: Sequence[JsonPointer]) -> str:
    """Hex SHA-256 of the canonical JSON of the values ``pointers`` select from ``payload``.

    The values are hashed as an object keyed by pointer, and a pointer with no value is left out: a
    field that is absent and one that is ``null`` are different requests, as are two payloads that
    put the same value under different pointers.
    """
    selected = {}
    for pointer in pointers:
        try:
            selected[pointer.text] = pointer.resolve(payload)
        except PointerMissing:
            continue
    return fingerprint(selected)


def fingerprint_bytes(body: bytes) -> str:
    """Hex SHA-256 of raw bytes, for bodies that are not JSON."""
    return hashlib.sha256(body).hexdigest()

"""The fingerprint that tells a duplicate from a reject.

SHA-256 of the canonical form of the event payload: JSON with sorted keys and no insignificant
whitespace, so a provider re-serialising the same event (key order, spacing) is still a duplicate;
bytes that are not JSON are hashed as they came.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_json(payload: Any) -> bytes:
    """The canonical encoding of a JSON value: sorted keys, compact separators, UTF-8."""
    return json.dumps(
        payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def fingerprint(payload: Any) -> str:
    """Hex SHA-256 of the canonical JSON of ``payload``."""
    return hashlib.sha256(canonical_json(payload)).hexdigest()


def fingerprint_bytes(body: bytes) -> str:
    """Hex SHA-256 of raw bytes, for bodies that are not JSON."""
    return hashlib.sha256(body).hexdigest()

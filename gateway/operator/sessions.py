"""Dashboard sessions: a signed, expiring cookie that names an operator's token by id, never the token.

A browser cannot send a bearer header by itself, so the dashboard signs an operator in once and keeps
a session cookie:

    v1.<session id>.<token id>.<expires, unix seconds>.<HMAC-SHA256 of the rest, hex>

- the **session id** is 128 random bits: it keys the form (CSRF) tokens of this session alone;
- the **token id** is a hash of the operator token's SHA-256 (itself a hash of the token), so the cookie
  can neither be turned back into the token nor used as one against the API;
- the **expiry** is signed with the rest, so a session ends ``[dashboard] session_ttl`` after sign-in
  whatever the browser does with the cookie;
- the **key** is derived from ``[dashboard] session_secret_env`` (or made at random by each ``serve`` if
  none is set), shared by every process of a deployment.

Why signed rather than stored: several gateway processes and replicas must accept one another's
sessions, and a table would need a migration and a write per sign-in for what a signature gives. The
price is revocation: a session ends at its expiry, when its operator's token is removed or changed
(its token id then names no one), or — for every session at once — when the secret is changed.
Signing out deletes the cookie in that browser; a copy taken before stays valid until its expiry,
which is why the default lifetime is a working day, not weeks.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass

from ..config.operator import OperatorToken

COOKIE = "effectgate_session"
_VERSION = "v1"


@dataclass(frozen=True, slots=True)
class SignedIn(OperatorToken):
    """An operator as a dashboard session names it, with the session's form (CSRF) token."""

    session_id: str = ""
    csrf: str = ""
    expires: int = 0


def token_id(operator: OperatorToken) -> str:
    """A public name for an operator's token: stable while the token is, and no use as a credential."""
    return hashlib.sha256(b"effectgate-token-id:" + operator.token_sha256).hexdigest()[:32]


def _mac(key: bytes, payload: str) -> str:
    return hmac.new(key, payload.encode("ascii"), hashlib.sha256).hexdigest()


def _csrf(key: bytes, session_id: str) -> str:
    return _mac(key, f"csrf:{session_id}")


def issue(key: bytes, operator: OperatorToken, ttl: float, *, now: float | None = None) -> str:
    """A new session cookie's value for ``operator``, valid for ``ttl`` seconds."""
    expires = int((time.time() if now is None else now) + ttl)
    payload = f"{_VERSION}.{secrets.token_hex(16)}.{token_id(operator)}.{expires}"
    return f"{payload}.{_mac(key, payload)}"


def read(
    key: bytes, cookie: str | None, operators: Sequence[OperatorToken], *, now: float | None = None
) -> SignedIn | None:
    """The signed-in operator a cookie names, or None if it is absent, forged, expired or names no one."""
    if not cookie or len(cookie) > 256:
        return None
    payload, _, mac = cookie.rpartition(".")
    parts = payload.split(".")
    if len(parts) != 4 or parts[0] != _VERSION or not hmac.compare_digest(mac, _mac(key, payload)):
        return None
    _, session_id, tid, expires_text = parts
    if not expires_text.isdigit() or int(expires_text) <= (time.time() if now is None else now):
        return None
    found: OperatorToken | None = None
    for operator in operators:
        if hmac.compare_digest(token_id(operator), tid):
            found = operator
    if found is None:
        return None
    return SignedIn(
        found.name,
        found.token_sha256,
        found.scopes,
        session_id=session_id,
        csrf=_csrf(key, session_id),
        expires=int(expires_text),
    )

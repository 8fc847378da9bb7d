"""Operator authentication: bearer tokens from configuration, kept as SHA-256 hashes, with scopes.

    [[operators]]
    name = "alice"
    token_sha256 = "…64 hex digits…"     # or: token_env = "ALICE_TOKEN" (hashed at load, never kept)
    scopes = ["view", "operate"]

``view`` reads reports; ``operate`` redrives and cancels jobs, and may read too. A presented token is
hashed and compared with every configured hash in constant time; the token itself is never stored,
logged or echoed in an answer. Webhook ingress does not use any of this: it is authenticated by
signatures only. The ``[[operators]]`` tables are read with the rest of the configuration
(``config.operator.read_operators``); this module only checks what a request presents.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from dataclasses import dataclass

from effectgate.gateway.config.operator import OperatorToken


@dataclass(frozen=True, slots=True)
class AuthFailure:
    """Why a request was not let in: 401 (no or unknown token) or 403 (token lacks the scope)."""

    status: int
    code: str
    detail: str

    @property
    def www_authenticate(self) -> str:
        """The RFC 6750 challenge for this failure."""
        if self.code == "missing_token":
            return 'Bearer realm="effectgate"'
        error = "insufficient_scope" if self.status == 403 else "invalid_token"
        return f'Bearer realm="effectgate", error="{error}"'


def hash_token(token: str) -> str:
    """The hex SHA-256 of a token, as ``token_sha256`` holds it."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def authenticate(
    authorization: str | None, operators: Sequence[OperatorToken], scope: str
) -> OperatorToken | AuthFailure:
    """The operator presenting ``Authorization: Bearer <token>`` if it may act in ``scope``."""
    if not authorization:
        return AuthFailure(401, "missing_token", "send Authorization: Bearer <operator token>")
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return AuthFailure(401, "invalid_token", "the Authorization header must be: Bearer <operator token>")
    presented = hashlib.sha256(token.encode("utf-8")).digest()
    found: OperatorToken | None = None
    # Every configured hash is compared, without stopping at a match, so the time taken says nothing
    # about which token matched or how much of it did.
    for operator in operators:
        if hmac.compare_digest(presented, operator.token_sha256):
            found = operator
    if found is None:
        return AuthFailure(401, "invalid_token", "the operator token is not known")
    if not found.allows(scope):
        return AuthFailure(403, "insufficient_scope", f"operator {found.name!r} lacks the {scope!r} scope")
    return found

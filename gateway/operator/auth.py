"""Operator authentication: bearer tokens from configuration, kept as SHA-256 hashes, with scopes.

    [[operators]]
    name = "alice"
    token_sha256 = "…64 hex digits…"     # or: token_env = "ALICE_TOKEN" (hashed at load, never kept)
    scopes = ["view", "operate"]

``view`` reads reports; ``operate`` redrives and cancels jobs, and may read too. A presented token is
hashed and compared with every configured hash in constant time; the token itself is never stored,
logged or echoed in an answer. Webhook ingress does not use any of this: it is authenticated by
signatures only.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from effectgate.gateway.secret_sources import missing
from effectgate.gateway.toml_reader import TableReader

SCOPES = ("view", "operate")
MIN_TOKEN_LENGTH = 16
_HEX_SHA256 = re.compile(r"[0-9a-f]{64}", re.ASCII)


@dataclass(frozen=True, slots=True)
class OperatorToken:
    """One configured operator: a name for the audit log, the SHA-256 of its token, its scopes."""

    name: str
    token_sha256: bytes
    scopes: frozenset[str]

    def allows(self, scope: str) -> bool:
        """Whether this operator may act in ``scope``; ``operate`` includes ``view``."""
        return scope in self.scopes or (scope == "view" and "operate" in self.scopes)


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


def read_operators(root: TableReader, env: Mapping[str, str]) -> tuple[OperatorToken, ...]:
    """The ``[[operators]]`` tables of a configuration; each mistake is recorded on ``root``, naming
    the file and the key, and the operator it belongs to is left out."""
    items = root.get("operators", list, [])
    operators: list[OperatorToken] = []
    for index, item in enumerate(items):
        where = f"operators[{index}]"
        if not isinstance(item, dict):
            root.problem(where, "must be a table ([[operators]])")
            continue
        operator = _read_operator(root.child(where, item), env, operators)
        if operator is not None:
            operators.append(operator)
    return tuple(operators)


def _read_operator(
    table: TableReader, env: Mapping[str, str], earlier: Sequence[OperatorToken]
) -> OperatorToken | None:
    name = table.get("name", str, required=True)
    if name is not None and not name.strip():
        table.problem("name", "must not be empty")
    elif name is not None and any(o.name == name for o in earlier):
        table.problem("name", f"operator {name!r} is configured twice")
    digest_hex = table.get("token_sha256", str)
    token_env = table.get("token_env", str)
    digest = None
    if (digest_hex is None) == (token_env is None):
        table.problem("token_sha256", "set exactly one of token_sha256 and token_env")
    elif digest_hex is not None:
        if not _HEX_SHA256.fullmatch(digest_hex.lower()):
            table.problem("token_sha256", "must be 64 hexadecimal digits (the SHA-256 of the token)")
        else:
            digest = bytes.fromhex(digest_hex)
    else:
        token = env.get(token_env, "")
        if not token:
            table.problem("token_env", missing(token_env))
        elif len(token) < MIN_TOKEN_LENGTH:
            table.problem(
                "token_env", f"the token in {token_env} is shorter than {MIN_TOKEN_LENGTH} characters"
            )
        else:
            digest = hashlib.sha256(token.encode("utf-8")).digest()
    if digest is not None and any(hmac.compare_digest(o.token_sha256, digest) for o in earlier):
        table.problem("token_sha256" if digest_hex else "token_env", "two operators share one token")
    scopes = table.get("scopes", list, required=True)
    if scopes is not None and (not scopes or not all(isinstance(s, str) and s in SCOPES for s in scopes)):
        table.problem("scopes", f"must be a non-empty list of {' and '.join(repr(s) for s in SCOPES)}")
    table.no_unknown_keys()
    if table.failed or name is None or digest is None or scopes is None:
        return None
    return OperatorToken(name, digest, frozenset(scopes))

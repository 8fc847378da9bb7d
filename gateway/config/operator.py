"""``[[operators]]``, ``[operator]``, ``[dashboard]`` and ``[metrics]``: who may operate (token hashes and
scopes), where the operator plane listens, its cookies and throttle, the dashboard's sessions, and the token
``/metrics`` asks for.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .gateway import GatewayConfig
from .reader import ConfigError as ConfigError
from .reader import TableReader
from .secrets import missing

SCOPES = ("view", "operate")
MIN_TOKEN_LENGTH = 16
_HEX_SHA256 = re.compile(r"[0-9a-f]{64}", re.ASCII)


DEFAULT_SESSION_TTL = 8 * 3600.0
DEFAULT_OPERATOR_HOST = "127.0.0.1"
DEFAULT_THROTTLE_LIMIT = 10
DEFAULT_THROTTLE_WINDOW = 300.0


@dataclass(frozen=True, slots=True)
class DashboardConfig:
    """The dashboard's sessions: the secret their cookies are signed with, and how long one lasts."""

    # None: each serve makes a random one at start (sessions end when it restarts, and replicas do not
    # share them). Set it for several replicas; change it to end every session at once.
    session_secret: bytes | None = None
    session_ttl: float = DEFAULT_SESSION_TTL


@dataclass(frozen=True, slots=True)
class OperatorConfig:
    """The operator plane (``/ui``, ``/api``, ``/metrics``): where it listens, its cookies, its throttle.

    With no ``listen`` it shares the gateway's listener (the quick start). With one, the gateway's
    listener serves ``/webhooks/*``, ``/healthz`` and ``/readyz`` only, and the operator plane is
    served on its own address by the same processes.
    """

    listen_host: str | None = None
    listen_port: int | None = None
    # None: Secure exactly when the request came over https (as a trusted proxy says); True/False: always
    # or never, for a deployment whose TLS ends at a proxy that does not say so.
    secure_cookies: bool | None = None
    # Wrong operator tokens per client before its failures are answered 429 (gateway.operator.throttle).
    throttle_limit: int = DEFAULT_THROTTLE_LIMIT
    throttle_window: float = DEFAULT_THROTTLE_WINDOW

    @property
    def apart(self) -> bool:
        """Whether the operator plane has a listener of its own."""
        return self.listen_port is not None


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[V6]:PORT`` for IPv6) as a host and port; ``ValueError`` naming what is wrong."""
    host, sep, port_text = text.strip().rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise ValueError(f"expected HOST:PORT (e.g. 127.0.0.1:9464, [::1]:9464), got {text!r}")
    if host.startswith("["):
        if not host.endswith("]"):
            raise ValueError(f"an IPv6 address is written in brackets: [::1]:9464, got {text!r}")
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"an IPv6 address is written in brackets: [::1]:9464, got {text!r}")
    port = int(port_text)
    if port > 65535:
        raise ValueError(f"port must be 0..65535, got {port}")
    return host, port


def _secret(reader: TableReader, key: str, env: Mapping[str, str] | None) -> str | None:
    var = reader.get(key, str)
    if var is None or env is None:
        return None
    value = env.get(var, "")
    if not value:
        reader.problem(key, missing(var))
        return None
    if len(value) < MIN_TOKEN_LENGTH:
        reader.problem(key, f"the secret in {var} is shorter than {MIN_TOKEN_LENGTH} characters")
        return None
    return value


def read_dashboard(reader: TableReader, env: Mapping[str, str] | None) -> DashboardConfig:
    """``[dashboard]``: the session secret (from the environment, with ``env`` None not read) and lifetime."""
    secret = _secret(reader, "session_secret_env", env)
    ttl = reader.number("session_ttl", DEFAULT_SESSION_TTL, minimum=60)
    reader.no_unknown_keys()
    return DashboardConfig(None if secret is None else secret.encode("utf-8"), ttl)


def read_operator(reader: TableReader, gateway: GatewayConfig) -> OperatorConfig:
    """``[operator]``: its own listener (never the gateway's port), cookies and throttle."""
    host = port = None
    listen = reader.get("listen", str)
    if listen is not None:
        try:
            host, port = parse_listen(listen)
        except ValueError as exc:
            reader.problem("listen", str(exc))
        else:
            if port != 0 and port == gateway.port:
                reader.problem("listen", f"must not be the gateway's own port ({gateway.port})")
    config = OperatorConfig(
        listen_host=host,
        listen_port=port,
        secure_cookies=reader.get("secure_cookies", bool),
        throttle_limit=reader.number("throttle_limit", DEFAULT_THROTTLE_LIMIT, minimum=1, integer=True),
        throttle_window=reader.number("throttle_window", DEFAULT_THROTTLE_WINDOW, minimum=1),
    )
    reader.no_unknown_keys()
    return config


def read_metrics_token(reader: TableReader, env: Mapping[str, str] | None) -> bytes | None:
    """``[metrics] token_env``: the SHA-256 of the token ``/metrics`` asks for, or None."""
    token = _secret(reader, "token_env", env)
    reader.no_unknown_keys()
    return None if token is None else hashlib.sha256(token.encode("utf-8")).digest()


@dataclass(frozen=True, slots=True)
class OperatorToken:
    """One configured operator: a name for the audit log, the SHA-256 of its token, its scopes."""

    name: str
    token_sha256: bytes
    scopes: frozenset[str]

    def allows(self, scope: str) -> bool:
        """Whether this operator may act in ``scope``; ``operate`` includes ``view``."""
        return scope in self.scopes or (scope == "view" and "operate" in self.scopes)


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

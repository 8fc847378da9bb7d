"""The penalty box: a client that keeps failing authentication for a source is held off it for a while.

A flood of bad signatures is cheap to answer one by one (an HMAC, a counter), but it is not free, and
the event loop serves connections in turn: 300 flooding connections next to 16 genuine ones get about
95 % of the loop, and every await of a genuine delivery (its body, its claim's round trip) waits behind
a loop pass full of 401s. Measured before this module: a flood of tiny 401s at 300 connections left
genuine deliveries at 0.03x their quiet rate and 50x their quiet p99 (``docs/performance.md``).

So failures are counted per **client and source** (the client is the peer address, or the address a
trusted proxy forwarded, as ``request.client`` has it). ``failures`` of them within ``window`` seconds
put that pair in the box for ``cooling`` seconds. While it is boxed:

- the connection guard (``gateway.guard``) refuses a request from that peer to that source as soon as
  its request line is parsed, before its headers and body are read: the connection is **held**, its
  reading paused, until the header timeout closes it without an answer (a flood client waits instead
  of sending more), up to ``hold`` such connections per process; past that it is closed at once;
- behind a trusted proxy (the peer is the proxy, the box holds the forwarded address), the ingress
  route answers ``429 client_penalised`` with ``Retry-After`` and ``Connection: close`` before reading
  the body.

Keyed per source, so a provider that fails on one misconfigured source keeps its service on the others.
A connection on which a delivery authenticated keeps its service while its client is boxed (a genuine
sender sharing an address with the attacker keeps its kept-alive connections), until a failure on that
connection itself. A sender that shares the attacker's address and opens new connections is held off
with it: the box cannot tell them apart (``docs/security.md`` says so).

State is per process, in memory, bounded by ``max_clients`` pairs (the oldest dropped first).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

DEFAULT_FAILURES = 50
DEFAULT_WINDOW = 10.0
DEFAULT_COOLING = 60.0
DEFAULT_HOLD = 256
DEFAULT_MAX_CLIENTS = 10_000


@dataclass(frozen=True, slots=True)
class PenaltySettings:
    """``[gateway.penalty_box]``: when a client is boxed, for how long, and how many of its connections are held."""

    enabled: bool = True
    failures: int = DEFAULT_FAILURES
    window: float = DEFAULT_WINDOW
    cooling: float = DEFAULT_COOLING
    hold: int = DEFAULT_HOLD
    max_clients: int = DEFAULT_MAX_CLIENTS

    def __post_init__(self) -> None:
        if (
            self.failures < 1
            or self.window <= 0
            or self.cooling <= 0
            or self.hold < 0
            or self.max_clients < 1
        ):
            raise ValueError("failures and max_clients must be >= 1, window and cooling > 0, hold >= 0")


Key = tuple[str, str]
Connection = tuple[str, int]
_V = TypeVar("_V")


class PenaltyBox:
    """Failed authentications per (client, source), and the pairs boxed until a moment. See the module."""

    def __init__(
        self, settings: PenaltySettings | None = None, *, clock: Callable[[], float] = time.monotonic
    ):
        self.settings = settings if settings is not None else PenaltySettings()
        self._clock = clock
        # (client, source) -> (start of its window, failures in it)
        self._failures: dict[Key, tuple[float, int]] = {}
        # (client, source) -> until when it is boxed
        self._boxed: dict[Key, float] = {}
        # Open connections on which a delivery authenticated since their last failure.
        self._proven: set[Connection] = set()
        #: Connections of boxed clients held unread right now (the guard keeps it).
        self.held = 0

    @property
    def active(self) -> bool:
        """Whether any pair may be boxed now: the guard's per-request check is one attribute read otherwise."""
        return bool(self._boxed)

    def failed(self, client: str, port: int, source: str) -> bool:
        """Count one failed authentication; True when it puts (``client``, ``source``) in the box."""
        self._proven.discard((client, port))
        if not self.settings.enabled:
            return False
        now = self._clock()
        key = (client, source)
        start, count = self._failures.get(key, (now, 0))
        if now - start >= self.settings.window:
            start, count = now, 0
        count += 1
        if count < self.settings.failures:
            self._remember(self._failures, key, (start, count))
            return False
        self._failures.pop(key, None)
        self._remember(self._boxed, key, now + self.settings.cooling)
        return True

    def authenticated(self, client: str, port: int) -> None:
        """A delivery on this connection authenticated: it keeps its service while its client is boxed."""
        if len(self._proven) < self.settings.max_clients:
            self._proven.add((client, port))

    def refuses(self, client: str, port: int, source: str) -> float:
        """Seconds left in the box for a request on this connection to ``source``; 0.0 when it is served."""
        if not self._boxed:
            return 0.0
        key = (client, source)
        until = self._boxed.get(key)
        if until is None or (client, port) in self._proven:
            return 0.0
        left = until - self._clock()
        if left <= 0:
            del self._boxed[key]
            return 0.0
        return left

    def forget(self, client: str, port: int) -> None:
        """The connection closed."""
        self._proven.discard((client, port))

    def _remember(self, table: dict[Key, _V], key: Key, value: _V) -> None:
        if key not in table and len(table) >= self.settings.max_clients:
            # Bounded: the oldest entry goes first (dicts keep insertion order).
            del table[next(iter(table))]
        table[key] = value

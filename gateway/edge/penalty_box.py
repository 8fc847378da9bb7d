"""The penalty box: a client that keeps failing authentication for a source is held off it for a while.

A flood of bad signatures is cheap to answer one by one (an HMAC, a counter), but it is not free, and
the event loop serves connections in turn: 300 flooding connections next to 16 genuine ones get about
95 % of the loop, and every await of a genuine delivery (its body, its claim's round trip) waits behind
a loop pass full of 401s. Measured before this module: a flood of tiny 401s at 300 connections left
genuine deliveries at 0.03x their quiet rate and 50x their quiet p99 (``docs/performance.md``).

So failures are counted per **client and source** (the client is the peer address, or the address a
trusted proxy forwarded, as ``request.client`` has it). ``failures`` of them within ``window`` seconds
put that pair in the box for ``cooling`` seconds. While it is boxed:

- ``mode = "one_at_a_time"`` (the default): the connection guard (``edge.guard``) serves that client's
  requests to that source **one at a time** per process. Each is read as any request is (its head and
  body under the usual limits and timeouts), then waits for the client's turn before the app sees it,
  and is answered like any other: a flood's bad signature gets its 401, its replay its 429, and a
  genuine signed delivery from the same address (a provider behind the same NAT, or on the attacker's
  own host) its 202, giving the turn back as soon as it authenticates (``authenticated``). So the flood
  costs at most one request in the app per process per turn (``gateway.edge.turns.Turns``), and a sender
  sharing the boxed address is slowed, not silenced: the turn goes to the newest request that was waiting
  when it began, and every fourth to the longest-waiting one, so a request with n waiting ahead of it
  gets the turn within 4(n + 1) turns, unless ``header_timeout`` closes it first.
- ``mode = "held"``: the guard refuses a request from that peer to that source as soon as its head is
  parsed, before its body is read: the connection is **held**, reading paused, until the header timeout
  closes it without an answer (a flood client waits instead of sending more). A sender sharing the
  address gets nothing on a new connection for ``cooling`` seconds.
- behind a trusted proxy (the peer is the proxy, the box holds the forwarded address), the ingress
  route answers ``429 client_penalised`` with ``Retry-After`` and ``Connection: close`` before reading
  the body, in either mode.

Either way at most ``hold`` requests per process wait for a turn (or are held); past that one is closed at once,
and a flood client reconnects at once, so every close costs an accept and a parsed head. ``hold`` is
therefore large by default: derived from the process's file limit, which the guard first raises to its
hard limit, and capped at 2,048 for memory (``derived_hold``). Measured with ``hold = 256``: a 500-connection replay flood made 16,000 to
25,000 such closes in 4 s, and the genuine p99 rose with them.

Keyed per source, so a provider that fails on one misconfigured source keeps its service on the others.
A connection on which a delivery authenticated keeps its full service while its
client is boxed (a genuine sender sharing an address with the attacker keeps its kept-alive
connections), until a failure on that connection itself.

**Replays** box a client too. A captured delivery replayed is correctly signed, so it never fails
authentication; each one costs a claim round trip, and a flood of one delivery shrinks every claim batch
to one request (a batch takes one request per key), so unrelated deliveries queue behind it. A provider
retries one delivery a handful of times over hours, never tens of times in seconds: so each
authenticated delivery is also counted per **client, source and body digest**, in memory, before it is
claimed. Sent more than ``replays`` times within ``window`` seconds, it is refused (``429
client_penalised``, ``Connection: close``, nothing claimed) and (client, source) goes in the box as
after ``failures`` failures. The first ``replays`` go through the claim path and are answered honestly
(200, duplicate), so the ledger's counts say what was answered. A provider redelivering many *different*
events (after an outage, each a duplicate) is never boxed: each body is counted on its own.

State is per process, in memory, bounded by ``max_clients`` entries per table (the oldest dropped first).
"""

from __future__ import annotations

import hashlib
import resource
import time
from collections.abc import Callable
from typing import Literal, TypeVar

from ..config.gateway import PenaltySettings

# File descriptors a process keeps for everything but waiting connections of boxed clients: its pools,
# listeners, logs and metric files, with room to spare.
RESERVED_FILES = 256
# Past this, more waiting connections would cost too much memory: a request waiting for its turn has its
# body read first, up to uvicorn's flow-control high-water mark (64 KiB), so 2,048 of them may hold 128 MiB
# of buffers per process. (Reading the body inside the turn instead would let one dripping body hold its
# client's turn until the body timeout.)
MAX_DERIVED_HOLD = 2_048
# Never raise the soft file limit past this, whatever the hard limit (some systems say "unlimited").
MAX_FILE_LIMIT = 1 << 20


Key = tuple[str, str]
# (client, source, body digest)
ReplayKey = tuple[str, str, bytes]
Connection = tuple[str, int]
_K = TypeVar("_K")
_V = TypeVar("_V")

#: What ``PenaltyBox.replayed`` says of a delivery: served, or refused (and whether this one boxed its client).
Replay = Literal["served", "boxed", "refused"]


def raise_file_limit() -> int:
    """Raise this process's soft ``RLIMIT_NOFILE`` to its hard limit (at most ``MAX_FILE_LIMIT``) and return
    the soft limit now in force.

    Distributions start services with a soft limit of 1,024 and a hard one far above it: a process that
    keeps a flood's connections waiting would otherwise run out of descriptors, and then accept fails for
    genuine senders too. Lowering it is never attempted; a refusal leaves the limit as it was.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    ceiling = MAX_FILE_LIMIT if hard == resource.RLIM_INFINITY else min(hard, MAX_FILE_LIMIT)
    if soft == resource.RLIM_INFINITY or soft >= ceiling:
        return MAX_FILE_LIMIT if soft == resource.RLIM_INFINITY else soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (ceiling, hard))
    except (ValueError, OSError):
        return soft
    return ceiling


def derived_hold(file_limit: int) -> int:
    """The default ``hold`` for a process that may have ``file_limit`` descriptors open.

    Half of what is left after ``RESERVED_FILES``, so the other half stays for genuine connections, at most
    ``MAX_DERIVED_HOLD`` (a memory bound: up to 64 KiB of body each): ``min(2048, max(0, (file_limit - 256)
    // 2))``. 1,024 files give 384; 4,352 or more give 2,048.
    """
    return min(MAX_DERIVED_HOLD, max(0, (file_limit - RESERVED_FILES) // 2))


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
        # (client, source, body digest) -> (start of its window, times seen in it)
        self._replays: dict[ReplayKey, tuple[float, int]] = {}
        # Open connections on which a delivery authenticated since their last failure.
        self._proven: set[Connection] = set()
        # Connections of boxed clients whose request is being served in their turn, each with what gives
        # the turn back (the guard keeps it).
        self._turns: dict[Connection, Callable[[], None]] = {}
        #: Connections of boxed clients held or waiting for their turn, unread, right now (the guard keeps it).
        self.held = 0
        #: How many may be (``settings.hold``, else derived from the file limit: ``use_file_limit``).
        self.hold = self.settings.hold if self.settings.hold is not None else derived_hold(_file_limit())

    def use_file_limit(self, file_limit: int) -> None:
        """The process may now have ``file_limit`` files open: a derived ``hold`` follows it."""
        if self.settings.hold is None:
            self.hold = derived_hold(file_limit)

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

    def replayed(self, client: str, port: int, source: str, body: bytes) -> Replay:
        """Count one authenticated delivery of ``body``; sent more than ``replays`` times within ``window``
        it is refused, and the refusal that finds (``client``, ``source``) out of the box (``"boxed"``) puts
        it in.

        Called before the claim, so a refused replay costs a digest and a dict lookup, no database call.
        """
        settings = self.settings
        if not settings.enabled or settings.replays == 0:
            return "served"
        now = self._clock()
        key = (client, source, hashlib.sha256(body).digest())
        start, count = self._replays.get(key, (now, 0))
        if now - start >= settings.window:
            start, count = now, 0
        count += 1
        self._remember(self._replays, key, (start, count))
        if count <= settings.replays:
            return "served"
        # Refused, and this connection no longer keeps its service (it authenticated only by replaying).
        self._proven.discard((client, port))
        if self._boxed.get((client, source), now) > now:
            return "refused"
        self._remember(self._boxed, (client, source), now + settings.cooling)
        return "boxed"

    def turn(self, client: str, port: int, give_back: Callable[[], None] | None) -> None:
        """The guard gave this connection its client's turn, with what gives it back (None: took it back)."""
        if give_back is not None:
            self._turns[(client, port)] = give_back
        else:
            self._turns.pop((client, port), None)

    def authenticated(self, client: str, port: int) -> None:
        """A delivery on this connection authenticated: it keeps its service while its client is boxed,
        and gives back its turn at once: its claim (a database round trip) is no flood's work, and
        the next request of its address need not wait for it."""
        give_back = self._turns.pop((client, port), None)
        if give_back is not None:
            give_back()
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
        if (client, port) in self._turns:
            # A direct peer served in its turn (``one_at_a_time``): its request is read and answered.
            return 0.0
        left = until - self._clock()
        if left <= 0:
            del self._boxed[key]
            return 0.0
        return left

    def left(self, client: str, source: str) -> float:
        """Seconds left in the box for (``client``, ``source``), whatever the connection; 0.0 when out of it."""
        return max(0.0, self._boxed.get((client, source), 0.0) - self._clock()) if self._boxed else 0.0

    def forget(self, client: str, port: int) -> None:
        """The connection closed."""
        self._proven.discard((client, port))

    def _remember(self, table: dict[_K, _V], key: _K, value: _V) -> None:
        if key not in table and len(table) >= self.settings.max_clients:
            # Bounded: the oldest entry goes first (dicts keep insertion order).
            del table[next(iter(table))]
        table[key] = value


def _file_limit() -> int:
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return MAX_FILE_LIMIT if soft == resource.RLIM_INFINITY else soft

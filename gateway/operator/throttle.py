"""Throttling wrong operator tokens, per client, without ever locking the right token out.

Every door that takes a token — ``POST /ui/login``, the bearer ``/api``, and ``/metrics`` (the gateway's
and a worker's) — counts the wrong tokens each client presents in a sliding window. Past ``limit`` of them, a wrong token is answered
``429`` with ``Retry-After`` instead of ``401``.

**A right token is always let in**, throttled client or not: the token is checked first and the
throttle only decides how a *failure* is answered. Otherwise anyone able to send wrong tokens from the
address an operator shares — every client behind a proxy whose forwarded headers are not trusted, one
office's NAT — could lock that operator out (measured before this change: 20 wrong tokens, then the
right one answered 429 with ``Retry-After: 296``). The price is that a throttled client still learns
whether a token is right: the throttle is not what stops guessing. A token of at least 16 characters
is (``MIN_TOKEN_LENGTH``; 32 random bytes are recommended). The throttle bounds what a flood of wrong tokens
costs the logs (at most ``limit`` lines per client per window, not one per try; the 429s are not
logged) and tells a well-behaved script to back off.

**Who is a client.** The address the request came from, as resolved through trusted forwarding only:
uvicorn believes ``X-Forwarded-For`` from the peers in ``[gateway] forwarded_allow_ips`` and takes the
right-most address no trusted proxy added, so a client that prepends addresses of its own cannot rotate
past the throttle. With ``forwarded_allow_ips = ["*"]`` every hop is believed and uvicorn takes the
left-most address, which the client writes itself; the throttle then uses the right-most one, the
address the nearest proxy saw. IPv6 clients are counted per /64, the block one host is usually given.

**Per process.** The counts live in memory: with N gateway processes a client gets up to N x ``limit``
wrong tries per ``window`` before every process answers 429. At most ``max_clients`` clients are kept
(the least recently failed forgotten first) with at most ``limit`` timestamps each, so a flood of
addresses cannot grow it without bound.
"""

from __future__ import annotations

import ipaddress
import math
import time
from collections import OrderedDict, deque

from starlette.requests import Request

DEFAULT_LIMIT = 10
DEFAULT_WINDOW = 300.0
DEFAULT_MAX_CLIENTS = 10_000


class FailureThrottle:
    """Wrong tokens per client in a sliding window; past ``limit``, the client's failures are 429s."""

    def __init__(
        self,
        limit: int = DEFAULT_LIMIT,
        window: float = DEFAULT_WINDOW,
        max_clients: int = DEFAULT_MAX_CLIENTS,
    ) -> None:
        if limit < 1 or window <= 0 or max_clients < 1:
            raise ValueError("limit and max_clients must be >= 1, window > 0")
        self.limit = limit
        self.window = window
        self.max_clients = max_clients
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def wait(self, client: str, *, now: float | None = None) -> float:
        """Seconds until ``client``'s next wrong token is answered 401 again; 0 when it is not throttled."""
        now = time.monotonic() if now is None else now
        failures = self._failures.get(client)
        if failures is None or len(failures) < self.limit:
            return 0.0
        return max(0.0, failures[0] + self.window - now)

    def failed(self, client: str, *, now: float | None = None) -> float:
        """Count one wrong token of ``client``: the seconds it must wait if it was throttled already
        (answer 429), else 0 (answer 401). The first ``limit`` wrong tokens in a window are 401s."""
        now = time.monotonic() if now is None else now
        failures = self._failures.pop(client, None) or deque(maxlen=self.limit)
        while failures and failures[0] <= now - self.window:
            failures.popleft()
        throttled = len(failures) >= self.limit
        # Throttled already: the failure is not counted again, so the wait ends a window after the
        # limit was reached, however fast the client keeps trying in between.
        if not throttled:
            failures.append(now)
        self._failures[client] = failures
        while len(self._failures) > self.max_clients:
            self._failures.popitem(last=False)
        return self.wait(client, now=now) if throttled else 0.0


def retry_after(wait: float) -> str:
    """The ``Retry-After`` value for a wait in seconds (at least 1)."""
    return str(max(1, math.ceil(wait)))


def client_key(request: Request) -> str:
    """The client a request counts against: its address through trusted forwarding, IPv6 per /64."""
    host = request.client.host if request.client else ""
    # A worker's metrics listener has no configuration of its own here and trusts no proxy.
    config = getattr(request.app.state, "config", None)
    trusted = config.gateway.forwarded_allow_ips if config is not None else ()
    if "*" in trusted:
        # Every hop is believed: the left-most entry, which uvicorn took, is the client's own writing.
        forwarded = ",".join(request.headers.getlist("x-forwarded-for"))
        hops = [hop.strip() for hop in forwarded.split(",") if hop.strip()]
        if hops:
            host = hops[-1]
    return _bucket(host)


def _bucket(host: str) -> str:
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return host[:64] or "unknown"
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address)

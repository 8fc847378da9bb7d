"""What fetches an unauthenticated request may cause: a budget per client, and one for all clients.

A scheme that must fetch what a request names before it can verify the request (PayPal's certificate URL)
lets anyone make the gateway fetch. Its caches make a URL already seen free, but a sender naming a new URL
each time would get a fetch each time (measured before this module: 85 fetches for 200 unsigned requests
from one client, each naming another certificate on PayPal's host). So each fetch a request *starts* is
paid from two token buckets, and a request that finds either empty starts none:

- its client's: ``CLIENT_FETCH_BURST`` fetches at once, one more every ``CLIENT_FETCH_INTERVAL`` seconds;
- everyone's: ``ALL_FETCH_BURST`` at once, one more every ``ALL_FETCH_INTERVAL`` seconds, so many addresses
  cannot each spend a client's budget.

A genuine sender pays almost nothing: PayPal signs with a handful of long-lived certificates, each fetched
once and then cached, and a request sharing a fetch in flight or answered from a cache pays nothing. The
price of the shared budget: while a flood from many addresses keeps it empty, a certificate PayPal has
just rotated to is not fetched either, and its deliveries are refused until PayPal's retry finds the budget
refilled; certificates already cached are unaffected.

The client is the one the edge limits count (``edge.penalty_box``): the peer address, or the address a
trusted proxy forwarded for; a request without one counts as one client, ``""``. State is in memory, per
process and per source, at most ``MAX_CLIENTS`` clients (the least recently charged dropped first).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Literal

# Four new certificate URLs at once, then one every 15 s (4 a minute): PayPal's own deliveries name one or
# two certificates a year apart.
CLIENT_FETCH_BURST = 4
CLIENT_FETCH_INTERVAL = 15.0
# For all clients together: 16 at once, then one every 2 s (30 a minute).
ALL_FETCH_BURST = 16
ALL_FETCH_INTERVAL = 2.0
MAX_CLIENTS = 4_096

#: Which budget refused a fetch.
Budget = Literal["client", "all"]


@dataclass(frozen=True, slots=True)
class Refusal:
    """A fetch not paid for: which ``budget`` was empty, and whether this is the ``first`` refusal since
    that budget last paid (so a flood is logged once per episode, not once per request)."""

    budget: Budget
    first: bool


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float
    refused: bool = False

    def refill(self, now: float, burst: int, interval: float) -> None:
        # A clock stepped back refills nothing, and the bucket keeps its later reading.
        if now > self.at:
            self.tokens = min(float(burst), self.tokens + (now - self.at) / interval)
            self.at = now


class FetchBudget:
    """Token buckets per client and for all clients; ``take`` pays for one fetch from both, or from neither."""

    def __init__(
        self,
        *,
        client_burst: int = CLIENT_FETCH_BURST,
        client_interval: float = CLIENT_FETCH_INTERVAL,
        all_burst: int = ALL_FETCH_BURST,
        all_interval: float = ALL_FETCH_INTERVAL,
        max_clients: int = MAX_CLIENTS,
    ) -> None:
        if min(client_burst, all_burst, max_clients) < 1 or min(client_interval, all_interval) <= 0:
            raise ValueError("bursts and max_clients must be >= 1, intervals > 0")
        self._client_burst = client_burst
        self._client_interval = client_interval
        self._all_burst = all_burst
        self._all_interval = all_interval
        self._max_clients = max_clients
        self._clients: OrderedDict[str, _Bucket] = OrderedDict()
        self._all: _Bucket | None = None

    def take(self, client: str, now: float) -> Refusal | None:
        """Pay for one fetch ``client`` causes at ``now``: None when paid, else the budget that is empty
        (and nothing is taken from the other)."""
        mine = self._clients.get(client)
        if mine is None:
            mine = _Bucket(float(self._client_burst), now)
            self._clients[client] = mine
            while len(self._clients) > self._max_clients:
                self._clients.popitem(last=False)
        self._clients.move_to_end(client)
        mine.refill(now, self._client_burst, self._client_interval)
        if self._all is None:
            self._all = _Bucket(float(self._all_burst), now)
        everyone = self._all
        everyone.refill(now, self._all_burst, self._all_interval)
        if mine.tokens < 1:
            return _refused("client", mine)
        if everyone.tokens < 1:
            return _refused("all", everyone)
        for bucket in (mine, everyone):
            bucket.tokens -= 1
            bucket.refused = False
        return None


def _refused(budget: Budget, bucket: _Bucket) -> Refusal:
    first = not bucket.refused
    bucket.refused = True
    return Refusal(budget, first)

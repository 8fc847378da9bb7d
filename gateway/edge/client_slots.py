"""Each process's request slots, shared fairly between clients: the connection guard's ``ClientSlots``.

A peer with ``client_concurrency`` requests in flight (head received, answer not yet complete) has its next
request wait, unread, until one of its own finishes (``edge.guard`` holds it); trusted proxies
(``forwarded_allow_ips``) are not limited, since every client behind them shares their address.
"""

from __future__ import annotations

import asyncio
import collections
import ipaddress
from collections.abc import Iterable
from typing import Protocol

from .. import metrics
from ..config.gateway import GatewayConfig


class Waiting(Protocol):
    """What the slots touch of a connection waiting for one (``guard.GuardedHttpToolsProtocol``)."""

    @property
    def transport(self) -> asyncio.Transport: ...

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    def admit(self) -> None: ...


class ClientSlots:
    """Requests in flight per client address in this process, and the connections waiting for a slot.

    A soft cap: a connection is admitted when its first bytes arrive and counted once its head is whole,
    so a burst of connections opened together can pass it by a few.
    """

    def __init__(self, per_client: int, trusted: Iterable[str] = ()) -> None:
        if per_client < 1:
            raise ValueError("per_client must be >= 1")
        self.per_client = per_client
        entries = tuple(trusted)
        self._trust_all = "*" in entries
        self._trusted = tuple(ipaddress.ip_network(e, strict=False) for e in entries if e != "*")
        self._in_flight: collections.Counter[str] = collections.Counter()
        self._waiting: dict[str, collections.deque[Waiting]] = {}
        #: Requests that had to wait for a slot (tests and logs).
        self.waited = 0

    def limits(self, client: str) -> bool:
        """Whether ``client``'s requests are counted (not a trusted proxy's)."""
        if self._trust_all:
            return False
        if not self._trusted:
            return True
        try:
            address = ipaddress.ip_address(client)
        except ValueError:
            return True
        return not any(address in network for network in self._trusted)

    def full(self, client: str) -> bool:
        return self._in_flight[client] >= self.per_client

    def start(self, client: str) -> None:
        self._in_flight[client] += 1

    def wait(self, client: str, protocol: Waiting) -> None:
        self.waited += 1
        metrics.client_slot_wait()
        self._waiting.setdefault(client, collections.deque()).append(protocol)

    def forget(self, client: str, protocol: Waiting) -> None:
        """A waiting connection closed: it no longer waits (nor is kept alive by the queue)."""
        waiting = self._waiting.get(client)
        if waiting is not None:
            try:
                waiting.remove(protocol)
            except ValueError:
                pass
            if not waiting:
                del self._waiting[client]

    def finish(self, client: str) -> None:
        left = self._in_flight[client] - 1
        if left > 0:
            self._in_flight[client] = left
        else:
            del self._in_flight[client]
        waiting = self._waiting.get(client)
        while waiting:
            protocol = waiting.popleft()
            if not protocol.transport.is_closing():
                protocol.loop.call_soon(protocol.admit)
                break
        if waiting is not None and not waiting:
            del self._waiting[client]


def per_process(gateway: GatewayConfig) -> ClientSlots | None:
    """A process's per-client request slots (its own, so build one per process), or None for no limit."""
    if not gateway.client_concurrency:
        return None
    return ClientSlots(gateway.client_concurrency, gateway.forwarded_allow_ips)

"""The wrong-token throttle: a sliding window per client, bounded memory, and client keys that a
client cannot rotate past trusted forwarding."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from starlette.requests import Request

from effectgate.gateway.operator.throttle import FailureThrottle, client_key, retry_after


def test_failures_are_counted_per_client_in_a_sliding_window() -> None:
    throttle = FailureThrottle(limit=3, window=60, max_clients=2)
    # The first `limit` wrong tokens are answered 401; the next ones wait.
    assert [throttle.failed("a", now=t) for t in (0, 10, 20, 21)] == [0, 0, 0, 39]
    assert throttle.wait("a", now=30) == 30  # until the first failure leaves the window
    assert throttle.wait("b", now=30) == 0
    # Trying on while throttled does not extend the wait: the limit's tries are what is counted.
    for t in range(30, 60):
        throttle.failed("a", now=t)
    assert throttle.wait("a", now=59) == 1
    assert throttle.failed("a", now=60) == 0  # the first failure left the window: one more try
    assert throttle.failed("a", now=61) == 9  # then throttled until the one at 10 leaves
    # A flood of clients forgets the least recently failed first, within max_clients.
    throttle.failed("b", now=62)
    throttle.failed("c", now=62)
    assert throttle.wait("a", now=62) == 0


def test_a_client_holds_at_most_limit_timestamps() -> None:
    throttle = FailureThrottle(limit=5, window=600)
    for t in range(10_000):
        throttle.failed("flood", now=t / 100)
    assert len(throttle._failures["flood"]) == 5


def test_retry_after_is_a_whole_number_of_at_least_one_second() -> None:
    assert [retry_after(w) for w in (0.01, 1.0, 1.2, 295.5)] == ["1", "1", "2", "296"]


def _request(client: str, trusted: tuple[str, ...], *forwarded: str) -> Request:
    config = SimpleNamespace(gateway=SimpleNamespace(forwarded_allow_ips=trusted))
    app = SimpleNamespace(state=SimpleNamespace(config=config))
    headers = [(b"x-forwarded-for", value.encode()) for value in forwarded]
    return Request({"type": "http", "client": (client, 1234), "headers": headers, "app": app})


@pytest.mark.parametrize(
    ("client", "trusted", "forwarded", "key"),
    [
        # uvicorn resolved the client through the trusted proxies; the key is that address.
        ("203.0.113.7", ("10.0.0.1",), ("198.51.100.1, 203.0.113.7",), "203.0.113.7"),
        # IPv6 clients per /64: one host's block of addresses is one client.
        ("2001:db8:1:2:aaaa::1", (), (), "2001:db8:1:2::/64"),
        ("2001:db8:1:2:ffff::9", (), (), "2001:db8:1:2::/64"),
        ("::ffff:192.0.2.1", (), (), "192.0.2.1"),
        # Everyone trusted: uvicorn took the left-most entry, which the client writes itself; the key is
        # the right-most, the address the nearest proxy saw.
        ("1.1.1.1", ("*",), ("1.1.1.1, 192.0.2.50",), "192.0.2.50"),
        ("2.2.2.2", ("*",), ("2.2.2.2", "192.0.2.50"), "192.0.2.50"),
        ("127.0.0.1", ("*",), (), "127.0.0.1"),
    ],
)
def test_the_client_key(client: str, trusted: tuple[str, ...], forwarded: tuple[str, ...], key: str) -> None:
    assert client_key(_request(client, trusted, *forwarded)) == key

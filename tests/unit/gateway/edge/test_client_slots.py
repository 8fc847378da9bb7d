"""ClientSlots' bookkeeping (gateway/edge/client_slots.py): per-client counts, who waits, who is admitted, and
trusted proxies exempt. The guard's use of them, through a real uvicorn, is tests/unit/gateway/edge/test_guard_slots.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from effectgate.gateway.edge.client_slots import ClientSlots


class Waiter:
    """Stands in for a waiting connection: records when it is admitted."""

    def __init__(self, admitted: list[Waiter]) -> None:
        self.closing = False
        self.admitted = admitted
        self.transport = self
        self.loop = self

    def is_closing(self) -> bool:
        return self.closing

    def call_soon(self, callback: Callable[[], Any]) -> None:
        callback()

    def admit(self) -> None:
        self.admitted.append(self)


def test_a_client_at_its_share_waits_and_is_admitted_in_order_skipping_closed_ones() -> None:
    slots = ClientSlots(2)
    admitted: list[Waiter] = []
    slots.start("10.0.0.1")
    slots.start("10.0.0.1")
    assert slots.full("10.0.0.1") and not slots.full("10.0.0.2")
    first, closed, second = Waiter(admitted), Waiter(admitted), Waiter(admitted)
    for waiter in (first, closed, second):
        slots.wait("10.0.0.1", waiter)  # type: ignore[arg-type]
    closed.closing = True
    slots.finish("10.0.0.1")
    assert admitted == [first]
    slots.finish("10.0.0.1")
    assert admitted == [first, second]
    assert not slots.full("10.0.0.1") and slots.waited == 3


def test_a_waiting_connection_that_closes_is_forgotten() -> None:
    slots = ClientSlots(1)
    admitted: list[Waiter] = []
    slots.start("10.0.0.1")
    gone = Waiter(admitted)
    slots.wait("10.0.0.1", gone)  # type: ignore[arg-type]
    slots.forget("10.0.0.1", gone)  # type: ignore[arg-type]
    slots.forget("10.0.0.1", gone)  # type: ignore[arg-type]
    slots.finish("10.0.0.1")
    assert admitted == []


@pytest.mark.parametrize(
    ("trusted", "limited"),
    [((), True), (("*",), False), (("10.0.0.0/8",), False), (("10.0.0.9",), True), (("::1",), True)],
)
def test_trusted_proxies_are_not_limited(trusted: tuple[str, ...], limited: bool) -> None:
    assert ClientSlots(1, trusted).limits("10.0.0.1") is limited


def test_per_client_must_be_positive() -> None:
    with pytest.raises(ValueError, match="per_client"):
        ClientSlots(0)

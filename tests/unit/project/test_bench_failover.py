"""The asynchronous failover check's verdict (tests/bench/failover.py): the gateways must name every acknowledged
claim the cut-off standby lost, and nothing else. A claim named lost whose provider duplicate, held through the
outage, was claimed anew by the new primary is present at the end and is not a false alarm; CI once failed on
exactly that (60 missing, 61 named)."""

from __future__ import annotations

from tests.bench.failover import losses_named

KILLED = 1_000.0


def seen(order: int, at: float) -> dict[str, float]:
    return {f"order-paid:{100_000 + order}": at}


def test_every_lost_claim_named_and_nothing_else_passes() -> None:
    assert losses_named([7], {"evt_7"}, [6, 7], seen(6, KILLED - 5), KILLED)


def test_a_lost_claim_not_named_fails() -> None:
    assert not losses_named([7, 8], {"evt_7"}, [6, 7, 8], seen(6, KILLED - 5), KILLED)


def test_a_claim_named_lost_and_claimed_again_after_the_kill_passes() -> None:
    first_seen = {**seen(6, KILLED - 5), **seen(9, KILLED + 3.2)}
    assert losses_named([7], {"evt_7", "evt_9"}, [6, 7, 9], first_seen, KILLED)


def test_a_claim_named_lost_that_was_never_lost_fails() -> None:
    first_seen = {**seen(6, KILLED - 5), **seen(9, KILLED - 1)}
    assert not losses_named([7], {"evt_7", "evt_9"}, [6, 7, 9], first_seen, KILLED)

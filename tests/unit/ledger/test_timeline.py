"""The timeline watch (ledger/timeline.py) and the gateway's record of what it acknowledged
(gateway/ingress/acknowledged.py), without a database: tests/e2e/test_failover_gap.py drives both through a
real promotion."""

from __future__ import annotations

import logging

import pytest

from effectgate.gateway.ingress.acknowledged import Acknowledged, Acknowledgement
from effectgate.ledger.claims import Accepted, Delivery, Duplicate, Rejected
from effectgate.ledger.timeline import TimelineChange, TimelineWatch


def test_the_first_timeline_is_a_baseline_and_a_standby_tells_nothing() -> None:
    watch = TimelineWatch()
    heard: list[TimelineChange] = []
    watch.listen(heard.append)
    assert watch.observe(None) is None
    assert watch.observe(1) is None
    assert watch.observe(1) is None
    assert watch.observe(None) is None  # a checkout that reached a standby: not known, not a change
    assert heard == []
    assert watch.timeline == 1


def test_a_change_is_logged_and_heard_once(caplog: pytest.LogCaptureFixture) -> None:
    watch = TimelineWatch()
    heard: list[TimelineChange] = []
    stop = watch.listen(heard.append)
    watch.observe(1)
    with caplog.at_level(logging.WARNING, logger="effectgate.ledger"):
        assert watch.observe(2) == TimelineChange(1, 2)
        assert watch.observe(2) is None
    assert heard == [TimelineChange(1, 2)]
    [record] = [r for r in caplog.records if r.msg == "ledger.timeline_changed"]
    assert (record.timeline_before, record.timeline_after) == (1, 2)  # type: ignore[attr-defined]
    stop()
    watch.observe(3)
    assert heard == [TimelineChange(1, 2)]


def test_a_listener_that_throws_does_not_fail_the_checkout_or_the_others(
    caplog: pytest.LogCaptureFixture,
) -> None:
    watch = TimelineWatch()
    heard: list[TimelineChange] = []

    def broken(change: TimelineChange) -> None:
        raise RuntimeError("boom")

    watch.listen(broken)
    watch.listen(heard.append)
    watch.observe(1)
    with caplog.at_level(logging.ERROR, logger="effectgate.ledger"):
        assert watch.observe(2) == TimelineChange(1, 2)
    assert heard == [TimelineChange(1, 2)]
    assert [r.msg for r in caplog.records if r.levelno == logging.ERROR] == [
        "ledger.timeline_listener_failed"
    ]


def delivery(event_id: str, tenant: str = "acme") -> Delivery:
    return Delivery("req", tenant, "shop", event_id, "payment_intent.succeeded", {}, "fp")


def test_only_what_an_answer_said_is_kept_is_recorded_newest_last_and_bounded() -> None:
    acknowledged = Acknowledged(size=3)
    acknowledged.record(
        [delivery("evt_1"), delivery("evt_2")],
        [
            [Accepted("k1", "h", 1, 1), Rejected("k0", "h", 9, "other")],
            [Duplicate("k2", "h", 2, 2)],
        ],
    )
    assert acknowledged.snapshot() == [
        Acknowledgement("acme", "k1", "shop", "evt_1"),
        Acknowledgement("acme", "k2", "shop", "evt_2"),
    ]
    acknowledged.record([delivery("evt_3", "beta")], [[Accepted("k3", "h", 3, 3), Accepted("k4", "h", 4, 4)]])
    assert [a.effect_key for a in acknowledged.snapshot()] == ["k2", "k3", "k4"]
    with pytest.raises(ValueError, match="at least 1"):
        Acknowledged(size=0)

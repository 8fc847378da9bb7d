"""The penalty box's accounting, on a hand-moved clock: who is boxed, for which source, for how long."""

from __future__ import annotations

import resource
import subprocess
import sys

import pytest

from effectgate.gateway.config.gateway import PenaltySettings
from effectgate.gateway.edge.penalty_box import PenaltyBox, derived_hold


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def box(**settings: float | int | bool) -> tuple[PenaltyBox, Clock]:
    clock = Clock()
    return PenaltyBox(PenaltySettings(**settings), clock=clock), clock  # type: ignore[arg-type]


def test_boxed_after_failures_within_the_window_for_that_source_only() -> None:
    pb, clock = box(failures=3, window=10, cooling=60)
    assert [pb.failed("10.0.0.9", 1, "stripe") for _ in range(3)] == [False, False, True]
    assert pb.refuses("10.0.0.9", 2, "stripe") == 60
    # Another source of the same client, and another client of the same source, are served.
    assert pb.refuses("10.0.0.9", 2, "github") == 0
    assert pb.refuses("10.0.0.8", 2, "stripe") == 0
    clock.now += 59
    assert pb.refuses("10.0.0.9", 2, "stripe") == 1
    clock.now += 1
    assert pb.refuses("10.0.0.9", 2, "stripe") == 0
    assert not pb.active


def test_failures_spread_wider_than_the_window_never_box() -> None:
    pb, clock = box(failures=3, window=10)
    for _ in range(10):
        assert not pb.failed("10.0.0.9", 1, "stripe")
        assert not pb.failed("10.0.0.9", 1, "stripe")
        clock.now += 10
    assert pb.refuses("10.0.0.9", 1, "stripe") == 0


def test_a_connection_that_authenticated_keeps_its_service_until_it_fails() -> None:
    pb, _ = box(failures=2)
    pb.authenticated("10.0.0.9", 7)
    pb.failed("10.0.0.9", 8, "stripe")
    pb.failed("10.0.0.9", 8, "stripe")
    assert pb.refuses("10.0.0.9", 8, "stripe") > 0
    assert pb.refuses("10.0.0.9", 7, "stripe") == 0
    pb.failed("10.0.0.9", 7, "stripe")
    assert pb.refuses("10.0.0.9", 7, "stripe") > 0
    # A closed connection's proof is forgotten: its port reused by a new connection proves nothing.
    pb.authenticated("10.0.0.9", 9)
    pb.forget("10.0.0.9", 9)
    assert pb.refuses("10.0.0.9", 9, "stripe") > 0


def test_disabled_boxes_nobody() -> None:
    pb, _ = box(enabled=False, failures=1)
    assert not pb.failed("10.0.0.9", 1, "stripe")
    assert pb.refuses("10.0.0.9", 1, "stripe") == 0


def test_bounded_by_max_clients_oldest_first() -> None:
    pb, _ = box(failures=1, max_clients=3)
    for n in range(5):
        pb.failed(f"10.0.0.{n}", 1, "stripe")
    assert [pb.refuses(f"10.0.0.{n}", 1, "stripe") > 0 for n in range(5)] == [False, False, True, True, True]


@pytest.mark.parametrize(
    "settings",
    [{"failures": 0}, {"window": 0}, {"cooling": -1}, {"hold": -1}, {"max_clients": 0}, {"replays": -1}],
)
def test_settings_refused(settings: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="failures and max_clients"):
        PenaltySettings(**settings)  # type: ignore[arg-type]


def test_one_delivery_sent_more_than_replays_times_in_the_window_boxes_its_client() -> None:
    pb, clock = box(replays=3, window=10, cooling=60)
    body = b'{"id": "evt_1"}'
    assert [pb.replayed("10.0.0.9", 1, "stripe", body) for _ in range(5)] == [
        "served",
        "served",
        "served",
        "boxed",
        "refused",
    ]
    assert pb.refuses("10.0.0.9", 2, "stripe") == 60
    assert pb.left("10.0.0.9", "stripe") == 60
    # Another client sending the same body, and the same client on another source, are served.
    assert pb.replayed("10.0.0.8", 1, "stripe", body) == "served"
    assert pb.replayed("10.0.0.9", 1, "github", body) == "served"
    assert pb.refuses("10.0.0.9", 2, "github") == 0
    clock.now += 60
    assert pb.refuses("10.0.0.9", 2, "stripe") == 0


def test_many_different_deliveries_from_one_client_never_box_it() -> None:
    # A provider redelivering its backlog after an outage: every body once (or a few times), each a duplicate.
    pb, _ = box(replays=3, window=10)
    for attempt in range(3):
        for n in range(1000):
            assert pb.replayed("10.0.0.9", 1, "stripe", b'{"id": "evt_%d"}' % n) == "served", (attempt, n)
    assert not pb.active


def test_repeats_spread_wider_than_the_window_never_box() -> None:
    pb, clock = box(replays=2, window=10)
    for _ in range(10):
        assert pb.replayed("10.0.0.9", 1, "stripe", b"{}") == "served"
        assert pb.replayed("10.0.0.9", 1, "stripe", b"{}") == "served"
        clock.now += 10
    assert not pb.active


def test_a_replaying_connection_loses_its_proof() -> None:
    pb, _ = box(replays=1)
    pb.authenticated("10.0.0.9", 7)
    assert pb.replayed("10.0.0.9", 7, "stripe", b"{}") == "served"
    assert pb.replayed("10.0.0.9", 7, "stripe", b"{}") == "boxed"
    assert pb.refuses("10.0.0.9", 7, "stripe") > 0


def test_a_client_already_boxed_for_failures_is_refused_not_boxed_again() -> None:
    pb, _ = box(replays=1, failures=1)
    assert pb.failed("10.0.0.9", 1, "stripe")
    assert pb.replayed("10.0.0.9", 2, "stripe", b"{}") == "served"
    assert pb.replayed("10.0.0.9", 2, "stripe", b"{}") == "refused"


@pytest.mark.parametrize("settings", [{"replays": 0}, {"enabled": False, "replays": 1}])
def test_replays_zero_or_disabled_never_box(settings: dict[str, int | bool]) -> None:
    pb, _ = box(**settings)
    assert {pb.replayed("10.0.0.9", 1, "stripe", b"{}") for _ in range(100)} == {"served"}
    assert not pb.active


def test_the_replay_memory_is_bounded_by_max_clients() -> None:
    pb, _ = box(replays=1, max_clients=3)
    for n in range(5):
        pb.replayed("10.0.0.9", 1, "stripe", b"%d" % n)
    # The two oldest were forgotten: each is a first sight again; the newest is a repeat.
    assert pb.replayed("10.0.0.9", 1, "stripe", b"0") == "served"
    assert pb.replayed("10.0.0.9", 1, "stripe", b"4") == "boxed"


def test_the_default_hold_is_half_the_file_limit_left_after_the_reserve_capped() -> None:
    # min(2048, max(0, (F - 256) // 2)), as docs/configuration.md states it: capped for the memory of
    # the bodies waiting (64 KiB each, 128 MiB at most), not only for the file limit.
    assert [derived_hold(f) for f in (0, 256, 1024, 4352, 4354, 65_536, 1 << 20)] == [
        0,
        0,
        384,
        2048,
        2048,
        2048,
        2048,
    ]


def test_an_unset_hold_follows_the_process_file_limit_and_a_set_one_stays() -> None:
    derived = PenaltyBox(PenaltySettings())
    assert derived.hold == derived_hold(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    derived.use_file_limit(65_536)
    assert derived.hold == 2_048
    fixed = PenaltyBox(PenaltySettings(hold=256))
    fixed.use_file_limit(65_536)
    assert fixed.hold == 256


def test_the_file_limit_is_raised_to_the_hard_limit() -> None:
    # In a child: the soft limit lowered first, as a distribution's service manager would leave it.
    script = (
        "import resource\n"
        "from effectgate.gateway.edge.penalty_box import raise_file_limit, MAX_FILE_LIMIT\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))\n"
        "got = raise_file_limit()\n"
        "ceiling = MAX_FILE_LIMIT if hard == resource.RLIM_INFINITY else min(hard, MAX_FILE_LIMIT)\n"
        "print(got == ceiling == resource.getrlimit(resource.RLIMIT_NOFILE)[0], got > 256)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["True", "True"]


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="mode"):
        PenaltySettings(mode="silence")  # type: ignore[arg-type]


def test_a_connection_served_in_its_turn_is_not_refused_by_the_route() -> None:
    boxed, _ = box(failures=1)
    assert boxed.failed("10.0.0.1", 5, "stripe")
    assert boxed.refuses("10.0.0.1", 6, "stripe") > 0
    given_back: list[int] = []
    boxed.turn("10.0.0.1", 6, lambda: given_back.append(6))
    assert boxed.refuses("10.0.0.1", 6, "stripe") == 0.0
    boxed.turn("10.0.0.1", 6, None)
    assert boxed.refuses("10.0.0.1", 6, "stripe") > 0
    assert given_back == []


def test_a_request_that_authenticates_in_its_turn_gives_the_turn_back_at_once() -> None:
    # Its claim (a database round trip) runs outside the turn; the connection is proven from then on.
    boxed, _ = box(failures=1)
    boxed.failed("10.0.0.1", 5, "stripe")
    given_back: list[int] = []
    boxed.turn("10.0.0.1", 6, lambda: given_back.append(6))
    boxed.authenticated("10.0.0.1", 6)
    assert given_back == [6]
    assert boxed.refuses("10.0.0.1", 6, "stripe") == 0.0
    boxed.authenticated("10.0.0.1", 6)
    assert given_back == [6]

"""The in-memory side of failed verifications: bounded buckets, sampled diagnoses off the event loop."""

from __future__ import annotations

import hashlib
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from effectgate.gateway.ingress.signature_failures import Diagnoser, SignatureFailures
from effectgate.gateway.signatures import SignatureInvalid, SignatureMissing
from effectgate.ledger import signature_failures
from effectgate.ledger.signature_failures import FailureCounter

NOW = datetime(2031, 6, 1, 12, 0, 30, tzinfo=UTC)
REASONS = ("signature_missing", "signature_malformed", "signature_invalid", "timestamp_out_of_tolerance")


class CountingHashlib:
    def __init__(self) -> None:
        self.hashed = 0

    def sha256(self, data: bytes) -> Any:
        self.hashed += 1
        return hashlib.sha256(data)


def test_a_flood_in_one_bucket_is_one_entry_and_one_body_hash(monkeypatch: pytest.MonkeyPatch) -> None:
    counting = CountingHashlib()
    monkeypatch.setattr(signature_failures, "hashlib", counting)
    counter = FailureCounter()
    for i in range(1000):
        counter.add("stripe", "signature_invalid", b"x" * 100, f"detail {i}", now=NOW)
    assert len(counter) == 1
    assert counting.hashed == 1
    [(key, bucket)] = counter.drain().items()
    assert key == ("stripe", "signature_invalid", NOW.replace(second=0))
    assert (bucket.count, bucket.bytes_total, bucket.detail) == (1000, 100_000, "detail 999")
    assert len(counter) == 0


def test_the_buckets_are_capped_and_what_does_not_fit_is_counted_as_dropped() -> None:
    counter = FailureCounter(max_buckets=3)
    for minute in range(10):
        for reason in REASONS:
            counter.add("stripe", reason, b"x", "d", now=NOW + timedelta(minutes=minute))
    assert len(counter) == 3
    assert counter.dropped == 10 * len(REASONS) - 3
    # An existing bucket still counts past the cap: only new keys are refused.
    counter.add("stripe", REASONS[0], b"x", "d", now=NOW)
    assert sum(b.count for b in counter.drain().values()) == 4


def test_a_failed_write_is_restored_merged_with_what_came_since_and_within_the_cap() -> None:
    counter = FailureCounter(max_buckets=2)
    counter.add("stripe", "signature_invalid", b"ab", "old", now=NOW)
    counter.add("stripe", "signature_missing", b"ab", "old", now=NOW)
    taken = counter.drain()
    counter.add("stripe", "signature_invalid", b"abc", "new", now=NOW + timedelta(seconds=5))
    counter.add("github", "signature_invalid", b"abc", "new", now=NOW)
    counter.restore(taken)
    buckets = counter.drain()
    assert len(buckets) == 2
    merged = buckets["stripe", "signature_invalid", NOW.replace(second=0)]
    assert (merged.count, merged.bytes_total, merged.detail) == (2, 5, "new")
    assert merged.last_seen_at == NOW + timedelta(seconds=5)
    assert counter.dropped == 1  # the signature_missing bucket found no room


def test_a_hint_for_a_bucket_already_written_travels_alone_with_count_zero() -> None:
    counter = FailureCounter()
    counter.add("stripe", "signature_invalid", b"ab", "d", now=NOW)
    counter.drain()
    counter.hint("stripe", "signature_invalid", NOW, "re-encoded", seen_at=NOW)
    [bucket] = counter.drain().values()
    assert (bucket.count, bucket.hint) == (0, "re-encoded")


@pytest.mark.anyio
async def test_diagnoses_are_sampled_per_source_and_minute_and_run_off_the_event_loop() -> None:
    hints: list[tuple[str, str]] = []
    threads: set[str] = set()
    release = threading.Event()

    def diagnose() -> str | None:
        threads.add(threading.current_thread().name)
        release.wait(timeout=30)
        return "re-encoded"

    diagnoser = Diagnoser(lambda s, r, m, h: hints.append((s, h)), per_minute=2, queue=8)
    try:
        started = [diagnoser.offer("stripe", "signature_invalid", NOW, diagnose) for _ in range(50)]
        other = diagnoser.offer("github", "signature_invalid", NOW, diagnose)
        next_minute = diagnoser.offer("stripe", "signature_invalid", NOW + timedelta(minutes=1), diagnose)
        assert started.count(True) == 2 and other and next_minute
        assert diagnoser.skipped == 48
        release.set()
        await diagnoser.wait_idle()
    finally:
        diagnoser.close()
    assert hints.count(("stripe", "re-encoded")) == 3 and hints.count(("github", "re-encoded")) == 1
    assert threading.current_thread().name not in threads
    assert all(name.startswith("effectgate-diagnosis") for name in threads)


@pytest.mark.anyio
async def test_the_diagnosis_queue_is_bounded_and_drops_when_full() -> None:
    release = threading.Event()

    def diagnose() -> str | None:
        release.wait(timeout=30)
        return None

    diagnoser = Diagnoser(lambda *_: None, per_minute=100, queue=2)
    try:
        offered = [diagnoser.offer(f"source{i}", "signature_invalid", NOW, diagnose) for i in range(10)]
        assert offered == [True, True] + [False] * 8
        release.set()
        await diagnoser.wait_idle()
        assert diagnoser.offer("source0", "signature_invalid", NOW, diagnose)
        await diagnoser.wait_idle()
    finally:
        diagnoser.close()


@pytest.mark.anyio
async def test_a_diagnosis_that_raises_leaves_no_hint_and_no_crash() -> None:
    hints: list[str] = []

    def broken() -> str | None:
        raise RuntimeError("boom")

    diagnoser = Diagnoser(lambda s, r, m, h: hints.append(h))
    try:
        assert diagnoser.offer("stripe", "signature_invalid", NOW, broken)
        await diagnoser.wait_idle()
    finally:
        diagnoser.close()
    assert hints == []


@pytest.mark.anyio
async def test_a_failure_is_counted_at_once_and_only_a_deferred_diagnosis_is_offered() -> None:
    failures = SignatureFailures(FailureCounter())
    failures.failed("stripe", SignatureMissing(), b"{}")
    invalid = SignatureInvalid("no match")
    invalid.diagnose = lambda: "re-encoded"
    failures.failed("stripe", invalid, b"{}")
    await failures.diagnoser.wait_idle()
    failures.diagnoser.close()
    assert failures.diagnoser.started == 1
    buckets = {key[1]: bucket for key, bucket in failures.counter.drain().items()}
    assert buckets["signature_missing"].count == 1
    assert (buckets["signature_invalid"].count, buckets["signature_invalid"].hint) == (1, "re-encoded")


def test_the_counter_refuses_a_cap_below_one() -> None:
    with pytest.raises(ValueError, match="max_buckets"):
        FailureCounter(max_buckets=0)


def test_counting_needs_no_event_loop() -> None:
    # add() is plain code: counting a failure awaits nothing, so it cannot wait behind anything.
    counter = FailureCounter()
    counter.add("stripe", "signature_invalid", b"", "d")
    assert len(counter) == 1


@pytest.mark.anyio
async def test_closing_with_a_diagnosis_running_hands_its_result_to_no_one() -> None:
    hints: list[str] = []
    started, release = threading.Event(), threading.Event()

    def slow() -> str | None:
        started.set()
        release.wait(timeout=30)
        return "too late"

    diagnoser = Diagnoser(lambda s, r, m, h: hints.append(h))
    assert diagnoser.offer("stripe", "signature_invalid", NOW, slow)
    started.wait(timeout=30)
    diagnoser.close()
    release.set()
    await diagnoser.wait_idle()
    assert hints == []

"""Declared HTTP effects against a real service in another language (issue 22): serve + worker + a Node.js
service that verifies each request with the ``standardwebhooks`` npm package and acts once per
Idempotency-Key. Deliveries, a duplicate, a conflict, a 500 then a 200, a terminal 422, and a worker
SIGKILLed while the service holds its answer: the service sees the same key again and acted once."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from .node_service import Forwarding, forwarding_stack, key_of
from .processes import wait_until


@pytest.fixture
def forwarding(db_url: str, tmp_path: Path) -> Iterator[Forwarding]:
    with forwarding_stack(db_url, tmp_path) as stack:
        yield stack


def test_a_node_service_acts_once_per_effect_through_retries_refusals_and_a_sigkill(
    forwarding: Forwarding,
) -> None:
    f = forwarding
    worker = f.worker("worker-1")

    # A delivery, its duplicate, and a different payload under the same key.
    assert f.deliver("o_1", "evt_1").status_code == 202
    assert f.deliver("o_1", "evt_1").status_code == 200
    conflict = f.deliver("o_1", "evt_1b", amount=999)
    assert (conflict.status_code, conflict.json()["error"]) == (409, "key_conflict")
    done = f.wait_state("o_1", "succeeded")
    assert done["step"] == "succeeded"
    assert done["result"]["status"] == 200 and done["result"]["body"]["order"] == "o_1"  # type: ignore[index]

    # A 500, then a 200 on the retry: the same Idempotency-Key both times, acted once.
    assert f.deliver("o_flaky", "evt_2").status_code == 202
    assert f.wait_state("o_flaky", "succeeded")["attempt"] == 2

    # A 422 is terminal: failed after one attempt, the answer recorded with the step.
    assert f.deliver("o_reject", "evt_3").status_code == 202
    rejected = f.wait_state("o_reject", "failed")
    assert (rejected["attempt"], rejected["step"]) == (1, "failed")
    assert rejected["error"]["code"] == "http_422"  # type: ignore[index]
    assert "order_unknown" in rejected["error"]["message"]  # type: ignore[index]

    # The service acts and holds its answer; the worker is killed before hearing it.
    assert f.deliver("o_hold", "evt_4").status_code == 202
    wait_until(lambda: key_of("o_hold") in f.node.stats()["held"], 60, "the service to hold its answer")
    worker.popen.send_signal(signal.SIGKILL)
    worker.popen.wait()
    f.node.release()  # to a dead connection: the answer is lost with the worker
    f.worker("worker-2")
    f.wait_state("o_hold", "succeeded")

    stats = f.node.stats()
    assert stats["rejected_signatures"] == 0
    assert stats["seen"] == {
        key_of("o_1"): 1,
        key_of("o_flaky"): 2,
        key_of("o_reject"): 1,
        key_of("o_hold"): 2,
    }
    assert stats["acted"] == {key_of("o_1"): 1, key_of("o_flaky"): 1, key_of("o_hold"): 1}

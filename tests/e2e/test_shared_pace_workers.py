"""Two real `effectgate worker` processes share one `max_per_second` on a downstream (`pace_scope = "ledger"`, the
default): together they send the fake Stripe its captures no faster than the one rate, each capture once.

Each process alone would send at the full rate, so two would finish the same captures in about half the time:
the test counts the fake provider's arrival times, a lower bound that a loaded machine only makes longer.
"""

from __future__ import annotations

import httpx
import psycopg
from psycopg.rows import dict_row

from .conftest import Stack, event

RATE = 5.0
ORDERS = 12


def test_two_worker_processes_together_capture_no_faster_than_the_shared_rate(stack: Stack) -> None:
    text = stack.config.read_text()
    stack.config.write_text(
        text.replace("[downstream.payments]\n", f"[downstream.payments]\nmax_per_second = {RATE}\n", 1)
    )
    stack.worker("w1")
    stack.worker("w2")
    orders = [f"77{i:02d}" for i in range(ORDERS)]
    for order in orders:
        assert stack.deliver(event(order, f"evt_{order}")).status_code == 202
    for order in orders:
        stack.wait_state(f"order-paid:{order}", "succeeded", timeout=60)

    sent = httpx.get(f"{stack.fake_url}/_fake/requests", timeout=5).json()
    captures = sorted(r["at"] for r in sent if r["path"].endswith("/capture"))
    assert len(captures) == ORDERS
    span = captures[-1] - captures[0]
    assert span >= (ORDERS - 1) / RATE * 0.85, f"{ORDERS} captures at {RATE:g} a second took {span:.2f} s"
    stats = stack.stats()
    assert (stats["captures"], stats["double_capture_attempts"]) == (ORDERS, 0)
    with psycopg.connect(stack.db_url, row_factory=dict_row) as conn:
        row = conn.execute(
            "SELECT count(DISTINCT worker) AS workers, count(*) AS attempts FROM job_attempts"
        ).fetchone()
    # Both processes ran captures, and none was refused by the pace (each turn was within the 5 s wait).
    assert row == {"workers": 2, "attempts": ORDERS}

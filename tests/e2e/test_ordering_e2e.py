"""Issue 22's "done when", over HTTP: 1,000 updates of 100 subscriptions, shuffled and posted concurrently to a
real ``effectgate serve``, signed as Stripe signs; then a real ``effectgate worker`` runs the jobs. Every
subscription ends at its highest version, every older delivery is superseded (answered 200 ``superseded`` at
the claim, or its job cancelled as superseded before it ran), and none ran after a newer one: the handler logs
each run as it starts, and the test reads the order back from the worker's log."""

from __future__ import annotations

import json
import random
import re
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psycopg
from psycopg.rows import dict_row

from .conftest import SECRET, headers
from .processes import Process, free_port, wait_until

OBJECTS, VERSIONS = 100, 10
CREATED = 1_764_590_000


def _body(obj: int, version: int) -> bytes:
    return json.dumps(
        {
            "id": f"evt_{obj}_{version}",
            "type": "customer.subscription.updated",
            "created": CREATED + 60 * version,
            "data": {"object": {"id": f"sub_{obj}", "object": "subscription", "seq": version}},
        }
    ).encode()


def test_a_thousand_shuffled_updates_over_http_leave_each_subscription_at_its_latest(
    db_url: str, tmp_path: Path
) -> None:
    port = free_port()
    config = tmp_path / "effectgate.toml"
    config.write_text(
        """
[handlers]
modules = ["tests.e2e.ordering_handlers"]

[sources.shop]
scheme = "stripe"
secrets = ["E2E_STRIPE_SECRET"]

[worker]
concurrency = 16
poll_interval = 0.5
"""
    )
    env = {"DATABASE_URL": db_url, "E2E_STRIPE_SECRET": SECRET, "EFFECTGATE_LOG_LEVEL": "INFO"}
    gateway = Process(
        ["serve", "--config", str(config), "--no-migrate", "--port", str(port)], env, tmp_path / "gateway.log"
    )
    processes = [gateway]
    try:
        url = f"http://127.0.0.1:{port}"
        gateway.wait_http(f"{url}/readyz")
        sent = [(o, v) for o in range(OBJECTS) for v in range(VERSIONS)]
        random.Random(2022).shuffle(sent)
        # A client per thread: one pool shared by 32 threads once read a connection another thread had closed
        # (httpx.ReadError, Bad file descriptor, in CI).
        local = threading.local()
        clients: list[httpx.Client] = []

        def post(update: tuple[int, int]) -> tuple[int, str]:
            if not hasattr(local, "client"):
                local.client = httpx.Client(timeout=60)
                clients.append(local.client)
            body = _body(*update)
            answer = local.client.post(f"{url}/webhooks/shop", content=body, headers=headers(body))
            [effect] = answer.json()["effects"]
            return answer.status_code, effect["outcome"]

        try:
            with ThreadPoolExecutor(max_workers=32) as pool:
                answers = list(pool.map(post, sent))
        finally:
            for client in clients:
                client.close()
        claimed = Counter(outcome for _, outcome in answers)
        statuses = Counter(status for status, _ in answers)
        assert set(claimed) <= {"accepted", "superseded"}, claimed
        # Superseded is acknowledged: 200, so the provider stops retrying; accepted is 202.
        assert all(
            (status, outcome) in ((202, "accepted"), (200, "superseded")) for status, outcome in answers
        )

        worker = Process(["worker", "--config", str(config), "--no-migrate"], env, tmp_path / "worker.log")
        processes.append(worker)
        worker.wait_log("worker.started")

        def live_jobs() -> int:
            with psycopg.connect(db_url, row_factory=dict_row) as conn:
                row = conn.execute(
                    "SELECT count(*) AS n FROM jobs WHERE state IN ('pending', 'running')"
                ).fetchone()
            assert row is not None
            return int(row["n"])

        wait_until(lambda: live_jobs() == 0, 120, "every job to end")
        with psycopg.connect(db_url, row_factory=dict_row) as conn:
            jobs = conn.execute(
                "SELECT e.event_id, j.state::text AS state, j.terminal_reason FROM jobs j "
                "JOIN effects e ON e.id = j.effect_id"
            ).fetchall()
            marks = conn.execute("SELECT lock_key, version FROM effect_versions").fetchall()
        ran = [
            (obj, int(version))
            for obj, version in re.findall(r"^ordering\.ran (sub_\d+) (\d+)$", worker.log(), re.M)
        ]
    finally:
        for proc in reversed(processes):
            proc.stop()

    latest = {f"evt_{o}_{VERSIONS - 1}" for o in range(OBJECTS)}
    ended = Counter((j["state"], j["terminal_reason"]) for j in jobs)
    for job in jobs:
        expected = ("succeeded", None) if job["event_id"] in latest else ("cancelled", "superseded")
        assert (job["state"], job["terminal_reason"]) == expected, job
    assert {j["event_id"] for j in jobs} >= latest
    # Every subscription at its highest version, which ran once; nothing ran after a newer version.
    assert {m["lock_key"]: m["version"] for m in marks} == {
        f"subscription:sub_{o}": CREATED + 60 * (VERSIONS - 1) for o in range(OBJECTS)
    }
    assert sorted(ran) == sorted((f"sub_{o}", VERSIONS - 1) for o in range(OBJECTS))
    last: dict[str, int] = {}
    for obj, version in ran:
        assert version > last.get(obj, -1), f"{obj} ran {version} after {last[obj]}"
        last[obj] = version
    superseded = claimed["superseded"] + ended["cancelled", "superseded"]
    assert superseded == OBJECTS * (VERSIONS - 1)
    print(
        f"\nover HTTP: {len(sent)} deliveries of {OBJECTS} subscriptions, answers {dict(statuses)}, "
        f"claim outcomes {dict(claimed)}; jobs {dict(ended)}; superseded in all {superseded}; "
        f"handler runs {len(ran)}, none after a newer version"
    )

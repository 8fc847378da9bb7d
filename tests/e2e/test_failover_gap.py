"""An asynchronous standby promoted after it fell behind loses claims the gateway already answered 2xx for; the
gateway that answered them sees the timeline change and names each one (issue 42, "detect the loss").

A real primary and streaming standby (tests/bench/failover.py's ``Cluster``, asynchronous), a real ``serve`` on
the multi-host URL. Deliveries answered while the standby streams are kept; then the standby is cut off
(``detach_standby``: what a standby seconds behind amounts to), more deliveries are answered 2xx by the
primary alone, the primary is SIGKILLed and the standby promoted. The next deliveries reach the new primary,
and the gateway must log ``ledger.timeline_changed`` and ``ledger.acknowledged_lost`` naming exactly the
deliveries answered after the cut, and count them on ``/metrics``. Re-sending the named events (what a
provider does when asked) claims them anew, and the gap is closed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.bench.failover import Cluster
from tests.e2e.conftest import SECRET, event, headers
from tests.e2e.processes import Process, free_port

CONFIG = """
[handlers]
modules = ["tests.bench.failover_handlers"]

[sources.shop]
scheme = "stripe"
secrets = ["GAP_STRIPE_SECRET"]

[gateway.penalty_box]
replays = 0

[gateway]
run_reconciler = false
"""


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    # Not under tmp_path: pytest's base directory is private to this user, and Postgres runs as another.
    root = Path(tempfile.mkdtemp(prefix="effectgate-gap-"))
    os.chmod(root, 0o755)
    (root / "pg").mkdir()
    c = Cluster(root / "pg", synchronous=False)
    try:
        c.start()
        yield c
    finally:
        c.stop()
        shutil.rmtree(root, ignore_errors=True)


def deliver(client: httpx.Client, url: str, n: int) -> int:
    body = event(str(500_000 + n), f"evt_gap_{n}")
    return client.post(url, content=body, headers=headers(body)).status_code


def records(gateway: Process, name: str) -> list[dict[str, Any]]:
    found = []
    for line in gateway.log().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("event") == name:
            found.append(record)
    return found


def test_acknowledged_claims_a_failover_lost_are_named(cluster: Cluster, tmp_path: Path) -> None:
    config = tmp_path / "effectgate.toml"
    config.write_text(CONFIG)
    port = free_port()
    env = {"DATABASE_URL": cluster.multi_host_url(), "GAP_STRIPE_SECRET": SECRET}
    migrate = subprocess.run(
        [sys.executable, "-m", "effectgate.gateway.cli", "migrate"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert migrate.returncode == 0, migrate.stderr
    gateway = Process(
        ["serve", "--config", str(config), "--no-migrate", "--port", str(port)], env, tmp_path / "gateway.log"
    )
    url = f"http://127.0.0.1:{port}/webhooks/shop"
    try:
        gateway.wait_http(f"http://127.0.0.1:{port}/healthz")
        with httpx.Client(timeout=10) as client:
            kept, lost = range(1, 6), range(6, 13)
            for n in kept:
                assert deliver(client, url, n) == 202
            # Every kept claim on the standby before the cut: then only what follows is the standby's to lack.
            with psycopg.connect(cluster.url(0, "postgres"), autocommit=True) as conn:
                deadline = time.monotonic() + 30
                while conn.execute(
                    "SELECT bool_and(replay_lsn >= pg_current_wal_lsn()) FROM pg_stat_replication"
                ).fetchone() != (True,):
                    assert time.monotonic() < deadline, "the standby did not catch up"
                    time.sleep(0.05)
            cluster.detach_standby()
            for n in lost:
                assert deliver(client, url, n) == 202  # answered by the primary alone
            cluster.kill_primary()
            cluster.promote()
            # The next deliveries find the new primary (503 until the pool reconnects).
            deadline = time.monotonic() + 60
            n = 100
            while deliver(client, url, n) != 202:
                assert time.monotonic() < deadline, "no 202 within 60 s of the promotion"
                n += 1
                time.sleep(0.2)
            gateway.wait_log('"ledger.acknowledged_lost"', timeout=60)
            changed = records(gateway, "ledger.timeline_changed")
            assert [(r["timeline_before"], r["timeline_after"]) for r in changed] == [(1, 2)]
            [report] = records(gateway, "ledger.acknowledged_lost")
            assert report["lost"] == len(lost)
            assert report["checked"] == len(kept) + len(lost)
            assert sorted(a["event_id"] for a in report["named"]) == sorted(f"evt_gap_{n}" for n in lost)
            assert {a["source"] for a in report["named"]} == {"shop"}
            page = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
            assert f"effectgate_acknowledged_lost_total {float(len(lost))}" in page
            assert "effectgate_ledger_timeline_changes_total 1.0" in page

            # What the operator does with the report: the provider re-sends each named event, which the new
            # primary claims as new, and the ledger holds every claim that was ever acknowledged again.
            for a in report["named"]:
                assert deliver(client, url, int(a["event_id"].removeprefix("evt_gap_"))) == 202
        with psycopg.connect(cluster.url(1)) as conn:
            conn.execute("SET search_path = effectgate")
            held = {r[0] for r in conn.execute("SELECT effect_key FROM effects").fetchall()}
        assert {f"order-paid:{500_000 + n}" for n in [*kept, *lost]} <= held
    finally:
        gateway.stop()

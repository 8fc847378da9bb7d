"""Stopping a real ``effectgate worker`` with signals: the first says what is draining and until when, a
second hands the running jobs back at once, fenced, for another worker to take; once drained, the worker
closes the provider SDK clients its handlers built."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from psycopg.rows import dict_row

from effectgate.ledger import db
from effectgate.ledger.claims import Delivery, EffectRequest, claim_delivery
from effectgate.ledger.fingerprints import fingerprint

from .fake_servers import serving
from .processes import free_port, wait_until
from .user_cli import cli, wait_log

STUCK_HANDLERS = """\
import asyncio
import os
from pathlib import Path

from effectgate import effect


@effect(source="shop", events=["order.paid"], name="stop.stuck", orphan_policy="redrive", lease_ttl=600)
async def stuck(ctx, ev):
    # Says it is running, then never asks should_yield() and never returns: only a stop can end it.
    with Path(os.environ["STOP_STARTED_MARKER"]).open("a") as f:
        f.write(f"{ctx.job_id}\\n")
    await asyncio.Event().wait()
"""


def _project(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "stop_effects.py").write_text(STUCK_HANDLERS)
    (root / "effectgate.toml").write_text(
        '[handlers]\nmodules = ["stop_effects"]\n\n'
        '[sources.shop]\nscheme = "stripe"\nsecrets = ["STARTUP_SECRET"]\n\n'
        # A drain that would outlast the test by far: only the second signal can end it in time.
        "[worker]\npoll_interval = 0.5\ndrain_timeout = 3600\n\n[reconciler]\ntick = 3600\n"
    )
    return root


async def _claim(url: str, n: int, kind: str = "stop.stuck") -> list[int]:
    ids = []
    conn = await db.connect(url)
    async with conn:
        for _ in range(n):
            key = f"order:{uuid.uuid4().hex[:8]}"
            payload = {"id": key}
            delivery = Delivery(
                uuid.uuid4().hex, "default", "shop", f"evt-{key}", "order.paid", payload, fingerprint(payload)
            )
            [outcome] = await claim_delivery(conn, delivery, [EffectRequest(key, kind, 3, "redrive")])
            ids.append(outcome.job_id)  # type: ignore[union-attr]
    return sorted(ids)


def _lines(log: Path, event: str) -> list[dict[str, Any]]:
    found = []
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            entry = json.loads(line)
            if entry.get("event") == event:
                found.append(entry)
    return found


def test_the_worker_runs_on_uvloop_and_one_signal_stops_it_idle(db_url: str, tmp_path: Path) -> None:
    """uvloop is a dependency wherever it has a wheel, and the worker's loop is mostly scheduling: tasks,
    futures and socket readiness (docs/performance.md, "What a real worker's drain costs"). On it, SIGTERM still
    drains."""
    project = _project(tmp_path / "project")
    log = tmp_path / "worker.log"
    proc = cli(["worker", "--config", "effectgate.toml", "--no-migrate"], log, project, DATABASE_URL=db_url)
    try:
        wait_log(proc, log, "worker.started")
        [started] = _lines(log, "worker.started")
        assert started["event_loop"] == "uvloop"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        assert _lines(log, "worker.stopped")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_second_signal_hands_the_running_jobs_back_now_fenced(
    sig: signal.Signals, db_url: str, tmp_path: Path
) -> None:
    project = _project(tmp_path / "project")
    marker = tmp_path / "started"
    log = tmp_path / "worker.log"
    proc = cli(
        ["worker", "--config", "effectgate.toml", "--no-migrate"],
        log,
        project,
        DATABASE_URL=db_url,
        STOP_STARTED_MARKER=str(marker),
    )
    try:
        wait_log(proc, log, "worker.started")
        job_ids = asyncio.run(_claim(db_url, 2))
        wait_until(
            lambda: marker.exists() and len(marker.read_text().split()) == 2, 60, "both jobs to be running"
        )
        proc.send_signal(sig)
        wait_log(proc, log, "worker.draining")
        [draining] = _lines(log, "worker.draining")
        assert (draining["jobs"], draining["kinds"], draining["job_ids"]) == (2, {"stop.stuck": 2}, job_ids)
        assert draining["drain_timeout"] == 3600 and draining["deadline"]
        assert draining["level"] == "info"
        proc.send_signal(sig)
        assert proc.wait(timeout=120) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    [now] = _lines(log, "worker.stopping_now")
    assert now["job_ids"] == job_ids and now["level"] == "warning"
    [abandoned] = _lines(log, "worker.leases_abandoned")
    assert abandoned["job_ids"] == job_ids
    assert "Traceback" not in log.read_text()
    with psycopg.connect(db_url, row_factory=dict_row) as conn:
        rows = conn.execute(
            "SELECT id, state::text AS state, lease_expires_at <= now() AS expired FROM jobs ORDER BY id"
        ).fetchall()
    # Still the stopped worker's (nothing half-written, no state changed behind the reconciler's back), but
    # expired already: the next reconciler pass of any process hands them on, not the lease's 10 minutes.
    assert [(r["id"], r["state"], r["expired"]) for r in rows] == [(j, "running", True) for j in job_ids]
    # Another worker takes them: its start-up reconciler pass redrives them and it runs them again.
    marker.unlink()
    again = cli(
        ["worker", "--config", "effectgate.toml", "--no-migrate"],
        tmp_path / "again.log",
        project,
        DATABASE_URL=db_url,
        STOP_STARTED_MARKER=str(marker),
    )
    try:
        wait_until(
            lambda: marker.exists() and sorted(map(int, marker.read_text().split())) == job_ids,
            120,
            "another worker to run both jobs again",
        )
    finally:
        # One signal at a time: two sent together may arrive as one.
        again.send_signal(signal.SIGTERM)
        wait_log(again, tmp_path / "again.log", "worker.draining")
        again.send_signal(signal.SIGTERM)
        assert again.wait(timeout=120) == 0


def test_under_up_one_ctrl_c_drains_and_a_second_hands_back_now(db_url: str, tmp_path: Path) -> None:
    project = _project(tmp_path / "project")
    marker = tmp_path / "started"
    log = tmp_path / "up.log"
    base = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env = {**base, "DATABASE_URL": db_url, "STARTUP_SECRET": "whsec_x", "STOP_STARTED_MARKER": str(marker)}
    command = [sys.executable, "-m", "effectgate.gateway.cli", "up", "--config", "effectgate.toml"]
    with log.open("wb") as out:
        # A session of its own, as a terminal gives: Ctrl-C is a SIGINT to every process of the group.
        proc = subprocess.Popen(
            [*command, "--port", str(free_port())],
            cwd=project,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_log(proc, log, "worker.started")
        job_ids = asyncio.run(_claim(db_url, 1))
        wait_until(lambda: marker.exists() and marker.read_text().split() != [], 60, "the job to be running")
        os.killpg(proc.pid, signal.SIGINT)
        wait_log(proc, log, "effectgate: stopping: the worker drains for up to 3600 s")
        wait_log(proc, log, "worker.draining")
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=120) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    [draining] = _lines(log, "worker.draining")
    assert draining["job_ids"] == job_ids
    assert len(_lines(log, "worker.stopping_now")) == 1
    # The stop-now came from the second Ctrl-C, passed on by the supervisor after it said so, not from the
    # first one reaching the worker twice (from the terminal, and passed on): all write to one file, in order.
    text = log.read_text()
    assert text.index("effectgate: stopping now") < text.index('"worker.stopping_now"')
    assert _lines(log, "worker.leases_abandoned")[0]["job_ids"] == job_ids


STRIPE_HANDLERS = """\
import atexit
import json
import os
from pathlib import Path

from effectgate import effect
from effectgate.handlers.providers import stripe as stripe_provider

REPORT = Path(os.environ["STOP_CLIENTS_REPORT"])


@atexit.register
def _report_clients_left():
    # After asyncio.run has returned: the SDK clients the process still tracks as open.
    with REPORT.open("a") as f:
        f.write(json.dumps({"at_exit": len(stripe_provider._HTTP)}) + "\\n")


@effect(source="shop", events=["order.paid"], name="stop.stripe_capture", orphan_policy="redrive")
async def capture(ctx, ev):
    captured = await stripe_provider.stripe_steps(ctx).capture(ctx, "pi_stop_1")
    with REPORT.open("a") as f:
        f.write(json.dumps({"captured": captured["status"], "open": len(stripe_provider._HTTP)}) + "\\n")
"""


def test_a_stopped_worker_closes_the_stripe_sdk_clients_its_handlers_built(
    db_url: str, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """``providers.stripe.close_clients()`` runs once the worker has drained: a process that ran a job
    through ``stripe_steps`` ends with no SDK client left open (their pooled connections would otherwise
    be dropped by the exit, not closed)."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "stop_effects.py").write_text(STRIPE_HANDLERS)
    report = tmp_path / "clients.jsonl"
    log = tmp_path / "worker.log"
    with serving("providers", tmp_path_factory.mktemp("fake_stripe")) as fake_url:
        (project / "effectgate.toml").write_text(
            '[handlers]\nmodules = ["stop_effects"]\n\n'
            '[sources.shop]\nscheme = "stripe"\nsecrets = ["STARTUP_SECRET"]\n\n'
            f'[downstream.stripe]\nbase_url = "{fake_url}"\napi_key_env = "STOP_STRIPE_KEY"\n\n'
            "[worker]\npoll_interval = 0.5\n\n[reconciler]\ntick = 3600\n"
        )
        proc = cli(
            ["worker", "--config", "effectgate.toml", "--no-migrate"],
            log,
            project,
            DATABASE_URL=db_url,
            STOP_CLIENTS_REPORT=str(report),
            STOP_STRIPE_KEY="sk_test_stop",
        )
        try:
            wait_log(proc, log, "worker.started")
            asyncio.run(_claim(db_url, 1, kind="stop.stripe_capture"))
            wait_until(lambda: report.exists() and "captured" in report.read_text(), 60, "the capture")
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=120) == 0, log.read_text()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        captures = httpx.get(f"{fake_url}/_fake/stats", timeout=10).json()["captures"]
    lines = [json.loads(line) for line in report.read_text().splitlines()]
    assert lines == [{"captured": "succeeded", "open": 1}, {"at_exit": 0}], log.read_text()
    assert captures == 1
    assert "Traceback" not in log.read_text()

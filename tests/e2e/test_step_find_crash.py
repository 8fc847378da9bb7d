"""A worker SIGKILLed after its create call reached an API **without** idempotency keys, before the step's
record committed (issue 19). With ``find=`` the next worker finds the label and makes none: one label.
Without it the window is real: the next worker creates again, and there are two."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from psycopg.rows import dict_row

from effectgate.handlers.idempotency import idempotency_key
from tests.integration.jobs_and_workers import claim, connected

from .keyless_api import KeylessApi, serve
from .processes import Process, wait_until

API_KEY = "labels-key-0123456789"


@dataclass
class Setup:
    db_url: str
    api_url: str
    api: KeylessApi
    tmp: Path
    config: Path
    processes: list[Process]

    def worker(self, name: str, **env: str) -> Process:
        proc = Process(
            ["worker", "--config", str(self.config), "--no-migrate"],
            {"DATABASE_URL": self.db_url, "E2E_SHOP_SECRET": "whsec_keyless_0123456789", **env},
            self.tmp / f"{name}.log",
        )
        self.processes.append(proc)
        proc.wait_log("worker.started")
        return proc

    def hold(self, hold: bool) -> None:
        httpx.post(f"{self.api_url}/_fake/hold", json={"hold": hold}, timeout=5).raise_for_status()

    def labels(self) -> list[dict[str, Any]]:
        answer: list[dict[str, Any]] = httpx.get(f"{self.api_url}/_fake/labels", timeout=5).json()["labels"]
        return answer

    def job(self, job_id: int) -> dict[str, Any]:
        with psycopg.connect(self.db_url, row_factory=dict_row) as conn:
            row = conn.execute("SELECT state::text AS state FROM jobs WHERE id = %s", (job_id,)).fetchone()
            assert row is not None
            return row

    def steps(self) -> list[dict[str, Any]]:
        with psycopg.connect(self.db_url, row_factory=dict_row) as conn:
            return conn.execute("SELECT name, status, result FROM steps").fetchall()


@pytest.fixture
def setup(db_url: str, tmp_path: Path) -> Iterator[Setup]:
    api = KeylessApi(api_key=API_KEY)
    (tmp_path / "labels.key").write_text(API_KEY + "\n")
    with serve(api) as api_url:
        config = tmp_path / "effectgate.toml"
        config.write_text(
            f"""
[handlers]
modules = ["tests.e2e.keyless_handlers"]

[sources.shop]
scheme = "stripe"
secrets = ["E2E_SHOP_SECRET"]

[worker]
poll_interval = 0.2
backoff_base = 0.05
backoff_cap = 0.2

[reconciler]
tick = 0.3

# An API that takes no idempotency key: none is sent, and its creating step pairs with find=.
[downstream.labels]
base_url = "{api_url}"
auth_scheme = "X-Api-Key"
api_key_file = "labels.key"
idempotency_header = false
timeout = 60
"""
        )
        s = Setup(db_url, api_url, api, tmp_path, config, [])
        try:
            yield s
        finally:
            s.hold(False)
            for proc in s.processes:
                proc.stop()


def crash_then_rescue(setup: Setup, **env: str) -> int:
    """Claim one label job; SIGKILL the first worker while its create waits at the fake; a second one ends it."""

    async def claim_one() -> int:
        async with connected(setup.db_url) as conn:
            return await claim(conn, "label:1001", kind="e2e.label", payload={"order": "1001"})

    job_id = asyncio.run(claim_one())
    setup.hold(True)
    doomed = setup.worker("doomed", E2E_LEASE_TTL="1.5", **env)
    # The label exists at the API and its answer is held: the step cannot have been recorded.
    wait_until(lambda: len(setup.labels()) == 1, 30, "the create to reach the API")
    doomed.popen.send_signal(signal.SIGKILL)
    doomed.popen.wait()
    assert doomed.popen.returncode == -signal.SIGKILL
    assert setup.job(job_id)["state"] == "running"  # held by a dead process
    setup.hold(False)

    setup.worker("rescuer", E2E_LEASE_TTL="1.5", **env)
    wait_until(lambda: setup.job(job_id)["state"] == "succeeded", 60, "the rescued job to succeed")
    return job_id


def test_a_worker_killed_after_a_keyless_create_reached_the_api_makes_one_label_with_find(
    setup: Setup,
) -> None:
    crash_then_rescue(setup)
    key = idempotency_key("default", "label:1001", "label")
    assert setup.labels() == [{"id": "lbl_1", "reference": key, "order": "1001"}]
    # Configured with idempotency_header = false: no key header went out, only the key in the body.
    assert setup.api.create_headers and not any("idempotency-key" in h for h in setup.api.create_headers)
    assert all("x-api-key" in h for h in setup.api.create_headers)
    # What the step recorded is the label the first worker made, found by its reference.
    assert setup.steps() == [{"name": "label", "status": "succeeded", "result": setup.labels()[0]}]


def test_without_find_the_same_crash_makes_a_second_label(setup: Setup) -> None:
    crash_then_rescue(setup, E2E_FIND="0")
    labels = setup.labels()
    assert [label["id"] for label in labels] == ["lbl_1", "lbl_2"]
    assert labels[0]["reference"] == labels[1]["reference"]


def test_a_worker_whose_handler_asks_for_an_unconfigured_downstream_is_refused_at_start(
    setup: Setup,
) -> None:
    text = setup.config.read_text()
    setup.config.write_text(text[: text.index("# An API that takes no idempotency key")])
    proc = Process(
        ["worker", "--config", str(setup.config), "--no-migrate"],
        {"DATABASE_URL": setup.db_url, "E2E_SHOP_SECRET": "whsec_keyless_0123456789"},
        setup.tmp / "refused.log",
    )
    setup.processes.append(proc)
    assert proc.popen.wait(timeout=60) == 2
    handlers = Path(__file__).with_name("keyless_handlers.py")
    line = next(
        n
        for n, text in enumerate(handlers.read_text().splitlines(), 1)
        if 'labels = ctx.downstream("labels")' in text
    )
    assert (
        f"{handlers}:{line}: effect 'e2e.label' asks for ctx.downstream('labels'), which is not configured: "
        "add [downstream.labels] (configured: none)"
    ) in proc.log()

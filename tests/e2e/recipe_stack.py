"""What every recipe test (tests/e2e/test_recipes_*.py) runs against: the fake providers, a real gateway and a
real worker on one configuration, and a job's state read back from the ledger by its effect key."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from .processes import Process, wait_until


@contextmanager
def recipe_stack(
    config: Path, env: dict[str, str], tmp_path: Path, gateway_port: int, fake_port: int
) -> Iterator[None]:
    """``effectgate fake-providers`` on ``fake_port``, ``serve`` on ``gateway_port`` and a ``worker``, each
    waited for until it answers (the worker until it logs ``worker.started``); stopped last to first."""
    fake = Process(["fake-providers", "--port", str(fake_port)], env, tmp_path / "fake.log")
    gateway = Process(
        ["serve", "--config", str(config), "--no-migrate", "--port", str(gateway_port)],
        env,
        tmp_path / "gateway.log",
    )
    processes = [fake, gateway]
    try:
        fake.wait_http(f"http://127.0.0.1:{fake_port}/_fake/stats")
        gateway.wait_http(f"http://127.0.0.1:{gateway_port}/readyz")
        worker = Process(["worker", "--config", str(config), "--no-migrate"], env, tmp_path / "worker.log")
        processes.append(worker)
        worker.wait_log("worker.started")
        yield
    finally:
        for proc in reversed(processes):
            proc.stop()


class JobStates:
    """A recipe shop's view of its ledger: the state of the job behind an effect key."""

    db_url: str

    def state(self, effect_key: str) -> str | None:
        with psycopg.connect(self.db_url) as conn:
            row = conn.execute(
                "SELECT j.state::text FROM jobs j JOIN effects e ON e.id = j.effect_id WHERE e.effect_key = %s",
                (effect_key,),
            ).fetchone()
        return None if row is None else str(row[0])

    def wait_state(self, effect_key: str, state: str) -> None:
        wait_until(lambda: self.state(effect_key) == state, 60, f"{effect_key} to be {state}")

"""The effectgate command as a user runs it: the quick start, and clear errors for mistakes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from .processes import ROOT, free_port, wait_until


def run(*args: str, env: dict[str, str] | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "effectgate.gateway.cli", *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_missing_configuration_file_is_exit_2_with_the_path_and_no_traceback(tmp_path: Path) -> None:
    result = run("serve", "--config", str(tmp_path / "nope.toml"))
    assert result.returncode == 2
    assert f"{tmp_path / 'nope.toml'}: configuration file not found" in result.stderr
    assert "Traceback" not in result.stderr


def test_an_invalid_configuration_names_the_key(tmp_path: Path) -> None:
    config = tmp_path / "eg.toml"
    config.write_text('[sources.stripe]\nscheme = "stripe"\nsecrets = ["EG_TEST_UNSET_SECRET"]\n')
    result = run("worker", "--config", str(config))
    assert result.returncode == 2
    assert "sources.stripe.secrets: environment variable EG_TEST_UNSET_SECRET is not set" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_bad_flag_names_the_flag() -> None:
    result = run("worker", "--concurrency", "0")
    assert result.returncode == 2
    assert "--concurrency: must be >= 1" in result.stderr


def test_an_unreachable_database_is_exit_1_with_a_message() -> None:
    result = run("migrate", env={"DATABASE_URL": "postgresql://nobody@127.0.0.1:1/x?connect_timeout=2"})
    assert result.returncode == 1
    assert "ledger database unavailable" in result.stderr
    assert "Traceback" not in result.stderr


def test_migrate_then_up_to_date(empty_db_url: str) -> None:
    first = run("migrate", env={"DATABASE_URL": empty_db_url})
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("applied: 0001_initial.sql")
    again = run("migrate", env={"DATABASE_URL": empty_db_url})
    assert (again.returncode, again.stdout.strip()) == (0, "up to date")


def test_reconcile_prints_what_it_repaired(db_url: str, tmp_path: Path) -> None:
    config = tmp_path / "eg.toml"
    config.write_text('[sources.s]\nscheme = "stripe"\nsecrets = ["EG_S"]\n')
    result = run("reconcile", "--config", str(config), env={"DATABASE_URL": db_url, "EG_S": "whsec_x"})
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["redriven"] == []


def test_the_quick_start_up_command_runs_the_demo_on_an_embedded_postgres(tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "EFFECTGATE_HOME": str(tmp_path / "home")}
    env.pop("DATABASE_URL", None)
    log = (tmp_path / "up.log").open("w")
    up = subprocess.Popen(
        [sys.executable, "-m", "effectgate.gateway.cli", "up", "--port", str(port)],
        cwd=tmp_path,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: "effectgate is up" in (tmp_path / "up.log").read_text(), 90, "effectgate up")
        assert "demo-delivery" in (tmp_path / "up.log").read_text()
        first = run("demo-delivery", "--url", base, "--order", "77")
        second = run("demo-delivery", "--url", base, "--order", "77")
        assert first.stdout.startswith("202 "), first.stdout + first.stderr
        assert second.stdout.startswith("200 ") and '"duplicate"' in second.stdout

        def shipped() -> bool:
            stats = httpx.get(f"http://127.0.0.1:{port + 1}/_fake/stats", timeout=5).json()
            return bool(stats["shipments"] == 1)

        wait_until(shipped, 30, "the demo order to ship")
        stats = httpx.get(f"http://127.0.0.1:{port + 1}/_fake/stats", timeout=5).json()
        assert (stats["captures"], stats["shipments"]) == (1, 1)

        # `send` with no configuration anywhere finds the demo `up` wrote, with its secrets.
        home = {"EFFECTGATE_HOME": str(tmp_path / "home")}
        sends = [
            run("send", "--source", "github", "--example", "--event-id", "gh-up-1", env=home, cwd=tmp_path)
        ]
        sends.append(
            run("send", "--source", "github", "--example", "--event-id", "gh-up-1", env=home, cwd=tmp_path)
        )
        assert [r.stdout[:4] for r in sends] == ["202 ", "200 "], [r.stdout + r.stderr for r in sends]
        assert "using the demo configuration of `effectgate up`" in sends[0].stderr
    finally:
        up.send_signal(signal.SIGTERM)
        code = up.wait(timeout=60)
        log.close()
    assert code == 0, (tmp_path / "up.log").read_text()
    assert (tmp_path / "home" / "pgdata" / "PG_VERSION").exists()

"""The effectgate command as a user runs it: the quick start, and clear errors for mistakes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from .processes import ROOT, free_port, run, wait_until

# serve and worker refuse to start without DATABASE_URL; these tests are about the configuration, which
# is checked before any connection is tried.
UNUSED_DATABASE_URL = "postgresql://nobody@127.0.0.1:1/unused"


def test_a_missing_configuration_file_is_exit_2_with_the_path_and_no_traceback(tmp_path: Path) -> None:
    result = run("serve", "--config", str(tmp_path / "nope.toml"), env={"DATABASE_URL": UNUSED_DATABASE_URL})
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"effectgate: {tmp_path / 'nope.toml'}: configuration file not found (pass --config or set EFFECTGATE_CONFIG)"
    ]
    assert "Traceback" not in result.stderr


def test_an_invalid_configuration_names_the_key(tmp_path: Path) -> None:
    config = tmp_path / "eg.toml"
    config.write_text('[sources.stripe]\nscheme = "stripe"\nsecrets = ["EG_TEST_UNSET_SECRET"]\n')
    # A webhook secret is the gateway's to hold: serve is stopped by its absence (a worker is not).
    result = run("serve", "--config", str(config), env={"DATABASE_URL": UNUSED_DATABASE_URL})
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"effectgate: {config}: sources.stripe.secrets: environment variable EG_TEST_UNSET_SECRET is not set "
        "(or empty), and neither EG_TEST_UNSET_SECRET_FILE nor $CREDENTIALS_DIRECTORY/EG_TEST_UNSET_SECRET "
        "names a file holding it"
    ]
    assert "Traceback" not in result.stderr


def test_a_bad_flag_names_the_flag() -> None:
    result = run("worker", "--concurrency", "0")
    assert result.returncode == 2
    assert "--concurrency: must be >= 1" in result.stderr


def test_an_unreachable_database_is_exit_1_with_a_message_naming_where_and_why() -> None:
    url = "postgresql://nobody:pw-not-shown@127.0.0.1:1/x?connect_timeout=2"
    result = run("migrate", "--startup-wait", "0", env={"DATABASE_URL": url})
    assert result.returncode == 1
    assert (
        "effectgate: cannot connect to Postgres at host 127.0.0.1, port 1, database 'x', user 'nobody': "
        "Connection refused"
    ) in result.stderr
    assert "pw-not-shown" not in result.stderr
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


def test_reconcile_before_migrate_says_to_migrate_without_a_traceback(
    empty_db_url: str, tmp_path: Path
) -> None:
    config = tmp_path / "eg.toml"
    config.write_text('[sources.s]\nscheme = "stripe"\nsecrets = ["EG_S"]\n')
    result = run("reconcile", "--config", str(config), env={"DATABASE_URL": empty_db_url, "EG_S": "whsec_x"})
    assert result.returncode == 1
    assert result.stderr.startswith("effectgate: the ledger lacks migrations 0001_initial.sql")
    assert result.stderr.rstrip().endswith(": run effectgate migrate")
    assert "Traceback" not in result.stderr


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
        # The first start initialises a Postgres cluster (initdb), which under a loaded CI machine has taken
        # over 90 s: the deadline is generous, the wait ends as soon as `up` says so or exits, and a miss
        # shows what `up` printed.
        def is_up() -> bool:
            if up.poll() is not None:
                raise AssertionError(f"up exited with {up.returncode}:\n{(tmp_path / 'up.log').read_text()}")
            return "effectgate is up" in (tmp_path / "up.log").read_text()

        try:
            wait_until(is_up, 300, "effectgate up")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{(tmp_path / 'up.log').read_text()}") from None
        assert "demo-delivery" in (tmp_path / "up.log").read_text()
        first = run("demo-delivery", "--url", base, "--order", "77")
        second = run("demo-delivery", "--url", base, "--order", "77")
        assert first.stdout.startswith("202 "), first.stdout + first.stderr
        assert second.stdout.startswith("200 ") and '"duplicate"' in second.stdout

        # Two events, two jobs (capture on amount_capturable_updated, ship on succeeded), run in either order.
        def captured_and_shipped() -> bool:
            stats = httpx.get(f"http://127.0.0.1:{port + 1}/_fake/stats", timeout=5).json()
            return bool(stats["captures"] >= 1 and stats["shipments"] >= 1)

        wait_until(captured_and_shipped, 60, "the demo order to be captured and shipped")
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


def _closed_reader(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    # `effectgate … | head -0`: the reader is gone before the command writes its first line.
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(
            [sys.executable, "-m", "effectgate.gateway.cli", *args],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), **env},
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write)


def test_a_closed_pipe_ends_a_command_quietly_with_exit_0(db_url: str) -> None:
    for args in (("config", "reference"), ("migrate", "--status"), ("jobs", "list")):
        done = _closed_reader(*args, env={"DATABASE_URL": db_url})
        assert (done.returncode, done.stderr) == (0, ""), (args, done.stderr)

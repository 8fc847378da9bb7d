"""docs/forwarding.md's transcript, run: the configuration and event file are taken from the page, the Node
service and ``effectgate up`` start as written (on free ports instead of 3000 and 8000), and the ``send``,
``curl`` and ``ledger show`` lines run as written; their answers are compared with the ones shown."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from .node_service import install
from .processes import ROOT, free_port, wait_until

DOC = (ROOT / "docs" / "forwarding.md").read_text()
TRANSCRIPT = re.search(r"## 3\. Run it.*?```console\n(.*?)```", DOC, re.S).group(1)  # type: ignore[union-attr]
CONFIG = re.search(r"```toml\n(.*?)```", DOC, re.S).group(1)  # type: ignore[union-attr]


def commands() -> list[str]:
    return [line[2:] for line in TRANSCRIPT.splitlines() if line.startswith("$ ")]


def shown_after(command: str, occurrence: int = 0) -> str:
    lines = TRANSCRIPT.splitlines()
    at = [i for i, line in enumerate(lines) if line == f"$ {command}"][occurrence]
    return lines[at + 1]


def test_the_transcript_runs_as_the_page_says(db_url: str, tmp_path: Path) -> None:
    steps = commands()
    # The start lines are emulated below; if the page changes them, this test must change with it.
    assert steps[:4] == [
        "(cd tests/node_receiver && npm ci)",
        steps[1],
        "WEBHOOK_SECRET=$ORDER_SERVICE_SECRET PORT=3000 node tests/node_receiver/server.js &",
        "effectgate up --config effectgate.toml &",
    ]
    exports = dict(pair.split("=", 1) for pair in steps[1].removeprefix("export ").split())
    event_file = re.search(r"cat > paid.json <<'JSON'\n(.*?)\nJSON\n", TRANSCRIPT, re.S)
    assert event_file is not None
    node_port, port = free_port(), free_port()
    project = tmp_path / "project"
    project.mkdir()
    (project / "effectgate.toml").write_text(
        CONFIG.replace("127.0.0.1:3000", f"127.0.0.1:{node_port}") + f"\n[gateway]\nport = {port}\n"
    )
    (project / "paid.json").write_text(event_file.group(1) + "\n")

    env = {**os.environ, **exports, "DATABASE_URL": db_url, "EFFECTGATE_HOME": str(tmp_path / "home")}
    env.pop("PYTHONPATH", None)
    node_log = (tmp_path / "node.log").open("wb")
    node = subprocess.Popen(
        ["node", "server.js"],
        cwd=install(),
        env={**env, "WEBHOOK_SECRET": exports["ORDER_SERVICE_SECRET"], "PORT": str(node_port)},
        stdout=node_log,
        stderr=subprocess.STDOUT,
    )
    up_log = (tmp_path / "up.log").open("wb")
    up = subprocess.Popen(
        [sys.executable, "-m", "effectgate.gateway.cli", "up", "--config", "effectgate.toml"],
        cwd=project,
        env=env,
        stdout=up_log,
        stderr=subprocess.STDOUT,
    )
    try:

        def ready() -> bool:
            assert up.poll() is None, (tmp_path / "up.log").read_text()
            assert node.poll() is None, (tmp_path / "node.log").read_text()
            try:
                return (
                    httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200
                    and httpx.get(f"http://127.0.0.1:{node_port}/stats", timeout=1).status_code == 200
                )
            except httpx.TransportError:
                return False

        wait_until(ready, 60, "effectgate up and the node service")
        sends = [c for c in steps if c.startswith("effectgate send ")]
        assert len(sends) == 2
        for n, command in enumerate(sends):
            args = shlex.split(command)[1:]
            done = subprocess.run(
                [sys.executable, "-m", "effectgate.gateway.cli", *args],
                cwd=project,
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            expected = shown_after(command, sends[:n].count(command))
            status, _, body = done.stdout.strip().partition(" ")
            assert status == expected[:3], done.stdout + done.stderr
            for fragment in re.split(r'"request_id":"[^"]*",?', expected[4:]):
                assert fragment in body, (fragment, body)

        curl = next(c for c in steps if c.startswith("curl "))
        stats_url = shlex.split(curl)[-1].replace("127.0.0.1:3000", f"127.0.0.1:{node_port}")
        shown_stats = json.loads(shown_after(curl))

        def acted() -> bool:
            return bool(httpx.get(stats_url, timeout=5).json()["acted"])

        wait_until(acted, 30, "the service to act")
        stats = httpx.get(stats_url, timeout=5).json()
        # The same counts as the page shows, under the real idempotency key.
        assert sorted(stats["seen"].values()) == sorted(shown_stats["seen"].values())
        assert sorted(stats["acted"].values()) == sorted(shown_stats["acted"].values())
        assert (stats["rejected_signatures"], stats["held"]) == (0, [])
        assert all(key.startswith("eg_") for key in stats["seen"])

        show = next(c for c in steps if c.startswith("effectgate ledger show "))
        wait_until(
            lambda: "succeeded" in _cli(shlex.split(show)[1:], project, env).stdout, 30, "the job to succeed"
        )
        shown = _cli(shlex.split(show)[1:], project, env)
        assert shown.returncode == 0 and "order-paid:1001" in shown.stdout, shown.stdout + shown.stderr
        assert "forward" in shown.stdout and "1001" in shown.stdout.split("steps", 1)[1], shown.stdout
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(timeout=60)
        node.terminate()
        node.wait(timeout=10)
        up_log.close()
        node_log.close()


def _cli(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "effectgate.gateway.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )

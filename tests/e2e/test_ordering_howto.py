"""docs/ordering.md, run as written: its files and events are taken from the document itself.

A project directory gets the how-to's handler module and configuration and ``effectgate up`` runs there; the
document's own shell function writes the three events, and the four ``effectgate send`` lines answer what the
document shows (accepted, superseded, duplicate, accepted) over HTTP. The handler never prints the
superseded status, prints the newest one last, and ``ledger delivery-outcomes`` counts one superseded.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from .processes import ROOT, free_port, wait_until

HOWTO = (ROOT / "docs" / "ordering.md").read_text()
TRY = HOWTO[HOWTO.index("## Try it") : HOWTO.index("## Choosing the version")]


def _heredoc(name: str, marker: str) -> str:
    match = re.search(rf"cat > {re.escape(name)} <<'{marker}'\n(.*?)\n{marker}\n", TRY, re.S)
    assert match, f"the how-to no longer writes {name}"
    return match.group(1) + "\n"


def _cli(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "effectgate.gateway.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_ordering_howto_runs_as_written(db_url: str, tmp_path: Path) -> None:
    project = tmp_path / "subscriptions"
    project.mkdir()
    (project / "effects.py").write_text(_heredoc("effects.py", "PY"))
    (project / "effectgate.toml").write_text(_heredoc("effectgate.toml", "TOML"))
    events = re.search(r"```sh\n(event\(\) \{.*?)```", TRY, re.S)
    assert events, "the how-to no longer writes its events with event()"
    subprocess.run(["bash", "-c", events.group(1)], cwd=project, check=True)
    exports = re.search(r"^export (.+)$", TRY, re.M)
    assert exports

    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(dict(pair.split("=", 1) for pair in exports.group(1).split()))
    env.update(DATABASE_URL=db_url, EFFECTGATE_HOME=str(tmp_path / "home"))
    log = (tmp_path / "up.log").open("wb")
    up = subprocess.Popen(
        [sys.executable, "-m", "effectgate.gateway.cli", "up", "--port", str(port)],
        cwd=project,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:

        def ready() -> bool:
            assert up.poll() is None, (tmp_path / "up.log").read_text()
            try:
                return httpx.get(f"{url}/readyz", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        wait_until(ready, 60, "effectgate up")
        answers = []
        for line in re.findall(r"^\$ (effectgate send .+?)(?:\s+#.*)?$", TRY, re.M):
            done = _cli(*line.split()[1:], "--url", url, cwd=project, env=env)
            answers.append(done.stdout.strip())
        shown = re.findall(r"^(\d{3} \{.*\})$", TRY, re.M)
        assert len(answers) == len(shown) == 4
        for got, expected in zip(answers, shown, strict=True):
            status, _, body = got.partition(" ")
            assert status == expected[:3], got
            for fragment in re.split(r'"request_id":"[^"]*",?', expected[4:]):
                assert fragment in body, (fragment, body)

        def printed() -> list[str]:
            return re.findall(r"subscription sub_42 is now (\w+)", (tmp_path / "up.log").read_text())

        wait_until(lambda: "canceled" in printed(), 30, "the newest status to be synced")
        # past_due may have been superseded before it ran (the how-to says so); active never runs.
        assert printed() in (["past_due", "canceled"], ["canceled"]), printed()

        outcomes = _cli("ledger", "delivery-outcomes", "--since", "1h", cwd=project, env=env)
        header, row = outcomes.stdout.strip().splitlines()[-2:]
        shown_header, shown_row = re.search(r"\n(SOURCE .+)\n(stripe .+)\n```", TRY).groups()  # type: ignore[union-attr]
        assert header.split() == shown_header.split()
        assert row.split() == shown_row.split()
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(timeout=60)
        log.close()

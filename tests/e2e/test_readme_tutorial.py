"""The README's tutorial, run as written: its files are taken from the README itself, not copied here.

A new project directory gets the tutorial's handler module and configuration; ``effectgate up`` runs there
with no PYTHONPATH, and the four ``effectgate send`` lines answer what the README shows: accepted,
duplicate, rejected, and a forged signature refused. Then the three reports the tutorial asks for.
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

README = (ROOT / "README.md").read_text()
TUTORIAL = README[README.index("## Tutorial: your first effect") : README.index("## Installing it for real")]


def _heredoc(name: str, marker: str) -> str:
    match = re.search(rf"cat > {re.escape(name)} <<'{marker}'\n(.*?)\n{marker}\n", TUTORIAL, re.S)
    assert match, f"the tutorial no longer writes {name}"
    return match.group(1) + "\n"


def _exports() -> dict[str, str]:
    match = re.search(r"^export (.+)$", TUTORIAL, re.M)
    assert match
    return dict(pair.split("=", 1) for pair in match.group(1).split())


def _cli(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "effectgate.gateway.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_tutorial_runs_as_the_readme_says(db_url: str, tmp_path: Path) -> None:
    project = tmp_path / "shop"
    project.mkdir()
    (project / "effects.py").write_text(_heredoc("effects.py", "PY"))
    (project / "effectgate.toml").write_text(_heredoc("effectgate.toml", "TOML"))
    (project / "paid.json").write_text(_heredoc("paid.json", "JSON"))
    sed = re.search(r"^(sed .+)$", TUTORIAL, re.M)
    assert sed
    subprocess.run(sed.group(1), shell=True, cwd=project, check=True)

    port = free_port()
    # The tutorial's own environment, on a database of this test's own instead of the embedded one; the
    # checkout is importable (an editable install), but the user's project is not on any path.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(_exports(), DATABASE_URL=db_url, EFFECTGATE_HOME=str(tmp_path / "home"))
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
        for line in re.findall(r"^\$ ((?:\S+=\S+ )?effectgate send .+?)(?:\s+#.*)?$", TUTORIAL, re.M):
            words = line.split()
            extra = dict(w.split("=", 1) for w in words if "=" in w and not w.startswith("--"))
            args = [w for w in words[words.index("send") :]] + ["--url", url]
            done = _cli(*args, cwd=project, env={**env, **extra})
            answers.append(done.stdout.strip())
        shown = re.findall(r"^(\d{3} \{.*\})$", TUTORIAL, re.M)
        assert len(answers) == len(shown) == 4
        for got, expected in zip(answers, shown, strict=True):
            status, _, body = got.partition(" ")
            assert status == expected[:3], got
            # Everything the README shows but the request id (elided there) is what came back.
            for fragment in re.split(r'"request_id":"[^"]*",?', expected[4:]):
                assert fragment.replace("…", "") in body, (fragment, body)

        wait_until(lambda: "receipt for pi_1001" in (tmp_path / "up.log").read_text(), 30, "the receipt step")
        assert (tmp_path / "up.log").read_text().count("receipt for pi_1001") == 1

        duplicates = _cli("ledger", "duplicates", "--since", "1h", cwd=project, env=env)
        assert "receipt:1001" in duplicates.stdout and duplicates.returncode == 0

        # Failed signature checks are counted in memory and written every 2 s: wait for the write, not a time.
        def rejects_shown() -> bool:
            text = _cli("ledger", "rejects", "--since", "1h", cwd=project, env=env).stdout
            return "signature_invalid  1" in text

        wait_until(rejects_shown, 30, "the failed signature check in the rejects report")
        rejects = _cli("ledger", "rejects", "--since", "1h", cwd=project, env=env)
        assert "/data/object/amount: 4200 → 4300" in rejects.stdout
        assert "signature_invalid  1" in rejects.stdout
        shown_effect = _cli("ledger", "show", "receipt:1001", cwd=project, env=env)
        assert (
            "job      1 succeeded" in shown_effect.stdout
            and '{"receipt_for":"pi_1001"}' in shown_effect.stdout
        )
        assert "deliveries 2, rejects 1" in shown_effect.stdout
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(timeout=60)
        log.close()

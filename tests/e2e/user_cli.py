"""``effectgate`` started as a user starts it, from a project directory with no PYTHONPATH and no DATABASE_URL unless
given, and a wait for a line in its log that fails at once if the process exits."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from .processes import wait_until

SECRET = "whsec_startup_secret"


def cli(args: list[str], log: Path, cwd: Path, **env: str) -> subprocess.Popen[bytes]:
    """``effectgate ARGS`` as a user runs it: no PYTHONPATH, no DATABASE_URL unless given."""
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DATABASE_URL")}
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "effectgate.gateway.cli", *args],
            cwd=cwd,
            env={**base, "STARTUP_SECRET": SECRET, "EFFECTGATE_LOG_LEVEL": "INFO", **env},
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def wait_log(proc: subprocess.Popen[bytes], log: Path, needle: str, timeout: float = 90) -> None:
    def logged() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"exited with {proc.returncode}:\n{log.read_text()}")
        return needle in log.read_text(errors="replace")

    wait_until(logged, timeout, f"{needle!r} in {log}")

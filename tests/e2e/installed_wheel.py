"""The wheel as a user installs it: built as a release builds it (``build_checkout``, one build at a time across
pytest-xdist's workers) and installed non-editable into a fresh virtual environment (``Installed``; the ``installed``
fixture in tests/e2e/conftest.py makes one per session)."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from .processes import ROOT


@dataclass(frozen=True)
class Installed:
    wheel: Path
    python: Path
    effectgate: Path

    def env(self, **extra: str) -> dict[str, str]:
        # Nothing of the checkout may leak in: no PYTHONPATH, the venv's bin first on PATH.
        env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
        env["PATH"] = f"{self.python.parent}{os.pathsep}{env.get('PATH', '')}"
        env.update(extra)
        return env


def build_checkout(*args: str) -> None:
    """``python -m build`` of the checkout, one build at a time across pytest-xdist's workers: two builds of one
    tree at once share its egg-info and build/ directories (the sdist build failed once in CI while the wheel
    fixture built on another worker). The builder's own output is the failure message."""
    lock = ROOT / "build" / "test-wheel-build.lock"
    lock.parent.mkdir(exist_ok=True)
    with lock.open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        done = subprocess.run(
            [sys.executable, "-m", "build", *args, str(ROOT)], capture_output=True, text=True, check=False
        )
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])

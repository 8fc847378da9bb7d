"""The Node.js receiver of ``tests/node_receiver`` as a process: installed once with ``npm ci`` into
``build/node_receiver`` (the only network use, to the registry), then run on a free loopback port."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx

from .processes import ROOT, STARTUP_SECONDS, wait_until

SOURCE = ROOT / "tests" / "node_receiver"
BUILD = ROOT / "build" / "node_receiver"
FILES = ("package.json", "package-lock.json", "server.js")


def install() -> Path:
    """``npm ci`` into the build directory, again only when the lock file changed."""
    BUILD.mkdir(parents=True, exist_ok=True)
    lock = (SOURCE / "package-lock.json").read_bytes()
    stamp = BUILD / ".installed-lock"
    for name in FILES:
        shutil.copyfile(SOURCE / name, BUILD / name)
    if not stamp.exists() or stamp.read_bytes() != lock:
        subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=BUILD,
            check=True,
            timeout=300,
        )
        stamp.write_bytes(lock)
    return BUILD


class NodeService:
    """``node server.js`` with its output in a log file."""

    def __init__(self, port: int, secret: str, log_path: Path) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        self._log = log_path.open("wb")
        self.popen = subprocess.Popen(
            ["node", "server.js"],
            cwd=install(),
            env={"PATH": _path(), "PORT": str(port), "WEBHOOK_SECRET": secret},
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def wait_ready(self) -> None:
        def up() -> bool:
            if self.popen.poll() is not None:
                raise AssertionError(f"node exited: {self.log_path.read_text()}")
            try:
                return httpx.get(f"{self.url}/stats", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        wait_until(up, STARTUP_SECONDS, "the node service")

    def stats(self) -> dict[str, Any]:
        data: dict[str, Any] = httpx.get(f"{self.url}/stats", timeout=5).json()
        return data

    def release(self) -> None:
        httpx.post(f"{self.url}/release", timeout=5).raise_for_status()

    def stop(self) -> None:
        self.popen.terminate()
        self.popen.wait(timeout=10)
        self._log.close()


def _path() -> str:
    import os

    return os.environ.get("PATH", "/usr/bin:/bin")

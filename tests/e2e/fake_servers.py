"""Run a fake provider app as a real uvicorn process on loopback, for SDKs that need a real server."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from .processes import ROOT, free_port

STARTUP_SECONDS = 30.0


@contextmanager
def serving(module: str, log_dir: Path, *, ready_path: str = "/_fake/stats") -> Iterator[str]:
    """Serve `effectgate.gateway.fakes.<module>.serve` on a free port; yield its base URL."""
    port = free_port()
    log_path = log_dir / f"{module}.log"
    code = f"from effectgate.gateway.fakes.{module} import serve; serve('127.0.0.1', {port})"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-c", code], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_SECONDS
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"{module} exited with {process.returncode}:\n{log_path.read_text()}")
            try:
                if httpx.get(url + ready_path, timeout=1.0).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{module} did not answer within {STARTUP_SECONDS}s:\n{log_path.read_text()}"
                )
            time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)

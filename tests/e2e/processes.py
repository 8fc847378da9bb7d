"""Real effectgate processes for end-to-end tests: started on free loopback ports, stopped afterwards; and one-shot
commands run to completion (``run``, ``run_without_database``)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
STARTUP_SECONDS = 120.0  # a deadline, not a wait: a loaded machine only makes startup slower


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Process:
    """One ``python -m gateway.cli …`` child with its output in a log file."""

    def __init__(self, args: list[str], env: Mapping[str, str], log_path: Path) -> None:
        self.args = args
        self.log_path = log_path
        self._log = log_path.open("wb")
        full_env = {**os.environ, **env, "PYTHONPATH": str(ROOT)}
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "effectgate.gateway.cli", *args],
            cwd=ROOT,
            env=full_env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def wait_http(self, url: str, timeout: float = STARTUP_SECONDS) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise AssertionError(f"{self.args[0]} exited with {self.popen.returncode}:\n{self.log()}")
            try:
                if httpx.get(url, timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"{url} did not answer within {timeout}s:\n{self.log()}")

    def wait_log(self, needle: str, timeout: float = STARTUP_SECONDS) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if needle in self.log():
                return
            if self.popen.poll() is not None:
                raise AssertionError(f"{self.args[0]} exited with {self.popen.returncode}:\n{self.log()}")
            time.sleep(0.05)
        raise AssertionError(f"{needle!r} not logged within {timeout}s:\n{self.log()}")

    def stop(self, timeout: float = 15.0) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        self._log.close()
        return self.popen.returncode


def pump(source: socket.socket, sink: socket.socket) -> None:
    """Copy ``source`` into ``sink`` until either side closes, then shut both down: one direction of a TCP proxy
    the tests cut or switch (tests/e2e/test_worker_healthz_e2e.py, tests/bench/failover.py). A socket the other
    direction already shut down refuses the shutdown (``OSError``), which is the end it was going to."""
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    for sock in (source, sink):
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def wait_until(predicate: Callable[[], bool], timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def run(*args: str, env: dict[str, str] | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """``effectgate ARGS`` as a child process with the test's environment and the tree on PYTHONPATH."""
    return subprocess.run(
        [sys.executable, "-m", "effectgate.gateway.cli", *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


def run_without_database(*args: str, cwd: Path = ROOT, **env: str) -> subprocess.CompletedProcess[str]:
    """``effectgate ARGS`` with no database variable of the test's environment, unless given."""
    base = {
        k: v
        for k, v in os.environ.items()
        if k
        not in (
            "DATABASE_URL",
            "EFFECTGATE_DATABASE_URL",
            "EFFECTGATE_MIGRATION_WAIT",
            "EFFECTGATE_DATABASE__MIGRATION_WAIT",
        )
    }
    return subprocess.run(
        [sys.executable, "-m", "effectgate.gateway.cli", *args],
        cwd=cwd,
        env={**base, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )

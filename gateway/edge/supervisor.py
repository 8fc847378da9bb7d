"""``serve --workers N``: N gateway processes on one port, that count together and die with their parent.

uvicorn's supervisor binds the port once and hands it to N spawned children. Two things it does not do
are done here:

- **Metrics across processes.** The supervisor makes a private directory and names it in
  ``PROMETHEUS_MULTIPROC_DIR`` before any child starts, so every child counts into files there and any
  child's ``/metrics`` sums them all (``gateway.metrics``). A child that exits is marked dead
  (its live gauges dropped; its counts stay, so counters never go backwards) and the directory is
  removed when the supervisor exits. A supervisor killed with SIGKILL cannot remove it: it is left under
  the temporary directory as ``effectgate-metrics-*``, and nothing else reads it.
- **Children die with their parent**, even when the parent is SIGKILLed and never tells them: each child
  asks the Linux kernel for a SIGTERM when its parent dies (``prctl(PR_SET_PDEATHSIG)``), or elsewhere
  watches its parent's pid once a second. Without this, children of a killed supervisor keep the port,
  and a restarted ``serve`` fails with "address already in use". SIGTERM, not SIGKILL: the child drains
  the requests it holds, as on any other stop.

uvicorn does not promise to keep its supervisor class: what this module uses of it is listed in
``uvicorn_private``, with the uvicorn releases it is tested in.
"""

from __future__ import annotations

import ctypes
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from typing import Any

from prometheus_client import multiprocess
from uvicorn import Config

from ..metrics import MULTIPROC_ENV
from .uvicorn_private import Multiprocess

log = logging.getLogger("effectgate.gateway")

#: Set by the supervisor for its children: the pid they must not outlive.
PARENT_ENV = "EFFECTGATE_SERVE_PARENT_PID"
_PR_SET_PDEATHSIG = 1


class Supervisor(Multiprocess):
    """uvicorn's supervisor, marking each child that exits dead in the shared metrics directory."""

    def __init__(self, config: Config, sockets: list[Any], metrics_dir: str) -> None:
        super().__init__(config, sockets)
        self.metrics_dir = metrics_dir

    def _reaping(self, step: Any) -> None:
        before = {p.pid for p in self.processes}
        step()
        for pid in before - {p.pid for p in self.processes}:
            if pid is not None:
                multiprocess.mark_process_dead(pid, self.metrics_dir)  # type: ignore[no-untyped-call]

    def keep_subprocess_alive(self) -> None:
        self._reaping(super().keep_subprocess_alive)

    def restart_all(self) -> None:
        self._reaping(super().restart_all)

    def handle_ttou(self) -> None:
        self._reaping(super().handle_ttou)

    def join_all(self) -> None:
        super().join_all()
        for process in self.processes:
            if process.pid is not None:
                multiprocess.mark_process_dead(process.pid, self.metrics_dir)  # type: ignore[no-untyped-call]


def run(config: Config, sockets: list[Any] | None = None) -> None:
    """Run ``config.workers`` children of ``config`` (an app factory named by import string) until a
    signal stops the supervisor; the metrics directory lives exactly as long as it does. ``sockets``,
    when given, are bound already and served by every child (the public and the operator listener)."""
    metrics_dir = tempfile.mkdtemp(prefix="effectgate-metrics-")
    # Children are spawned (a fresh interpreter): they read these before importing prometheus_client.
    os.environ[MULTIPROC_ENV] = metrics_dir
    os.environ[PARENT_ENV] = str(os.getpid())
    try:
        Supervisor(config, sockets or [config.bind_socket()], metrics_dir).run()
    finally:
        shutil.rmtree(metrics_dir, ignore_errors=True)


def die_with_parent() -> None:
    """In a child of ``run``: be sent SIGTERM when the supervisor dies, and stop now if it already has."""
    parent = os.environ.get(PARENT_ENV)
    if not parent:
        return
    parent_pid = int(parent)
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    else:
        threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()
    # The parent may have died before the request above: then no signal will ever come.
    if os.getppid() != parent_pid:
        raise SystemExit(f"effectgate: the serve supervisor (pid {parent_pid}) is gone; exiting")


def _watch_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGTERM)

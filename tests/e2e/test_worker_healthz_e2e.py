"""``GET /healthz`` on a worker's metrics port answers from the process alone: a real worker process keeps
answering 200 while its database is unreachable (its /metrics then says effectgate_ledger_up 0), so a
Kubernetes liveness probe restarts no worker on a Postgres outage."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import httpx
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.prometheus import value

from .conftest import Stack
from .processes import free_port, pump, wait_until


class Forwarder:
    """A loopback TCP forwarder to Postgres that can be cut: the listener and every connection closed."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        self.cut_off = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                host, port = self.target
                if host.startswith("/"):  # a Unix-socket directory (the embedded Postgres)
                    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    upstream.connect(f"{host}/.s.PGSQL.{port}")
                else:
                    upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self.lock:
                if self.cut_off:
                    # Accepted just before the cut and connected just after it: without this check the pair
                    # outlived the outage, and the worker's pool kept one working connection through it.
                    client.close()
                    upstream.close()
                    return
                self.sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=pump, args=(a, b), daemon=True).start()

    def cut(self) -> None:
        self.listener.close()
        with self.lock:
            self.cut_off = True
            for s in self.sockets:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()


@pytest.fixture
def forwarder(stack: Stack) -> Iterator[Forwarder]:
    info = conninfo_to_dict(stack.db_url)
    forwarder = Forwarder(str(info.get("host") or "127.0.0.1"), int(info.get("port") or 5432))
    yield forwarder
    forwarder.cut()


def test_a_worker_is_alive_while_its_database_is_unreachable(stack: Stack, forwarder: Forwarder) -> None:
    via = make_conninfo(stack.db_url, host="127.0.0.1", hostaddr="127.0.0.1", port=str(forwarder.port))
    port = free_port()
    worker = stack.worker("worker", "--metrics-port", str(port), DATABASE_URL=via)
    healthz, metrics = f"http://127.0.0.1:{port}/healthz", f"http://127.0.0.1:{port}/metrics"
    wait_until(lambda: httpx.get(healthz, timeout=5).status_code == 200, 30, "/healthz to answer 200")
    assert value(httpx.get(metrics, timeout=10).text, "effectgate_ledger_up") == 1

    forwarder.cut()
    # The worker sees the outage (its own scrape says so) ...
    # A deadline, not a duration: the ledger gauges are cached for 10 s, and the read that finds the outage may
    # first wait out the pool's own timeout for a connection; it took over 60 s once in CI.
    wait_until(
        lambda: value(httpx.get(metrics, timeout=60).text, "effectgate_ledger_up") == 0,
        240,
        "the worker's /metrics to report the ledger down",
    )
    # ... and its loop still ticks: /healthz answers 200 from process state, several times over.
    for _ in range(3):
        answer = httpx.get(healthz, timeout=5)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["status"] == "ok" and body["draining"] is False
        assert isinstance(body["loop_age_seconds"], float)
    assert worker.popen.poll() is None, "the worker must keep running through the outage"
    # No token is asked for: a kubelet probe carries none, and the answer names no secret or host.
    assert "127.0.0.1" not in answer.text and "postgres" not in answer.text

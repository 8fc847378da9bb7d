"""``effectgate worker --metrics-port``: a real worker process serves its own counters over loopback HTTP,
and stops serving when it stops."""

from __future__ import annotations

import contextlib
import socket
import time

import httpx
import pytest

from effectgate.gateway.metrics import CONTENT_TYPE
from tests.prometheus import value

from .conftest import Stack, event
from .processes import Process, free_port, wait_until

DRIP_INTERVAL_SECONDS = 0.2
DRIP_DEADLINE_SECONDS = 120


def test_a_worker_serves_metrics_with_the_jobs_it_ran_until_it_stops(stack: Stack) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    worker = stack.worker("worker", "--metrics-port", str(port))
    worker.wait_http(url)
    assert stack.deliver(event("6006", "evt_6006")).status_code == 202
    stack.wait_state("order-paid:6006", "succeeded")

    def succeeded(text: str) -> float:
        return value(text, "effectgate_job_run_seconds_count", kind="e2e.fulfil", outcome="succeeded")

    # The slice is counted just after its transition commits: poll rather than race it.
    wait_until(lambda: succeeded(httpx.get(url, timeout=5).text) == 1, 10, "the slice to be counted")
    response = httpx.get(url, timeout=5)
    assert (response.status_code, response.headers["content-type"]) == (200, CONTENT_TYPE)
    text = response.text
    assert value(text, "effectgate_downstream_calls_total", service="payments", status="200") == 1
    assert value(text, "effectgate_downstream_calls_total", service="shipping", status="201") == 1
    # The ledger's gauges come along, read through the worker's own pool.
    assert value(text, "effectgate_ledger_up") == 1

    assert worker.stop() == 0
    with pytest.raises(httpx.TransportError):
        httpx.get(url, timeout=2)


def test_a_metrics_port_already_taken_is_exit_1_before_any_job_runs(stack: Stack) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = Process(
            ["worker", "--config", str(stack.config), "--no-migrate", "--metrics-port", str(port)],
            stack.env,
            stack.tmp / "refused.log",
        )
        stack.processes.append(proc)
        assert proc.popen.wait(timeout=30) == 1
    log = proc.log()
    assert (
        f"--metrics-port: cannot listen on 127.0.0.1:{port}: Address already in use (another process" in log
    )
    assert "worker.started" not in log


def test_a_worker_asks_for_the_configured_metrics_token(stack: Stack) -> None:
    token = "e2e-metrics-token-0123456789"
    config = stack.tmp / "with-token.toml"
    config.write_text(stack.config.read_text() + '\n[metrics]\ntoken_env = "E2E_METRICS_TOKEN"\n')
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    proc = Process(
        ["worker", "--config", str(config), "--no-migrate", "--metrics-port", str(port)],
        {**stack.env, "E2E_METRICS_TOKEN": token},
        stack.tmp / "token-worker.log",
    )
    stack.processes.append(proc)
    proc.wait_log("worker.started")
    assert httpx.get(url, timeout=5).status_code == 401
    assert httpx.get(url, headers={"Authorization": "Bearer nope"}, timeout=5).status_code == 401
    scraped = httpx.get(url, headers={"Authorization": f"Bearer {token}"}, timeout=5)
    assert scraped.status_code == 200 and value(scraped.text, "effectgate_ledger_up") == 1
    assert token not in proc.log()


def test_a_header_drip_on_the_metrics_port_is_cut_off(stack: Stack) -> None:
    # The worker's listener shares the worker's event loop: a client that never finishes its request
    # head must be cut off by the [gateway] header timeout, as on the gateway's own port.
    config = stack.tmp / "guarded.toml"
    config.write_text(stack.config.read_text() + "\n[gateway]\nheader_timeout = 1\n")
    port = free_port()
    proc = Process(
        ["worker", "--config", str(config), "--no-migrate", "--metrics-port", str(port)],
        stack.env,
        stack.tmp / "guarded-worker.log",
    )
    stack.processes.append(proc)
    proc.wait_http(f"http://127.0.0.1:{port}/metrics")
    sent = 0
    answer = b""
    # A deadline for a hang, not a timing: the guard answers after a second, a loaded machine only later.
    deadline = time.monotonic() + DRIP_DEADLINE_SECONDS
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: worker\r\nX-Drip: ")
        # A byte at a time until the worker answers or closes; unguarded, it never does and this loop
        # runs to the deadline.
        sock.settimeout(DRIP_INTERVAL_SECONDS)
        while not answer and time.monotonic() < deadline:
            try:
                sock.send(b"a")
            except OSError:
                break  # the guard has closed; its answer, if it gave one, waits below
            sent += 1
            try:
                answer = sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                break
            if not answer:
                break  # closed without a word: the assertion below says so
        sock.settimeout(30)
        # The guard answers, then closes: a byte of ours still in flight turns that close into a reset.
        with contextlib.suppress(ConnectionResetError, TimeoutError):
            if not answer:
                answer = sock.recv(4096)
            while answer and (more := sock.recv(4096)):
                answer += more
    assert answer.startswith(b"HTTP/1.1 408 "), (sent, answer)
    assert b'"error": "request_timeout"' in answer
    # The worker is still serving.
    assert httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).status_code == 200

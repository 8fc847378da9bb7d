"""``effectgate worker --metrics-port``: a real worker process serves its own counters over loopback HTTP,
and stops serving when it stops."""

from __future__ import annotations

import socket

import httpx
import pytest

from effectgate.gateway.operator.metrics import CONTENT_TYPE
from tests.prometheus import value

from .conftest import Stack, event
from .processes import Process, free_port, wait_until


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

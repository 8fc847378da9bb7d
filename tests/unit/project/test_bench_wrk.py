"""The benchmarks' reading of wrk's report: a figure misread is a benchmark that lies quietly."""

from __future__ import annotations

import hashlib
import hmac
import math
from pathlib import Path

from tests.bench import wrk

REPORT = """Running 10s test @ http://127.0.0.1:8000
  1 threads and 16 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency    31.20ms   12.00ms 300.00ms   68.50%
    Req/Sec   500.00     50.00   600.00     75.99%
  Latency Distribution
     50%   29.45ms
     75%   35.00ms
     90%   40.00ms
     99%    1.20s
  5000 requests in 10.00s, 1.00MB read
  Socket errors: connect 0, read 1, write 0, timeout 2
  Non-2xx or 3xx responses: 3
Requests/sec:    499.50
"""


def test_percentiles_come_from_the_distribution_not_the_stdev_column() -> None:
    # "68.50%" and "75.99%" end in 50% and 99%: read loosely, they made p50 and p99 nan.
    result = wrk.parse(REPORT)
    assert (result.p50_ms, result.p99_ms) == (29.45, 1200.0)
    assert (result.requests, result.rate, result.non_2xx, result.socket_errors) == (5000, 499.5, 3, 3)
    assert result.errors == 6


def test_a_run_with_no_answer_has_an_unbounded_latency_not_zero() -> None:
    result = wrk.parse("Running 2s test @ http://127.0.0.1:8000\n  0 requests in 2.00s, 0B read\n")
    assert result.requests == 0
    assert math.isinf(result.p99_ms)
    assert "NO ANSWER" in result.line()


def test_every_pooled_delivery_is_distinct_and_signed_over_its_own_body(tmp_path: Path) -> None:
    lines = wrk.write_pool(tmp_path / "pool.tsv", 50).read_text().splitlines()
    bodies = set()
    for line in lines:
        header, body = line.split("\t", 1)
        t, v1 = (part.split("=", 1)[1] for part in header.split(","))
        expected = hmac.new(wrk.SECRET.encode(), f"{t}.{body}".encode(), hashlib.sha256).hexdigest()
        assert hmac.compare_digest(v1, expected)
        bodies.add(body)
    assert len(bodies) == 50

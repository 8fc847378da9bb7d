"""The metrics registry and its Prometheus text format."""

from __future__ import annotations

import re

import pytest

from effectgate.gateway.operator import metrics
from effectgate.gateway.operator.metrics import Registry
from effectgate.ledger.reports import JobGauges

# One sample line of the text format: name, optional {labels}, value.
_SAMPLE = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*",?)*\})? \S+$')


def assert_valid_exposition(text: str) -> None:
    assert text.endswith("\n")
    for line in text.splitlines():
        assert line.startswith(("# HELP ", "# TYPE ")) or _SAMPLE.match(line), line


def test_counters_render_sorted_with_escaped_labels() -> None:
    registry = Registry()
    counter = registry.counter("x_total", "Things.", ("source", "outcome"))
    counter.inc("stripe", "accepted")
    counter.inc("stripe", "accepted")
    counter.inc('we"ird\\\n', "duplicate", amount=0.5)
    text = registry.render()
    assert_valid_exposition(text)
    assert text == (
        "# HELP x_total Things.\n"
        "# TYPE x_total counter\n"
        'x_total{source="stripe",outcome="accepted"} 2\n'
        'x_total{source="we\\"ird\\\\\\n",outcome="duplicate"} 0.5\n'
    )


def test_histograms_are_cumulative_with_sum_and_count() -> None:
    registry = Registry()
    histogram = registry.histogram("lat_seconds", "Latency.", buckets=(0.1, 1.0))
    for value in (0.05, 0.5, 2.0):
        histogram.observe(value)
    text = registry.render()
    assert_valid_exposition(text)
    assert text.splitlines()[2:] == [
        'lat_seconds_bucket{le="0.1"} 1',
        'lat_seconds_bucket{le="1"} 2',
        'lat_seconds_bucket{le="+Inf"} 3',
        "lat_seconds_sum 2.55",
        "lat_seconds_count 3",
    ]


def test_label_sets_past_the_cap_fold_into_other() -> None:
    registry = Registry()
    counter = registry.counter("c_total", "C.", ("source",))
    for i in range(metrics.MAX_SERIES + 50):
        counter.inc(f"s{i}")
    assert len(counter.values) == metrics.MAX_SERIES + 1
    assert counter.values[(metrics.OTHER,)] == 50


def test_mistakes_are_refused() -> None:
    registry = Registry()
    registry.counter("a_total", "A.", ("x",))
    with pytest.raises(ValueError, match="registered already"):
        registry.counter("a_total", "A.")
    with pytest.raises(ValueError, match="ascending"):
        registry.histogram("h", "H.", buckets=(1.0, 0.5))
    with pytest.raises(ValueError, match="takes labels"):
        registry.counter("b_total", "B.", ("x", "y")).inc("only-one")


def test_the_module_functions_count_into_the_process_registry() -> None:
    before = metrics.DELIVERIES.values.get(("unit-test", "accepted"), 0)
    metrics.delivery("unit-test", "accepted")
    metrics.claimed("unit-test", ["accepted", "duplicate"])
    metrics.claimed("unit-test", [])
    metrics.verification_failure("unit-test", "signature_invalid")
    metrics.claim_latency(0.003)
    metrics.job_run("unit-kind", "succeeded", 1.5)
    metrics.job_retry("unit-kind")
    metrics.job_reclaim("unit-kind")
    metrics.downstream_call("payments", 201)
    assert metrics.DELIVERIES.values[("unit-test", "accepted")] == before + 2
    assert metrics.DELIVERIES.values[("unit-test", "unmatched")] >= 1
    text = metrics.REGISTRY.render()
    assert_valid_exposition(text)
    for name in (
        "effectgate_deliveries_total",
        "effectgate_verification_failures_total",
        "effectgate_claim_seconds_bucket",
        "effectgate_job_run_seconds_count",
        "effectgate_job_retries_total",
        "effectgate_job_reclaims_total",
        'effectgate_downstream_calls_total{service="payments",status="201"}',
    ):
        assert name in text


def test_job_gauges_render_and_say_when_the_ledger_is_unreadable() -> None:
    text = metrics.render_job_gauges(
        JobGauges([{"state": "parked", "kind": "fulfil", "n": 2}], oldest_due_seconds=12.5)
    )
    assert_valid_exposition(text)
    assert "effectgate_ledger_up 1" in text
    assert 'effectgate_jobs{state="parked",kind="fulfil"} 2' in text
    assert "effectgate_oldest_due_job_seconds 12.5" in text
    assert metrics.render_job_gauges(None).splitlines()[-1] == "effectgate_ledger_up 0"

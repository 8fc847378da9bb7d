"""The process metrics, their Prometheus text format, and the ledger gauges rendered beside them."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from effectgate.gateway import metrics
from effectgate.gateway.operator import metrics as metrics_endpoint
from effectgate.ledger.reports import JobGauges
from tests.prometheus import samples, value

# One sample line of the text format: name, optional {labels}, value.
_SAMPLE = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*",?)*\})? \S+$')


def assert_valid_exposition(text: str) -> None:
    assert text.endswith("\n")
    for line in text.splitlines():
        assert line.startswith(("# HELP ", "# TYPE ")) or _SAMPLE.match(line), line
    samples(text)  # and Prometheus's own parser reads it


def test_the_module_functions_count_into_the_process_metrics() -> None:
    before = metrics.render()
    metrics.delivery("unit-test", "accepted")
    metrics.claimed("unit-test", ["accepted", "duplicate"])
    metrics.claimed("unit-test", [])
    metrics.verification_failure("unit-test", 'we"ird\\\n')
    metrics.claim_latency(0.003)
    metrics.job_run("unit-kind", "succeeded", 1.5)
    metrics.job_retry("unit-kind")
    metrics.job_reclaim("unit-kind")
    metrics.downstream_call("payments", 201, 0.2)
    metrics.downstream_call("payments", "ReadTimeout", 30.0)
    metrics.webhook_request("unit-test", 413, 0.0001)
    metrics.reconciler_ticked()
    text = metrics.render()
    assert_valid_exposition(text)

    def grew(name: str, **labels: str) -> float:
        return value(text, name, **labels) - value(before, name, **labels)

    assert grew("effectgate_deliveries_total", source="unit-test", outcome="accepted") == 2
    assert grew("effectgate_deliveries_total", source="unit-test", outcome="duplicate") == 1
    assert grew("effectgate_deliveries_total", source="unit-test", outcome="unmatched") == 1
    # A label value from outside is escaped, and reads back as it was.
    assert grew("effectgate_verification_failures_total", source="unit-test", reason='we"ird\\\n') == 1
    assert grew("effectgate_claim_seconds_bucket", le="0.005") == 1
    assert grew("effectgate_claim_seconds_count") == 1
    assert grew("effectgate_job_run_seconds_count", kind="unit-kind", outcome="succeeded") == 1
    assert grew("effectgate_job_run_seconds_bucket", kind="unit-kind", outcome="succeeded", le="1.0") == 0
    assert grew("effectgate_job_run_seconds_bucket", kind="unit-kind", outcome="succeeded", le="5.0") == 1
    assert grew("effectgate_job_retries_total", kind="unit-kind") == 1
    assert grew("effectgate_job_reclaims_total", kind="unit-kind") == 1
    assert grew("effectgate_downstream_calls_total", service="payments", status="201") == 1
    assert (
        grew("effectgate_downstream_call_seconds_bucket", service="payments", outcome="2xx", le="0.25") == 1
    )
    assert (
        grew("effectgate_downstream_call_seconds_bucket", service="payments", outcome="error", le="5.0") == 0
    )
    assert grew("effectgate_downstream_call_seconds_count", service="payments", outcome="error") == 1
    assert grew("effectgate_webhook_requests_total", source="unit-test", status="413") == 1
    assert grew("effectgate_webhook_request_seconds_count", source="unit-test", status_class="4xx") == 1
    assert value(text, "effectgate_reconciler_last_tick_timestamp_seconds") > 1.7e9
    # No `_created` twin of every counter.
    assert "_created" not in text


@pytest.fixture
def retries_given_back() -> Iterator[None]:
    """The cap test fills JOB_RETRIES to its cap; later tests in the session (the worker's retry counts) need
    their own series, so the series it added are removed and the seen set restored afterwards."""
    before = set(metrics.JOB_RETRIES.seen)
    yield
    for key in metrics.JOB_RETRIES.seen - before:
        metrics.JOB_RETRIES.metric.remove(*key)
    metrics.JOB_RETRIES.seen = before


@pytest.mark.usefixtures("retries_given_back")
def test_label_sets_past_the_cap_fold_into_other() -> None:
    for i in range(metrics.MAX_SERIES + 50):
        metrics.job_retry(f"capped-{i}")
    text = metrics.render()
    kinds = {dict(labels)["kind"] for name, labels in samples(text) if name == "effectgate_job_retries_total"}
    assert len(kinds) <= metrics.MAX_SERIES + 1
    assert value(text, "effectgate_job_retries_total", kind=metrics.OTHER) >= 50


def test_a_wrong_number_of_labels_is_refused() -> None:
    with pytest.raises(ValueError, match="takes 2 labels"):
        metrics.DELIVERIES.labels("only-one")


def test_job_gauges_render_and_say_when_the_ledger_is_unreadable() -> None:
    text = metrics_endpoint.render_job_gauges(
        JobGauges(
            [{"state": "parked", "kind": "fulfil", "n": 2}, {"state": "failed", "kind": 'a"b', "n": 1}],
            oldest_due_seconds=12.5,
        )
    )
    assert_valid_exposition(text)
    assert value(text, "effectgate_ledger_up") == 1
    assert value(text, "effectgate_jobs", state="parked", kind="fulfil") == 2
    assert value(text, "effectgate_jobs", state="failed", kind='a"b') == 1
    assert value(text, "effectgate_oldest_due_job_seconds") == 12.5
    assert metrics_endpoint.render_job_gauges(None).splitlines()[-1] == "effectgate_ledger_up 0"

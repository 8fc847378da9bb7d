"""The shipped alert rules and Grafana dashboard name only metrics that real ``/metrics`` pages carry: a
gateway's and a worker's, after a delivery ran and a forged one was refused."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import yaml

from tests.prometheus import names

from .conftest import Stack, event
from .processes import ROOT, free_port

RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "effectgate.json"
_METRIC = re.compile(r"\beffectgate_[a-z0-9_]+\b")
# prometheus_client declares a counter by its `_total` name, a histogram by its base name.
_SUFFIXES = {"histogram": ("_bucket", "_sum", "_count")}


def page_names(text: str) -> set[str]:
    """Every name PromQL can use on this page: its samples, and every declared family with its suffixes
    (a labelled counter nothing has counted yet is declared, not sampled)."""
    found = names(text)
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, family, kind = line.split()
            found |= {family + suffix for suffix in _SUFFIXES.get(kind, ("",))}
    return found


def rule_exprs() -> dict[str, str]:
    document = yaml.safe_load(RULES.read_text())
    exprs = {}
    for group in document["groups"]:
        for rule in group["rules"]:
            if "record" in rule:
                # A recording rule (the delivery objective, the burn-rate ratios): no labels or annotations.
                exprs[rule["record"]] = rule["expr"]
                continue
            assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
            assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]
            exprs[rule["alert"]] = rule["expr"]
    return exprs


def dashboard_exprs() -> dict[str, str]:
    document: dict[str, Any] = json.loads(DASHBOARD.read_text())
    exprs = {}
    for panel in document["panels"]:
        for target in panel.get("targets", []):
            exprs[f"{panel['title']} {target['refId']}"] = target["expr"]
    for variable in document["templating"]["list"]:
        if variable["type"] == "query":
            exprs[f"${variable['name']}"] = variable["definition"]
    return exprs


def test_the_rules_cover_what_an_operator_must_hear_about() -> None:
    exprs = rule_exprs()
    used = {name for expr in exprs.values() for name in _METRIC.findall(expr)}
    assert {
        "effectgate_oldest_due_job_seconds",
        "effectgate_jobs",
        "effectgate_verification_failures_total",
        "effectgate_deliveries_total",
        "effectgate_reconciler_last_tick_timestamp_seconds",
        "effectgate_ledger_up",
        "effectgate_webhook_requests_total",
    } <= used


def test_every_metric_the_rules_and_the_dashboard_use_is_on_a_real_page(stack: Stack) -> None:
    port = free_port()
    worker_url = f"http://127.0.0.1:{port}/metrics"
    worker = stack.worker("worker", "--metrics-port", str(port))
    worker.wait_http(worker_url)
    assert stack.deliver(event("7007", "evt_7007")).status_code == 202
    forged = httpx.post(f"{stack.gateway_url}/webhooks/shop", content=b"{}", timeout=10)
    assert forged.status_code == 401
    stack.wait_state("order-paid:7007", "succeeded")

    available = page_names(httpx.get(f"{stack.gateway_url}/metrics", timeout=10).text)
    available |= page_names(httpx.get(worker_url, timeout=10).text)
    for where, exprs in (("alerts.yml", rule_exprs()), ("effectgate.json", dashboard_exprs())):
        for name, expr in exprs.items():
            missing = set(_METRIC.findall(expr)) - available
            assert not missing, f"{where}: {name} uses {missing}, which no /metrics page carries"

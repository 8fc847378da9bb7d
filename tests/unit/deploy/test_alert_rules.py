"""The shipped alert rules read as an SRE expects: grouped per deployment, each with a runbook that exists."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[3]
RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"
REPOSITORY = "https://github.com/effectgate/effectgate/blob/main/"


def rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def anchors(markdown: str) -> set[str]:
    """GitHub's anchors for the headings of ``markdown``: lower case, punctuation dropped, spaces to '-'."""
    found = set()
    for heading in re.findall(r"^#+ (.+)$", markdown, flags=re.MULTILINE):
        found.add(re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-"))
    return found


def test_every_alert_has_a_runbook_url_whose_section_exists() -> None:
    alerts = [rule for rule in rules() if "alert" in rule]
    assert len(alerts) >= 10
    for rule in alerts:
        url = rule["annotations"].get("runbook_url", "")
        assert url.startswith(REPOSITORY), rule["alert"]
        path, _, anchor = url.removeprefix(REPOSITORY).partition("#")
        assert anchor in anchors((ROOT / path).read_text()), (
            f"{rule['alert']}: no section #{anchor} in {path}"
        )


def test_every_aggregation_keeps_namespace_and_job() -> None:
    # A rule that aggregates them away merges two deployments: one's healthy gauge hides the other's.
    for rule in rules():
        expr = rule["expr"]
        for clause in re.findall(r"\b(?:sum|max|min)\s*(?:by\s*\(([^)]*)\))?\s*\(", expr):
            labels = {label.strip() for label in clause.split(",")}
            assert {"namespace", "job"} <= labels, f"{rule.get('alert') or rule['record']}: {expr}"


def test_the_delivery_objective_is_one_setting_both_burn_rate_alerts_read() -> None:
    [objective] = [
        rule for rule in rules() if rule.get("record") == "effectgate:delivery_availability:objective"
    ]
    assert objective["expr"].strip() == "vector(0.999)"
    burns = [
        rule for rule in rules() if rule.get("alert", "").startswith("EffectgateDeliveryErrorBudgetBurn")
    ]
    assert len(burns) == 2
    for rule in burns:
        assert rule["expr"].count("effectgate:delivery_availability:objective") == 2

"""The Kubernetes package as kustomize renders it (deploy/kubernetes/{base,monitoring,overlays}): one version
everywhere, a config edit that rolls the pods, probes that outlast the database wait, a NetworkPolicy that
opens only what is needed, and a PrometheusRule that is deploy/prometheus/alerts.yml.

``python -m tests.unit.deploy.test_deploy_kustomize --write-rules`` regenerates monitoring/prometheusrule.yaml
from alerts.yml; the test below fails until it has been run after an edit of the alerts."""

from __future__ import annotations

import re
import shutil
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from effectgate.gateway.config import DEFAULT_MIGRATION_WAIT
from tests.container import deploy_run, kustomize

ROOT = kustomize.ROOT
DEPLOY = ROOT / "deploy"
VERSION: str = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
RULES = kustomize.KUBERNETES / "monitoring" / "prometheusrule.yaml"


def prometheus_rule_text() -> str:
    groups = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())["groups"]
    rule = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "effectgate", "labels": {"app.kubernetes.io/name": "effectgate"}},
        "spec": {"groups": groups},
    }
    header = (
        "# GENERATED from deploy/prometheus/alerts.yml by `python -m tests.unit.deploy.test_deploy_kustomize --write-rules`;\n"
        "# do not edit (tests/unit/deploy/test_deploy_kustomize.py fails when the two differ).\n"
    )
    return header + yaml.safe_dump(rule, sort_keys=False, width=120)


def images(docs: list[dict[str, Any]]) -> set[str]:
    return {
        c["image"]
        for d in docs
        if d["kind"] in ("Deployment", "Job")
        for c in d["spec"]["template"]["spec"]["containers"]
    }


def test_one_version_the_package_the_images_the_manifests_and_the_changelog() -> None:
    tag = VERSION
    assert images(kustomize.render(kustomize.CI_OVERLAY)) == {f"localhost/effectgate:{tag}"}
    production = kustomize.render(kustomize.PRODUCTION_OVERLAY)
    assert images(production) == {f"registry.example.com/effectgate:{tag}"}
    base = yaml.safe_load((kustomize.KUBERNETES / "base" / "kustomization.yaml").read_text())
    assert base["images"] == [{"name": "effectgate", "newTag": tag}]
    for doc in production:
        if doc["kind"] not in ("PodMonitor", "PrometheusRule"):
            assert doc["metadata"]["labels"]["app.kubernetes.io/version"] == tag, doc["metadata"]["name"]
    job = next(d for d in production if d["kind"] == "Job")
    assert job["metadata"]["name"] == "effectgate-migrate-v" + tag.replace(".", "-")
    assert deploy_run.IMAGE == f"localhost/effectgate:{tag}"
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    assert {s["image"] for s in compose["services"].values() if "effectgate" in s.get("image", "")} == {
        f"effectgate:{tag}"
    }
    # Every other mention of an effectgate image or wheel in deploy/ names this version.
    for path in sorted(DEPLOY.rglob("*")):
        if path.is_file() and path.suffix not in (".json", ".png"):
            for found in re.findall(r"effectgate[:-](\d+\.\d+\.\d+)", path.read_text()):
                assert found == tag, (
                    f"{path.relative_to(ROOT)} names effectgate {found}, the package is {tag}"
                )
    changelog = (ROOT / "CHANGELOG.md").read_text()
    # The first released version (an "Unreleased" section may stand above it, as Keep a Changelog has it).
    assert re.search(r"^## (?!Unreleased$)(\S+)", changelog, re.MULTILINE)[1] == tag  # type: ignore[index]


def test_the_classifiers_claim_only_what_ci_runs_python_3_11_on_linux() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    classifiers = project["classifiers"]
    pythons = {
        c.rsplit(" :: ", 1)[1]
        for c in classifiers
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    }
    assert pythons == {"3.11"} and project["requires-python"] == ">=3.11"
    assert [c for c in classifiers if c.startswith("Operating System")] == [
        "Operating System :: POSIX :: Linux"
    ]


def test_the_base_configuration_is_deploy_effectgate_toml_verbatim() -> None:
    base = (kustomize.KUBERNETES / "base" / "effectgate.toml").read_text()
    assert base == (DEPLOY / "effectgate.toml").read_text()


def config_names(docs: list[dict[str, Any]]) -> tuple[str, set[str]]:
    """The ConfigMap's name and the names every pod template mounts."""
    (configmap,) = [d["metadata"]["name"] for d in docs if d["kind"] == "ConfigMap"]
    mounted = {
        v["configMap"]["name"]
        for d in docs
        if d["kind"] == "Deployment"
        for v in d["spec"]["template"]["spec"]["volumes"]
        if "configMap" in v
    }
    return configmap, mounted


def test_a_config_edit_changes_the_pod_templates_so_the_pods_roll(tmp_path: Path) -> None:
    copy = tmp_path / "kubernetes"
    shutil.copytree(kustomize.KUBERNETES, copy)
    before, mounted_before = config_names(kustomize.render(copy / "overlays" / "ci"))
    assert mounted_before == {before}
    toml = copy / "base" / "effectgate.toml"
    toml.write_text(toml.read_text().replace("concurrency = 64", "concurrency = 8"))
    after, mounted_after = config_names(kustomize.render(copy / "overlays" / "ci"))
    print(f"configmap before the edit: {before}; after: {after}")
    assert before.startswith("effectgate-config-") and after.startswith("effectgate-config-")
    assert after != before and mounted_after == {after}


def container(docs: list[dict[str, Any]], kind: str, component: str) -> dict[str, Any]:
    (doc,) = [
        d
        for d in docs
        if d["kind"] == kind and d["metadata"]["labels"]["app.kubernetes.io/component"] == component
    ]
    (c,) = doc["spec"]["template"]["spec"]["containers"]
    return c  # type: ignore[no-any-return]


def budget(probe: dict[str, Any]) -> float:
    return float(probe.get("periodSeconds", 10) * probe.get("failureThreshold", 3))


@pytest.mark.parametrize(("component", "port"), [("gateway", "http"), ("worker", "metrics")])
def test_startup_and_liveness_outlast_the_database_wait_and_need_no_database(
    component: str, port: str
) -> None:
    c = container(kustomize.render(), "Deployment", component)
    for kind in ("startupProbe", "livenessProbe"):
        probe = c[kind]
        assert probe["httpGet"] == {"path": "/healthz", "port": port}, (component, kind)
        assert budget(probe) > DEFAULT_MIGRATION_WAIT, (component, kind)
    if component == "gateway":
        assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}


def test_every_deployment_spreads_over_zones_and_nodes() -> None:
    for doc in kustomize.render():
        if doc["kind"] == "Deployment":
            spec = doc["spec"]["template"]["spec"]
            labels = doc["spec"]["template"]["metadata"]["labels"]
            keys = {c["topologyKey"] for c in spec["topologySpreadConstraints"]}
            assert keys == {"topology.kubernetes.io/zone", "kubernetes.io/hostname"}
            for constraint in spec["topologySpreadConstraints"]:
                assert constraint["labelSelector"]["matchLabels"].items() <= labels.items()


def test_the_network_policies_open_only_what_is_needed() -> None:
    docs = kustomize.render()
    policies = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "NetworkPolicy"}
    monitoring = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    dns = {"ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]}
    postgres = {"ports": [{"port": 5432, "protocol": "TCP"}]}
    https = {"ports": [{"port": 443, "protocol": "TCP"}]}
    gateway = policies["effectgate-gateway"]
    assert gateway["policyTypes"] == ["Ingress", "Egress"]
    assert gateway["ingress"] == [
        {"ports": [{"port": "http", "protocol": "TCP"}]},
        {"from": monitoring, "ports": [{"port": "operator", "protocol": "TCP"}]},
    ]
    assert gateway["egress"] == [dns, postgres]
    worker = policies["effectgate-worker"]
    assert worker["ingress"] == [{"from": monitoring, "ports": [{"port": "metrics", "protocol": "TCP"}]}]
    assert worker["egress"] == [dns, postgres, https]
    assert policies["effectgate-migrate"]["ingress"] == [] and policies["effectgate-migrate"]["egress"] == [
        dns,
        postgres,
    ]
    # Each policy selects exactly its component's pods, and the named ports exist on them.
    for name, spec in policies.items():
        component = name.removeprefix("effectgate-")
        assert spec["podSelector"]["matchLabels"] == {
            "app.kubernetes.io/name": "effectgate",
            "app.kubernetes.io/component": component,
        }
    for component, names in (("gateway", {"http", "operator"}), ("worker", {"metrics"})):
        assert {p["name"] for p in container(docs, "Deployment", component)["ports"]} == names


def test_the_migrate_job_is_a_versioned_argo_cd_presync_hook() -> None:
    (job,) = [d for d in kustomize.render() if d["kind"] == "Job"]
    assert job["metadata"]["annotations"] == {
        "argocd.argoproj.io/hook": "PreSync",
        "argocd.argoproj.io/hook-delete-policy": "BeforeHookCreation",
    }
    assert job["metadata"]["name"].endswith(VERSION.replace(".", "-"))


def test_the_prometheus_rule_is_deploy_prometheus_alerts_yml() -> None:
    assert RULES.read_text() == prometheus_rule_text(), (
        "run: python -m tests.unit.deploy.test_deploy_kustomize --write-rules"
    )
    production = kustomize.render(kustomize.PRODUCTION_OVERLAY)
    (rule,) = [d for d in production if d["kind"] == "PrometheusRule"]
    alerts = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    assert rule["spec"]["groups"] == alerts["groups"]
    (monitor,) = [d for d in production if d["kind"] == "PodMonitor"]
    assert {e["port"] for e in monitor["spec"]["podMetricsEndpoints"]} == {"operator", "metrics"}


if __name__ == "__main__":
    if sys.argv[1:] != ["--write-rules"]:
        sys.exit("usage: python -m tests.unit.deploy.test_deploy_kustomize --write-rules")
    RULES.write_text(prometheus_rule_text())
    print(f"wrote {RULES.relative_to(ROOT)}")

"""The pieces of ``make deploy-run`` (tests/container/deploy_run.py) that decide what runs, checked
without podman: the CI copy of the compose file differs from deploy/compose.yaml only where CI must,
the start order is the one depends_on promises, the CI configuration differs only in its downstream
URLs, and every container of the manifests is found with its args."""

from __future__ import annotations

import copy
import subprocess
from typing import Any

import yaml

from tests.container import deploy_run

COMPOSE = yaml.safe_load((deploy_run.DEPLOY / "compose.yaml").read_text())


def without(data: dict[str, Any], *paths: tuple[str, ...]) -> dict[str, Any]:
    data = copy.deepcopy(data)
    for path in paths:
        parent = data
        for key in path[:-1]:
            parent = parent.get(key, {})
        parent.pop(path[-1], None)
    return data


def test_the_ci_compose_file_changes_only_postgres_ports_the_build_context_and_adds_the_fakes() -> None:
    ports = {"8000": 18000, "9464": 19464}
    ci = deploy_run.ci_compose(COMPOSE, ports)
    services = ci["services"]
    assert services["postgres"]["image"] == deploy_run.POSTGRES_BASE
    assert services["postgres"]["entrypoint"] == ["/ci/postgres-entrypoint.sh"]
    assert services["postgres"]["command"] == COMPOSE["services"]["postgres"]["command"]
    # runtime-role runs psql from Postgres's image: the local one too, with the file's own entrypoint.
    assert services["runtime-role"]["image"] == deploy_run.POSTGRES_BASE
    assert services["runtime-role"]["entrypoint"] == COMPOSE["services"]["runtime-role"]["entrypoint"]
    assert services["gateway"]["image"] == COMPOSE["services"]["gateway"]["image"]
    assert services["gateway"]["ports"] == ["127.0.0.1:18000:8000", "127.0.0.1:19464:9464"]
    assert services["fake"]["command"][0] == "fake-providers"
    changed = [("image",), ("entrypoint",), ("volumes",), ("ports",), ("build", "context")]
    for name in COMPOSE["services"]:
        paths = [("services", name, *path) for path in changed]
        assert without(ci, *paths)["services"][name] == without(COMPOSE, *paths)["services"][name], name
    assert {k: v for k, v in ci.items() if k != "services"} == {
        k: v for k, v in COMPOSE.items() if k != "services"
    }
    assert COMPOSE["services"]["gateway"]["ports"] == ["127.0.0.1:8000:8000", "127.0.0.1:9464:9464"]


def test_the_compose_stack_starts_in_the_order_depends_on_promises() -> None:
    order = deploy_run.start_order(COMPOSE["services"])
    assert order.index("postgres") < order.index("migrate") < order.index("gateway")
    assert order.index("migrate") < order.index("worker")
    # The runtime role exists, with its grants, before a process connects as it.
    assert order.index("migrate") < order.index("runtime-role") < order.index("gateway")
    assert order.index("runtime-role") < order.index("worker")


def test_the_ci_configuration_differs_only_in_its_downstream_urls() -> None:
    text = (deploy_run.DEPLOY / "effectgate.toml").read_text()
    ci = deploy_run.ci_config_text(text, "fake")
    differing = [(a, b) for a, b in zip(text.splitlines(), ci.splitlines(), strict=True) if a != b]
    assert differing and all(b == 'base_url = "http://fake:8001"' for _, b in differing)
    assert all(a.startswith("base_url = ") for a, _ in differing)


def test_every_manifest_container_is_started_with_its_args() -> None:
    found = {
        (i["file"], i["container"]["name"]): i["container"]["args"] for i in deploy_run.manifest_containers()
    }
    assert set(found) == {
        ("Deployment/effectgate-gateway", "gateway"),
        ("Deployment/effectgate-worker", "worker"),
        ("Job/effectgate-migrate-v0-3-0", "migrate"),
    }
    assert found[("Job/effectgate-migrate-v0-3-0", "migrate")] == ["migrate"]
    assert "--no-migrate" in found[("Deployment/effectgate-gateway", "gateway")]
    assert {i["container"]["image"] for i in deploy_run.manifest_containers()} == {deploy_run.IMAGE}


def test_every_missing_tool_is_named_at_once_before_any_image_work(tmp_path: Any) -> None:
    (tmp_path / "dnsname").write_text("")
    everything = ["image", "compose", "kubernetes"]
    present = {"podman", "runc", "debootstrap", "podman-compose", "kubectl"}
    found = deploy_run.missing_tools(
        everything, which=lambda t: t if t in present else None, plugin_dirs=[tmp_path]
    )
    assert found == []
    none = deploy_run.missing_tools(everything, which=lambda tool: None, plugin_dirs=["/nonexistent"])
    assert none == ["podman", "runc", "debootstrap", "podman-compose", "dnsname", "kustomize"]
    image = deploy_run.missing_tools(["image"], which=lambda tool: None, plugin_dirs=[tmp_path])
    assert image == ["podman", "runc", "debootstrap"]


def test_deploy_run_fails_at_once_naming_what_is_missing(monkeypatch: Any, capsys: Any) -> None:
    def never(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("image work started before the tools were checked")

    monkeypatch.setattr(deploy_run.shutil, "which", lambda tool: None)
    monkeypatch.setattr(deploy_run, "CNI_PLUGIN_DIRS", ("/nonexistent",))
    monkeypatch.setattr(deploy_run, "build_images", never)
    monkeypatch.setattr(deploy_run, "cleanup", never)
    assert deploy_run.main([]) == 1
    out = capsys.readouterr().out
    for tool in ("podman:", "runc:", "debootstrap:", "podman-compose:", "dnsname:", "kustomize or kubectl:"):
        assert f"\n  {tool}" in out, tool
    assert (
        "apt-get install podman runc debootstrap podman-compose golang-github-containernetworking-plugin-dnsname"
        in out
    )


def test_a_dnsname_plugin_dpkg_installed_outside_the_default_directories_is_found(monkeypatch: Any) -> None:
    listed = "/.\n/usr/libexec/podman/cni\n/usr/libexec/podman/cni/dnsname\n"
    done = subprocess.CompletedProcess(["dpkg-query"], 0, stdout=listed, stderr="")
    monkeypatch.setattr(deploy_run.subprocess, "run", lambda *args, **kwargs: done)
    found = deploy_run.missing_tools(["image"], which=lambda tool: tool, plugin_dirs=["/nonexistent"])
    assert found == []
    absent = subprocess.CompletedProcess(["dpkg-query"], 1, stdout="", stderr="not installed")
    monkeypatch.setattr(deploy_run.subprocess, "run", lambda *args, **kwargs: absent)
    assert deploy_run.missing_tools(["image"], which=lambda tool: tool, plugin_dirs=["/nonexistent"]) == [
        "dnsname"
    ]

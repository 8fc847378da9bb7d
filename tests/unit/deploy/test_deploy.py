"""The deploy/ artefacts, parsed: what the linters cannot know about effectgate.

hadolint, kubernetes-validate and systemd-analyze (``make deploy-check``) check each file against its
own format; these tests check them against effectgate: every command parses with effectgate's own
argument parser and starts without migrating, the probes name the real endpoints, the containers run
locked down as the image's user, every secret the configuration names is supplied, and every
worker is given longer to stop than it takes to drain.
"""

from __future__ import annotations

import functools
import re
import shlex
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from effectgate.gateway.cli import build_parser
from effectgate.gateway.config import Config, parse
from effectgate.gateway.config.secrets import ROLE_SECRETS, Role
from effectgate.handlers.worker.config import DEFAULT_DRAIN_TIMEOUT
from tests.container import kustomize

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"
CONFIG_TEXT = (DEPLOY / "effectgate.toml").read_text()
# After drain_timeout the worker still closes its HTTP client and pool: the stop budget must leave room.
STOP_MARGIN_SECONDS = 5
OPERATOR_PORT = 9464


def config_env_names() -> set[str]:
    """Every environment variable deploy/effectgate.toml names for a secret: each source's ``secrets``
    and every ``*_env`` key, wherever it is."""
    data = tomllib.loads(CONFIG_TEXT)
    names = {name for source in data["sources"].values() for name in source["secrets"]}

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                if key.endswith("_env") and isinstance(item, str):
                    names.add(item)
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(data)
    return names


def role_env_names(role: Role) -> set[str]:
    """The secrets deploy/effectgate.toml names that a process of ``role`` loads (secret_sources)."""
    data = tomllib.loads(CONFIG_TEXT)
    kinds = {
        "webhook": {name for source in data["sources"].values() for name in source["secrets"]},
        "operator": {o["token_env"] for o in data.get("operators", []) if "token_env" in o}
        | (
            {data["dashboard"]["session_secret_env"]}
            if "session_secret_env" in data.get("dashboard", {})
            else set()
        ),
        "downstream": {d["api_key_env"] for d in data.get("downstream", {}).values() if "api_key_env" in d},
        "metrics": {data["metrics"]["token_env"]} if "token_env" in data.get("metrics", {}) else set(),
    }
    names = set().union(*(kinds[kind] for kind in ROLE_SECRETS[role]))
    assert names <= config_env_names()
    return names


def load_config(env_names: set[str], role: Role = "all") -> Config:
    """The deploy configuration as effectgate loads it for ``role``, with only ``env_names`` set."""
    return parse(
        CONFIG_TEXT,
        path="deploy/effectgate.toml",
        env=dict.fromkeys(env_names, "placeholder-secret-0123456789"),
        role=role,
    )


def assert_role_secrets(env_names: set[str], role: Role, where: str) -> None:
    """``env_names`` supply every secret ``role`` loads and none it does not (the gateway holds no
    downstream API key, the worker no webhook secret or operator token)."""
    wanted = role_env_names(role)
    assert wanted <= env_names, f"{where}: missing {wanted - env_names}"
    others = (config_env_names() - wanted) & env_names
    assert not others, f"{where}: holds secrets its role does not use: {others}"
    load_config(env_names, role)


def drain_timeout() -> float:
    return load_config(config_env_names()).worker.drain_timeout


def command_args(argv: list[str]) -> Any:
    """Parse an artefact's effectgate command line with effectgate's own parser."""
    return build_parser().parse_args(argv)


def assert_production_command(argv: list[str], command: str) -> None:
    args = command_args(argv)
    assert args.command == command, argv
    if command in ("serve", "worker"):
        # Production processes never migrate at start: migrations run once, from their own job.
        assert args.no_migrate, f"{argv} must pass --no-migrate"


def test_the_deploy_configuration_loads_and_has_the_drain_timeout_the_artefacts_assume() -> None:
    config = load_config(config_env_names())
    assert config.handler_modules
    # Several gateway processes sign dashboard sessions with one shared secret, and /metrics asks a token.
    assert config.dashboard.session_secret is not None and config.metrics_token_sha256 is not None
    # The operator plane listens apart (loopback; containers widen the host by flag), behind TLS.
    assert (config.operator.listen_host, config.operator.listen_port) == ("127.0.0.1", OPERATOR_PORT)
    assert config.operator.secure_cookies is True
    assert config.worker.drain_timeout == 30
    # The artefacts size their stop budgets for a drain no longer than the worker's own default.
    assert config.worker.drain_timeout <= DEFAULT_DRAIN_TIMEOUT


# -- Dockerfile -----------------------------------------------------------------------------------


@dataclass
class Instruction:
    keyword: str
    rest: str


def dockerfile_stages() -> list[list[Instruction]]:
    text = (DEPLOY / "Dockerfile").read_text()
    logical = re.sub(
        r"\\\n", " ", "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    )
    stages: list[list[Instruction]] = []
    for line in logical.splitlines():
        if not line.strip():
            continue
        keyword, _, rest = line.strip().partition(" ")
        if keyword.upper() == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(Instruction(keyword.upper(), rest.strip()))
    return stages


def only(stage: list[Instruction], keyword: str) -> Instruction:
    found = [i for i in stage if i.keyword == keyword]
    assert len(found) == 1, f"expected one {keyword} in the final stage, got {found}"
    return found[0]


def image_uid() -> int:
    user = only(dockerfile_stages()[-1], "USER").rest
    return int(user.split(":")[0])


def test_the_image_is_built_in_a_builder_stage_and_installed_without_build_tools() -> None:
    builder, *_, final = dockerfile_stages()
    assert re.search(r"\bAS builder$", builder[0].rest)
    install = " ".join(i.rest for i in builder if i.keyword == "RUN")
    # A venv (a Debian-built Python refuses pip into itself, PEP 668), binary wheels only, the otel extra,
    # the plain package otherwise: no [embedded] extra in a container.
    assert "python3 -m venv /opt/effectgate" in install
    assert "/opt/effectgate/bin/pip install --only-binary=:all:" in install and '".[otel]"' in install
    assert "pip check" in install
    assert "embedded" not in install
    runs = " ".join(i.rest for i in final if i.keyword == "RUN")
    for tool in ("gcc", "build-essential", "apt-get install", "python3-dev", "libpq-dev", "pip install"):
        assert tool not in runs, f"the final stage runs {tool}"
    # COPY --from, never RUN --mount=type=bind,from=builder: buildah mounts another stage's files empty.
    assert "--mount" not in runs
    copies = [i.rest.split() for i in final if i.keyword == "COPY" and "--from=builder" in i.rest]
    assert copies == [["--from=builder", "/opt/effectgate", "/opt/effectgate"]]
    env = " ".join(i.rest for i in final if i.keyword == "ENV")
    assert "PATH=/opt/effectgate/bin:$PATH" in env


def test_a_derived_image_installs_into_the_venv_as_root_and_runs_as_the_image_user() -> None:
    # deploy/ci/derived/Containerfile is the README's recipe; `make deploy-run` builds and runs it.
    text = (DEPLOY / "ci" / "derived" / "Containerfile").read_text()
    users = re.findall(r"^USER (\S+)$", text, flags=re.M)
    assert users == ["root", f"{image_uid()}:{image_uid()}"]
    assert re.search(r"^RUN pip install ", text, flags=re.M)
    readme = (DEPLOY / "README.md").read_text()
    assert "USER root" in readme and f"USER {image_uid()}:{image_uid()}" in readme


def test_the_image_runs_as_a_non_root_numeric_user() -> None:
    # Numeric, so Kubernetes' runAsNonRoot can verify it without resolving a name.
    assert image_uid() >= 1000


def test_the_image_healthcheck_probes_healthz_with_python_and_stops_on_sigterm() -> None:
    final = dockerfile_stages()[-1]
    check = only(final, "HEALTHCHECK").rest
    command = yaml.safe_load(check.split("CMD", 1)[1].strip())
    assert command[:2] == ["python", "-c"]
    compile(command[2], "<healthcheck>", "exec")
    assert "http://127.0.0.1:8000/healthz" in command[2]
    assert only(final, "STOPSIGNAL").rest == "SIGTERM"
    entrypoint = yaml.safe_load(only(final, "ENTRYPOINT").rest)
    assert entrypoint == ["effectgate"]
    cmd = yaml.safe_load(only(final, "CMD").rest)
    assert_production_command(cmd, "serve")
    assert command_args(cmd).port == 8000 and command_args(cmd).host == "0.0.0.0"
    env = " ".join(i.rest for i in final if i.keyword == "ENV")
    assert "EFFECTGATE_CONFIG=/etc/effectgate/effectgate.toml" in env


def copy_sources(stage: list[Instruction]) -> set[str]:
    """The build-context paths a stage's COPY instructions read (not those copied from another stage)."""
    sources = set()
    for i in stage:
        words = i.rest.split()
        if i.keyword == "COPY" and not any(w.startswith("--from") for w in words):
            sources |= {w.rstrip("/") for w in words[:-1] if not w.startswith("--")}
    return sources


def test_the_build_context_sends_every_package_folder_the_wheel_needs() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    folders = {f.split("/")[0] for f in pyproject["tool"]["setuptools"]["package-dir"].values()}
    stages = dockerfile_stages()
    assert {"pyproject.toml", "README.md"} | folders <= copy_sources(stages[0])
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    sources = set().union(*(copy_sources(stage) for stage in stages))
    assert sources <= allowed, f"COPY sources excluded by Dockerfile.dockerignore: {sources - allowed}"


# -- compose --------------------------------------------------------------------------------------


def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    return data


def seconds(duration: str) -> float:
    match = re.fullmatch(r"(\d+)(s|m)", duration)
    assert match, duration
    return int(match[1]) * (60 if match[2] == "m" else 1)


def test_compose_has_postgres_migrate_runtime_role_gateway_and_worker() -> None:
    services = compose()["services"]
    assert set(services) == {"postgres", "migrate", "runtime-role", "gateway", "worker"}
    postgres = services["postgres"]
    volume = postgres["volumes"][0].split(":")
    assert volume[1] == "/var/lib/postgresql/data" and volume[0] in compose()["volumes"]
    assert "pg_isready" in " ".join(postgres["healthcheck"]["test"])


def test_compose_runs_migrate_once_before_gateway_and_worker() -> None:
    services = compose()["services"]
    migrate = services["migrate"]
    assert_production_command(migrate["command"], "migrate")
    assert migrate["restart"] == "no"
    assert migrate["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    for name, command in (("gateway", "serve"), ("worker", "worker")):
        service = services[name]
        assert_production_command(service["command"], command)
        assert service["depends_on"] == {
            "postgres": {"condition": "service_healthy"},
            "migrate": {"condition": "service_completed_successfully"},
            "runtime-role": {"condition": "service_completed_successfully"},
        }


# The runtime role's grants as docs/adr/0019-own-schema.md ("Roles") lists them, for its owner role.
ADR_ROLES = (ROOT / "docs" / "adr" / "0019-own-schema.md").read_text()


def sql_statements(text: str, first_words: tuple[str, ...]) -> list[str]:
    """The statements of ``text`` that begin with one of ``first_words``, whitespace collapsed."""
    statements = " ".join(
        line.strip() for line in text.splitlines() if not line.strip().startswith(("--", "\\"))
    ).split(";")
    return [" ".join(s.split()) for s in statements if s.strip().startswith(first_words)]


def test_the_runtime_role_script_grants_exactly_what_the_adr_lists() -> None:
    block = ADR_ROLES.split("- **Runtime**")[1].split("```sql")[1].split("```")[0]
    documented = sql_statements(block, ("GRANT", "ALTER DEFAULT"))
    assert len(documented) == 5
    script = (DEPLOY / "runtime-role.sql").read_text()
    granted = sql_statements(script, ("GRANT", "ALTER DEFAULT", "REVOKE"))
    # The script runs as the owner, so the ADR's "FOR ROLE effectgate_owner" is whoever runs it.
    assert granted == [g.replace("FOR ROLE effectgate_owner", "FOR ROLE CURRENT_USER") for g in documented]
    # The role itself: LOGIN and nothing more (no SUPERUSER, CREATEDB, CREATEROLE, BYPASSRLS).
    roles = sql_statements(script, ("SELECT 'CREATE ROLE", "ALTER ROLE"))
    assert roles == [
        "SELECT 'CREATE ROLE effectgate_app LOGIN' WHERE NOT EXISTS "
        "(SELECT FROM pg_roles WHERE rolname = 'effectgate_app') \\gexec ALTER ROLE effectgate_app LOGIN "
        "PASSWORD :'app_password'"
    ]


def test_compose_grants_the_runtime_role_as_the_owner_after_migrate() -> None:
    services = compose()["services"]
    role = services["runtime-role"]
    # Postgres's own image, for its psql; the script mounted from beside the compose file.
    assert role["image"] == services["postgres"]["image"]
    assert role["entrypoint"][0] == "psql" and role["entrypoint"][-1] == "/etc/effectgate/runtime-role.sql"
    assert "./runtime-role.sql:/etc/effectgate/runtime-role.sql:ro" in role["volumes"]
    assert role["restart"] == "no"
    assert role["depends_on"] == {
        "postgres": {"condition": "service_healthy"},
        "migrate": {"condition": "service_completed_successfully"},
    }
    env = role["environment"]
    # As the owner (the POSTGRES_USER), the runtime role's password from its own variable.
    assert env["PGUSER"] == services["postgres"]["environment"]["POSTGRES_USER"]
    assert env["PGPASSWORD"] == "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD}"
    assert env["EFFECTGATE_APP_PASSWORD"] == "${EFFECTGATE_APP_PASSWORD:?set EFFECTGATE_APP_PASSWORD}"
    assert role["read_only"] is True and role["cap_drop"] == ["ALL"] and role["user"] == "postgres"


def test_compose_runs_two_of_each_and_gives_workers_time_to_drain() -> None:
    services = compose()["services"]
    gateway_args = command_args(services["gateway"]["command"])
    assert gateway_args.workers == 2 or services["gateway"].get("deploy", {}).get("replicas") == 2
    # The image's HEALTHCHECK probes 127.0.0.1:8000 inside the container.
    assert (gateway_args.host, gateway_args.port) == ("0.0.0.0", 8000)
    # The operator plane on its own port, published to the host's loopback like the public one.
    assert gateway_args.operator_host == "0.0.0.0" and gateway_args.operator_port is None
    assert services["gateway"]["ports"] == [
        "127.0.0.1:8000:8000",
        f"127.0.0.1:{OPERATOR_PORT}:{OPERATOR_PORT}",
    ]
    # The proxy connects from the pinned network's host side, and only it is trusted.
    network = compose()["networks"]["default"]["ipam"]["config"][0]
    assert gateway_args.forwarded_allow_ips == (network["gateway"],)
    assert services["worker"]["deploy"]["replicas"] == 2
    # Compose's default stop_grace_period is 10 s: a draining worker would be SIGKILLed.
    assert seconds(services["worker"]["stop_grace_period"]) >= drain_timeout() + STOP_MARGIN_SECONDS
    # The image's HEALTHCHECK probes the gateway port; workers and migrate have none.
    assert services["worker"]["healthcheck"] == {"disable": True}
    assert services["migrate"]["healthcheck"] == {"disable": True}
    assert "healthcheck" not in services["gateway"]


def test_compose_gives_each_process_exactly_its_roles_secrets() -> None:
    for name, role in (("gateway", "gateway"), ("worker", "worker")):
        service = compose()["services"][name]
        env = service["environment"]
        # The runtime role's URL (docs/adr/0019, "Roles"), never the owner's that migrate gets.
        assert env["DATABASE_URL"] == (
            "postgresql://effectgate_app:${EFFECTGATE_APP_PASSWORD:?set EFFECTGATE_APP_PASSWORD}"
            "@postgres:5432/effectgate"
        )
        assert f"./effectgate.toml:{env['EFFECTGATE_CONFIG']}:ro" in service["volumes"]
        secrets = set(env) - {"DATABASE_URL", "EFFECTGATE_CONFIG"}
        assert_role_secrets(secrets, role, f"compose {name}")  # type: ignore[arg-type]
        for var in secrets:
            # Interpolated from deploy/.env, and an unset one stops compose with a message.
            assert env[var] == f"${{{var}:?set {var}}}"
        assert service["read_only"] is True and service["cap_drop"] == ["ALL"]
    migrate = compose()["services"]["migrate"]
    assert set(migrate["environment"]) == {"DATABASE_URL", "EFFECTGATE_CONFIG"}
    # The owner's URL: the POSTGRES_USER that owns the database, which creates and alters the schema.
    assert migrate["environment"]["DATABASE_URL"] == (
        "postgresql://effectgate:${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD}@postgres:5432/effectgate"
    )
    assert compose()["services"]["postgres"]["environment"]["POSTGRES_USER"] == "effectgate"
    # Every variable compose interpolates is in the example .env, the new runtime password too.
    example = (DEPLOY / "compose.env.example").read_text()
    listed = set(re.findall(r"^([A-Z_]+)=", example, flags=re.M))
    used = set(re.findall(r"\$\{([A-Z_]+):\?", (DEPLOY / "compose.yaml").read_text()))
    assert used == listed
    assert migrate["read_only"] is True and migrate["cap_drop"] == ["ALL"]


# -- Kubernetes -----------------------------------------------------------------------------------


@functools.cache
def rendered() -> list[dict[str, Any]]:
    """The CI overlay as kustomize renders it (what deploy-run starts; the base plus the local image)."""
    return kustomize.render(kustomize.CI_OVERLAY)


def manifests() -> dict[tuple[str, str], dict[str, Any]]:
    """Rendered objects by kind and name, the name without the ConfigMap hash or the release suffix."""
    return kustomize.by_name(rendered())


def pod_specs() -> Iterator[tuple[str, dict[str, Any]]]:
    for (kind, name), doc in manifests().items():
        if kind in ("Deployment", "Job"):
            yield name, doc["spec"]["template"]["spec"]


def container(name: str) -> dict[str, Any]:
    kind = "Job" if name == "effectgate-migrate" else "Deployment"
    containers: list[dict[str, Any]] = manifests()[(kind, name)]["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def test_the_manifests_are_the_expected_set() -> None:
    assert set(manifests()) == {
        ("ConfigMap", "effectgate-config"),
        ("Job", "effectgate-migrate"),
        ("Deployment", "effectgate-gateway"),
        ("Service", "effectgate-gateway"),
        ("Service", "effectgate-operator"),
        ("PodDisruptionBudget", "effectgate-gateway"),
        ("HorizontalPodAutoscaler", "effectgate-gateway"),
        ("Deployment", "effectgate-worker"),
        ("PodDisruptionBudget", "effectgate-worker"),
        ("HorizontalPodAutoscaler", "effectgate-worker"),
        ("NetworkPolicy", "effectgate-gateway"),
        ("NetworkPolicy", "effectgate-worker"),
        ("NetworkPolicy", "effectgate-migrate"),
    }


def test_the_configmap_is_deploy_effectgate_toml_verbatim() -> None:
    assert manifests()[("ConfigMap", "effectgate-config")]["data"]["effectgate.toml"] == CONFIG_TEXT


@pytest.mark.parametrize(
    ("name", "command"),
    [("effectgate-migrate", "migrate"), ("effectgate-gateway", "serve"), ("effectgate-worker", "worker")],
)
def test_each_pod_runs_its_command_without_migrating_at_start(name: str, command: str) -> None:
    c = container(name)
    assert "command" not in c, "the image's ENTRYPOINT is effectgate; pods pass args"
    assert_production_command(c["args"], command)


def test_every_pod_is_locked_down_as_the_image_user() -> None:
    specs = dict(pod_specs())
    assert set(specs) == {"effectgate-migrate", "effectgate-gateway", "effectgate-worker"}
    for name, spec in specs.items():
        pod = spec["securityContext"]
        assert pod["runAsNonRoot"] is True, name
        assert pod["runAsUser"] == pod["runAsGroup"] == image_uid(), name
        assert pod["seccompProfile"] == {"type": "RuntimeDefault"}, name
        assert spec["automountServiceAccountToken"] is False, name
        c = spec["containers"][0]
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False, name
        assert sc["readOnlyRootFilesystem"] is True, name
        assert sc["runAsNonRoot"] is True and sc["privileged"] is False, name
        assert sc["capabilities"] == {"drop": ["ALL"]}, name
        # A read-only root needs a writable /tmp for anything that asks tempfile for a file.
        assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"], name
        resources = c["resources"]
        assert {"cpu", "memory"} <= set(resources["requests"]) and "memory" in resources["limits"], name


def test_the_gateway_probes_readyz_and_healthz_on_its_port() -> None:
    c = container("effectgate-gateway")
    args = command_args(c["args"])
    assert c["ports"] == [
        {"name": "http", "containerPort": args.port, "protocol": "TCP"},
        {"name": "operator", "containerPort": OPERATOR_PORT, "protocol": "TCP"},
    ]
    # The public port serves the probes (and webhooks); the operator port is reachable pod-wide.
    assert args.operator_host == "0.0.0.0"
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert command_args(c["args"]).forwarded_allow_ips, "behind an Ingress the proxy must be trusted"


def test_the_service_and_the_budget_select_the_gateway_pods() -> None:
    m = manifests()
    deployment = m[("Deployment", "effectgate-gateway")]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    service = m[("Service", "effectgate-gateway")]
    assert service["spec"]["selector"].items() <= labels.items()
    # The public Service reaches the webhook port only; the operator plane has a Service of its own.
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["http"]
    operator = m[("Service", "effectgate-operator")]
    assert operator["spec"]["selector"].items() <= labels.items()
    assert [p["targetPort"] for p in operator["spec"]["ports"]] == ["operator"]
    assert operator["spec"]["type"] == "ClusterIP"
    budget = m[("PodDisruptionBudget", "effectgate-gateway")]
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
    autoscaler = m[("HorizontalPodAutoscaler", "effectgate-gateway")]["spec"]
    assert 1 <= budget["spec"]["minAvailable"] < autoscaler["minReplicas"]


@pytest.mark.parametrize("name", ["effectgate-gateway", "effectgate-worker"])
def test_an_autoscaler_owns_each_deployments_replicas_and_a_budget_allows_drains(name: str) -> None:
    m = manifests()
    deployment = m[("Deployment", name)]
    # A replica count in the manifest would be put back by every apply, fighting the autoscaler.
    assert "replicas" not in deployment["spec"], name
    autoscaler = m[("HorizontalPodAutoscaler", name)]["spec"]
    assert autoscaler["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": name}
    assert 2 <= autoscaler["minReplicas"] <= autoscaler["maxReplicas"]
    # CPU is the metric a cluster has without an adapter; it needs the containers' CPU requests.
    assert [metric["resource"]["name"] for metric in autoscaler["metrics"]] == ["cpu"]
    assert "cpu" in deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]
    budget = m[("PodDisruptionBudget", name)]["spec"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert budget["selector"]["matchLabels"].items() <= labels.items()
    # Never a budget that blocks a drain at the fewest replicas the autoscaler keeps.
    assert budget.get("minAvailable", 0) < autoscaler["minReplicas"]
    assert budget.get("maxUnavailable", 1) >= 1


def test_the_worker_grace_period_exceeds_its_drain_timeout() -> None:
    spec = manifests()[("Deployment", "effectgate-worker")]["spec"]["template"]["spec"]
    configmap = manifests()[("ConfigMap", "effectgate-config")]["data"]["effectgate.toml"]
    in_cluster = parse(
        configmap, path="configmap", env=dict.fromkeys(config_env_names(), "placeholder-secret-0123456789")
    ).worker.drain_timeout
    assert spec["terminationGracePeriodSeconds"] >= in_cluster + STOP_MARGIN_SECONDS
    # Someone deleting drain_timeout from the ConfigMap falls back to the worker's default: still fits.
    assert spec["terminationGracePeriodSeconds"] >= DEFAULT_DRAIN_TIMEOUT + STOP_MARGIN_SECONDS


@pytest.mark.parametrize(
    ("name", "role"), [("effectgate-gateway", "gateway"), ("effectgate-worker", "worker")]
)
def test_secrets_come_from_the_secret_and_the_config_from_the_configmap(name: str, role: Role) -> None:
    c = container(name)
    env = {e["name"]: e for e in c["env"]}
    assert "DATABASE_URL" in env
    assert_role_secrets(set(env) - {"DATABASE_URL"}, role, name)
    for var, entry in env.items():
        assert "value" not in entry, f"{var} must come from the Secret, not the manifest"
        assert entry["valueFrom"]["secretKeyRef"]["name"] == "effectgate"
    # The runtime role's URL (docs/adr/0019, "Roles"), never the owner's that migrate gets.
    assert env["DATABASE_URL"]["valueFrom"]["secretKeyRef"]["key"] == "database-url"
    assert {"name": "config", "mountPath": "/etc/effectgate", "readOnly": True} in c["volumeMounts"]
    spec = manifests()[("Deployment", name)]["spec"]["template"]["spec"]
    configmap = manifests()[("ConfigMap", "effectgate-config")]["metadata"]["name"]
    assert {"name": "config", "configMap": {"name": configmap}} in spec["volumes"]


def test_the_migrate_job_needs_only_the_database() -> None:
    c = container("effectgate-migrate")
    assert [e["name"] for e in c["env"]] == ["DATABASE_URL"]
    # The owner role's URL: only migrate may create and alter the schema.
    assert c["env"][0]["valueFrom"]["secretKeyRef"] == {"name": "effectgate", "key": "owner-database-url"}
    job = manifests()[("Job", "effectgate-migrate")]["spec"]
    assert job["template"]["spec"]["restartPolicy"] == "Never"
    assert job["backoffLimit"] >= 1


# -- systemd --------------------------------------------------------------------------------------


def unit(name: str) -> dict[str, dict[str, list[str]]]:
    """A unit file as section -> key -> values (systemd allows a key more than once)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] = {}
    for line in (DEPLOY / "systemd" / name).read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        current.setdefault(key, []).append(value)
    return sections


UNITS = [
    "effectgate-migrate.service",
    "effectgate-gateway.service",
    "effectgate-worker.service",
    "effectgate-worker@.service",
]
SANDBOX = {
    "ProtectSystem": "strict",
    "ProtectHome": "yes",
    "PrivateTmp": "yes",
    "PrivateDevices": "yes",
    "NoNewPrivileges": "yes",
    "RemoveIPC": "yes",
    "PrivateMounts": "yes",
    "CapabilityBoundingSet": "",
    "AmbientCapabilities": "",
    "ProtectKernelTunables": "yes",
    "ProtectKernelModules": "yes",
    "ProtectControlGroups": "yes",
    "RestrictSUIDSGID": "yes",
    "RestrictNamespaces": "yes",
    "LockPersonality": "yes",
}


def test_the_units_are_the_expected_set() -> None:
    assert sorted(p.name for p in (DEPLOY / "systemd").glob("*.service")) == sorted(UNITS)


@pytest.mark.parametrize("name", UNITS)
def test_every_unit_is_sandboxed_and_runs_as_the_effectgate_user(name: str) -> None:
    service = unit(name)["Service"]
    for key, value in SANDBOX.items():
        assert service.get(key) == [value], f"{name}: {key}={value}"
    assert service["User"] == ["effectgate"]
    # The owner's DATABASE_URL for migrate alone; the runtime role's for the others (docs/adr/0019).
    wanted = "migrate.env" if name == "effectgate-migrate.service" else "effectgate.env"
    assert service["EnvironmentFile"] == [f"/etc/effectgate/{wanted}"]


@pytest.mark.parametrize(
    ("name", "command"),
    [
        ("effectgate-migrate.service", "migrate"),
        ("effectgate-gateway.service", "serve"),
        ("effectgate-worker.service", "worker"),
        ("effectgate-worker@.service", "worker"),
    ],
)
def test_every_unit_runs_its_command_without_migrating_at_start(name: str, command: str) -> None:
    (exec_start,) = unit(name)["Service"]["ExecStart"]
    exec_start = exec_start.replace("%i", "9101")  # the template's instance is its metrics port
    executable, *argv = shlex.split(exec_start)
    assert executable == "/opt/effectgate/bin/effectgate"
    assert_production_command(argv, command)


def test_the_migrate_oneshot_runs_before_gateway_and_worker() -> None:
    assert unit("effectgate-migrate.service")["Service"]["Type"] == ["oneshot"]
    for name in ("effectgate-gateway.service", "effectgate-worker.service", "effectgate-worker@.service"):
        sections = unit(name)
        assert "effectgate-migrate.service" in " ".join(sections["Unit"]["After"]).split()
        assert "effectgate-migrate.service" in " ".join(sections["Unit"]["Wants"]).split()
        assert sections["Service"]["Environment"] == ["EFFECTGATE_CONFIG=/etc/effectgate/effectgate.toml"]


@pytest.mark.parametrize(
    ("name", "role"),
    [
        ("effectgate-gateway.service", "gateway"),
        ("effectgate-worker.service", "worker"),
        ("effectgate-worker@.service", "worker"),
        ("effectgate-migrate.service", None),
    ],
)
def test_every_unit_loads_exactly_its_roles_secrets_as_credentials(name: str, role: Role | None) -> None:
    credentials = unit(name)["Service"].get("LoadCredential", [])
    names = set()
    for entry in credentials:
        credential, _, path = entry.partition(":")
        assert path == f"/etc/effectgate/credentials/{credential}", entry
        names.add(credential)
    if role is None:
        assert names == set()
    else:
        assert_role_secrets(names, role, name)


def test_the_gateway_unit_listens_on_loopback_and_trusts_only_the_local_proxy() -> None:
    (exec_start,) = unit("effectgate-gateway.service")["Service"]["ExecStart"]
    args = command_args(shlex.split(exec_start)[1:])
    assert args.host == "127.0.0.1"
    assert args.forwarded_allow_ips == ("127.0.0.1",)
    # The operator plane as the configuration says: apart, on loopback.
    assert args.operator_port is None and args.operator_host is None


@pytest.mark.parametrize("name", ["effectgate-worker.service", "effectgate-worker@.service"])
def test_the_worker_unit_waits_longer_than_the_drain(name: str) -> None:
    service = unit(name)["Service"]
    assert service["KillSignal"] == ["SIGTERM"]
    (timeout,) = service["TimeoutStopSec"]
    assert int(timeout) >= max(drain_timeout(), DEFAULT_DRAIN_TIMEOUT) + STOP_MARGIN_SECONDS


def test_the_worker_template_is_the_worker_unit_with_the_instance_as_its_metrics_port() -> None:
    single, template = unit("effectgate-worker.service"), unit("effectgate-worker@.service")
    (exec_start,) = template["Service"]["ExecStart"]
    assert command_args(shlex.split(exec_start.replace("%i", "9101"))[1:]).metrics_port == 9101
    for section in single:
        differs = {"Unit": {"Description"}, "Service": {"ExecStart"}}.get(section, set())
        assert {k: v for k, v in single[section].items() if k not in differs} == {
            k: v for k, v in template[section].items() if k not in differs
        }, section


@pytest.mark.parametrize("name", [u for u in UNITS if u != "effectgate-migrate.service"])
def test_a_configuration_mistake_exit_2_is_not_restarted(name: str) -> None:
    service = unit(name)["Service"]
    assert service["Restart"] == ["on-failure"]
    assert service["RestartPreventExitStatus"] == ["2"]


def alert_commands() -> list[tuple[str, str]]:
    """Every `effectgate …` command an alert's annotations tell the operator to run, its template variables
    filled in the way an alert would fill them."""
    rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    fill = {"{{ $labels.source }}": "stripe", "{{ $labels.kind }}": "fulfil", "JOB_ID": "42", "…": "handled"}
    found = []
    for group in rules["groups"]:
        for rule in group["rules"]:
            for text in rule.get("annotations", {}).values():
                for command in re.findall(r"`(effectgate [^`]+)`", text):
                    for template, value in fill.items():
                        command = command.replace(template, value)
                    found.append((rule["alert"], command))
    return found


def test_the_alerts_name_commands_to_run() -> None:
    assert len(alert_commands()) >= 3


@pytest.mark.parametrize(("alert", "command"), alert_commands())
def test_every_command_an_alert_names_parses(
    alert: str, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Two annotations once named commands that did not exist (`effectgate rejects auth`) or flags a command
    # does not take; an operator paged at night copies them as written.
    try:
        command_args(shlex.split(command)[1:])
    except SystemExit:
        pytest.fail(f"{alert} names `{command}`, which effectgate refuses: {capsys.readouterr().err}")

"""``make deploy-run``: the deploy/ artefacts run under podman, not only linted.

1. **image**: base images from Debian's packages (deploy/ci/base-images.sh), ``deploy/Dockerfile`` built on
   Debian's Python, a derived image (``FROM effectgate``, a handler package pip-installed as the
   README says) built and imported as uid 10001; then the image run with the deploy flags (read-only
   root, every capability dropped, uid 10001): ``/healthz``, the image's HEALTHCHECK turning healthy,
   a signed delivery through the published port answered 202 and run once by a worker container (the
   database says so), the same delivery again answered 200 as a duplicate, and SIGTERM stopping both
   cleanly within their grace periods.
2. **compose**: deploy/compose.yaml under podman-compose, in the order its ``depends_on`` promises;
   a delivery runs once, a second is a duplicate; ``down`` leaves nothing running and keeps the volume.
3. **kubernetes**: each container of the rendered CI overlay (kustomize; deploy/kubernetes) started with the manifest's args, env
   names, user and read-only root; its probes' paths requested on the ports they name, its preStop
   command run, and SIGTERM within terminationGracePeriodSeconds.

Run as root on a machine with podman, runc, debootstrap, podman-compose and the CNI dnsname plugin (.ci/run
installs them); ``main`` checks for each before any image work and names every one missing. No image registry
is needed. Every container, network and volume it makes is named ``effectgate-ci*`` and removed at
the end, pass or fail. Exits 1 on the first miss, naming it; prints a summary either way.
"""

from __future__ import annotations

import argparse
import copy
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from tests.container import kustomize

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
WORK = ROOT / "build" / "deploy-run"
IMAGE = "localhost/effectgate:0.3.0"
DERIVED = "localhost/effectgate-ci-derived:0.1.0"
PYTHON_BASE = "localhost/python:3.11-slim-bookworm"
POSTGRES_BASE = "localhost/postgres:15-bookworm"
PREFIX = "effectgate-ci"
RUNTIME_ROLE = "effectgate_app"
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
FAKE_PORT = 8001
# These machines: hybrid cgroups (crun refuses them) and a hard nofile limit below podman's default.
CONTAINERS_CONF = """\
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]
[engine]
runtime = "runc"
"""
# The deploy flags every effectgate container runs with here (compose and the manifests say the same).
LOCKED_DOWN = [
    *("--read-only", "--tmpfs", "/tmp", "--cap-drop", "ALL", "--security-opt", "no-new-privileges"),
    *("--user", "10001:10001"),
]


class Miss(Exception):
    """A check that did not hold: the run fails, naming it."""


summary: list[str] = []


def say(line: str) -> None:
    print(f"deploy-run: {line}", flush=True)


def record(line: str) -> None:
    summary.append(line)
    say(line)


def podman(*args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, check=False)
    if check and done.returncode != 0:
        raise Miss(f"podman {' '.join(args[:3])} … exited {done.returncode}: {done.stderr.strip()[-600:]}")
    return done


def wait_for(what: str, probe: Callable[[], bool], timeout: float, *, container: str | None = None) -> float:
    """Poll ``probe`` until it is true; the seconds it took. A miss after ``timeout`` seconds, or at
    once if ``container`` has exited meanwhile (a bad flag, a crash), with its last log lines."""
    started = time.monotonic()
    while not probe():
        if container is not None:
            state = podman(
                "inspect", container, "--format", "{{.State.Status}} {{.State.ExitCode}}", check=False
            )
            if not state.stdout.startswith("running"):
                logs = podman("logs", "--tail", "15", container, check=False)
                raise Miss(
                    f"{what}: {container} is {state.stdout.strip()}\n{(logs.stdout + logs.stderr).strip()}"
                )
        if time.monotonic() - started > timeout:
            raise Miss(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.5)
    return time.monotonic() - started


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def http_get(url: str, token: str | None = None) -> int:
    """The status of GET ``url``; 0 when nothing answers."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=3) as response:
            status: int = response.status
            return status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (OSError, urllib.error.URLError):
        return 0


# -- setup --------------------------------------------------------------------------------------------


def ci_config_text(text: str, fake_host: str) -> str:
    """``text`` (an effectgate.toml) with every downstream base_url pointed at the fake providers on
    ``fake_host``: nothing a handler does leaves this machine. The only change made to a deploy config."""
    changed, count = re.subn(
        r'^base_url = "[^"]*"$', f'base_url = "http://{fake_host}:{FAKE_PORT}"', text, flags=re.M
    )
    if count == 0:
        raise Miss("the configuration names no downstream base_url to point at the fake providers")
    return changed


def pip_conf() -> str:
    """The pip configuration build steps use: this machine's CA bundle (mounted at the same path) and
    whichever index or proxy the host's pip is set up with; local file:// indexes do not exist inside."""
    settings = {"cert": CA_BUNDLE}
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
    ).stdout
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        name = key.rpartition(".")[2]
        value = value.strip().strip("'")
        if (
            name in {"index-url", "proxy", "trusted-host", "timeout", "default-timeout"}
            and "file:" not in value
        ):
            settings[name] = value
    for env, name in (("PIP_INDEX_URL", "index-url"), ("HTTPS_PROXY", "proxy"), ("https_proxy", "proxy")):
        if os.environ.get(env):
            settings[name] = os.environ[env]
    return "[global]\n" + "".join(f"{name} = {value}\n" for name, value in settings.items())


def cleanup() -> None:
    """Every container, pod, network and volume this run (or an earlier one) named effectgate-ci*."""
    names = podman("ps", "-a", "--format", "{{.Names}}", check=False).stdout.split()
    ours = [n for n in names if n.startswith(PREFIX)]
    if ours:
        podman("rm", "--force", "--time", "0", *ours, check=False)
    pods = podman("pod", "ls", "--format", "{{.Name}}", check=False).stdout.split()
    for pod in pods:
        if pod.startswith(PREFIX) or pod.startswith(f"pod_{PREFIX}"):
            podman("pod", "rm", "--force", pod, check=False)
    for kind in ("network", "volume"):
        listed = podman(kind, "ls", "--format", "{{.Name}}", check=False).stdout.split()
        mine = [n for n in listed if n.startswith(PREFIX)]
        if mine:
            podman(kind, "rm", "--force", *mine, check=False)


def build_images() -> None:
    started = time.monotonic()
    subprocess.run([str(DEPLOY / "ci" / "base-images.sh")], check=True, stdout=subprocess.DEVNULL)
    say(f"base images ready ({time.monotonic() - started:.0f} s)")
    (WORK / "pip.conf").write_text(pip_conf())
    mounts = ["-v", f"{CA_BUNDLE}:{CA_BUNDLE}:ro", "-v", f"{WORK / 'pip.conf'}:/etc/pip.conf:ro"]
    started = time.monotonic()
    # --format docker: the OCI format has no HEALTHCHECK. The ignore file is the Dockerfile's own.
    podman(
        "build", "--format", "docker", "--tag", IMAGE, "--build-arg", f"PYTHON_IMAGE={PYTHON_BASE}",
        *mounts, "--ignorefile", str(DEPLOY / "Dockerfile.dockerignore"), "--file", str(DEPLOY / "Dockerfile"),
        str(ROOT), timeout=1800,
    )  # fmt: skip
    size = int(podman("image", "inspect", IMAGE, "--format", "{{.Size}}").stdout)
    record(f"image {IMAGE} built on {PYTHON_BASE} in {time.monotonic() - started:.0f} s: {size / 1e6:.0f} MB")
    user = podman("image", "inspect", IMAGE, "--format", "{{.Config.User}}").stdout.strip()
    if user != "10001:10001":
        raise Miss(f"the image's user is {user!r}, not 10001:10001")
    # A derived image the way deploy/README.md ("Your own handlers") says to make one.
    derived = DEPLOY / "ci" / "derived"
    podman(
        "build", "--format", "docker", "--tag", DERIVED, "--build-arg", f"EFFECTGATE_IMAGE={IMAGE}", *mounts,
        "--file", str(derived / "Containerfile"), str(derived), timeout=900,
    )  # fmt: skip
    imported = podman(
        "run", "--rm", *LOCKED_DOWN, "--entrypoint", "python", DERIVED, "-c",
        "import effectgate_ci_handlers as m, effectgate; print(m.__file__, m.handled())",
    ).stdout.strip()  # fmt: skip
    if not imported.startswith("/opt/effectgate/") or "ci_handlers.noted" not in imported:
        raise Miss(f"the derived image's handler package: {imported!r}")
    record(f"derived image (FROM effectgate, pip install as root, USER 10001): imports {imported}")


# -- the image, run -----------------------------------------------------------------------------------


class Stack:
    """Postgres, the fake providers and the effectgate containers on one podman network."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.network = name
        self.password = secrets.token_hex(12)
        self.secrets = {
            "STRIPE_WEBHOOK_SECRET": "whsec_" + secrets.token_hex(16),
            "EFFECTGATE_OPERATOR_TOKEN": secrets.token_hex(16),
            "EFFECTGATE_SESSION_SECRET": secrets.token_hex(32),
            "EFFECTGATE_METRICS_TOKEN": secrets.token_hex(16),
            "PAYMENTS_API_KEY": "sk_test_" + secrets.token_hex(8),
            "SHIPPING_API_KEY": secrets.token_hex(8),
        }
        self.database_url = f"postgresql://effectgate:{self.password}@{name}-postgres:5432/effectgate"
        # The runtime role deploy/runtime-role.sql makes (docs/adr/0019-own-schema.md, "Roles").
        self.app_password = secrets.token_hex(12)
        self.runtime_url = f"postgresql://{RUNTIME_ROLE}:{self.app_password}@{name}-postgres:5432/effectgate"
        self.config = WORK / f"{name}.toml"
        self.postgres = f"{name}-postgres"

    def start(self, config_text: str) -> None:
        self.config.write_text(ci_config_text(config_text, f"{self.name}-fake"))
        podman("network", "create", self.network)
        podman(
            "run", "--detach", "--name", f"{self.name}-postgres", "--network", self.network,
            "-e", "POSTGRES_USER=effectgate", "-e", "POSTGRES_DB=effectgate", "-e", f"POSTGRES_PASSWORD={self.password}",
            "-v", f"{DEPLOY / 'ci' / 'postgres-entrypoint.sh'}:/ci/postgres-entrypoint.sh:ro",
            "--entrypoint", "/ci/postgres-entrypoint.sh", POSTGRES_BASE, "postgres",
        )  # fmt: skip
        self.effectgate("fake", ["fake-providers", "--host", "0.0.0.0", "--port", str(FAKE_PORT)])
        wait_for("postgres accepts connections", lambda: self.sql("select 1") == "1", 120)

    def effectgate(
        self, role: str, args: Sequence[str], *, env: Sequence[str] = (), extra: Sequence[str] = ()
    ) -> str:
        """Start an effectgate container ``NAME-role`` with the deploy flags; its name."""
        name = f"{self.name}-{role}"
        podman(
            "run", "--detach", "--name", name, "--network", self.network, *LOCKED_DOWN,
            "-v", f"{self.config}:/etc/effectgate/effectgate.toml:ro", "-e", f"DATABASE_URL={self.database_url}",
            *(a for e in env for a in ("-e", f"{e}={self.secrets[e]}")), *extra, IMAGE, *args,
        )  # fmt: skip
        return name

    def create_runtime_role(self) -> None:
        """deploy/runtime-role.sql, run in the Postgres container as the owner, as an operator runs it
        after ``migrate``."""
        done = subprocess.run(
            ["podman", "exec", "-i", "-e", f"EFFECTGATE_APP_PASSWORD={self.app_password}", self.postgres,
             "psql", "-X", "-U", "effectgate", "-d", "effectgate", "-f", "-"],
            input=(DEPLOY / "runtime-role.sql").read_text(), capture_output=True, text=True, timeout=60,
            check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise Miss(f"deploy/runtime-role.sql exited {done.returncode}: {done.stderr.strip()[-600:]}")

    def as_runtime_role(self, statement: str) -> subprocess.CompletedProcess[str]:
        """``statement`` sent as the runtime role over TCP with its password, from inside the Postgres
        container (its psql)."""
        return podman(
            "exec", "-e", f"PGPASSWORD={self.app_password}", self.postgres, "psql", "-X", "-h", "127.0.0.1",
            "-U", RUNTIME_ROLE, "-d", "effectgate", "-v", "ON_ERROR_STOP=1", "-Atc", statement, check=False,
        )  # fmt: skip

    def runtime_role_cannot_alter(self) -> str:
        """A miss unless the runtime role can read the ledger but is refused ALTER TABLE and CREATE TABLE
        in its schema, and the server says it holds no role attribute that would let it; what Postgres
        answered, for the run's summary."""
        read = self.as_runtime_role("select count(*) from effectgate.jobs")
        if read.returncode != 0:
            raise Miss(f"the runtime role cannot read effectgate.jobs: {read.stderr.strip()}")
        refusals = []
        for statement in (
            "ALTER TABLE effectgate.jobs ADD COLUMN x int",
            "CREATE TABLE effectgate.x (y int)",
        ):
            done = self.as_runtime_role(statement)
            refused = re.search(r"ERROR:\s+(.*)", done.stderr)
            if (
                done.returncode == 0
                or not refused
                or not re.search("must be owner|permission denied", refused[1])
            ):
                raise Miss(
                    f"the runtime role ran {statement!r}: exit {done.returncode} {done.stderr.strip()!r}"
                )
            refusals.append(f"{statement} → {refused[1].strip()}")
        attributes = self.sql(
            "select rolsuper or rolcreaterole or rolcreatedb or rolbypassrls from pg_roles "
            f"where rolname = '{RUNTIME_ROLE}'"
        )
        if attributes != "f":
            raise Miss(f"{RUNTIME_ROLE} holds superuser, createrole, createdb or bypassrls ({attributes!r})")
        return "; ".join(refusals)

    def connected_roles(self) -> dict[str, int]:
        """Client connections to the effectgate database by role, this query's own left out."""
        rows = self.sql(
            "select usename || ' ' || count(*) from pg_stat_activity where datname = 'effectgate' "
            "and backend_type = 'client backend' and pid <> pg_backend_pid() group by usename order by 1"
        )
        return {role: int(n) for role, n in (row.split() for row in rows.splitlines())}

    def sql(self, query: str) -> str:
        done = podman(
            "exec", self.postgres, "psql", "-U", "effectgate", "-d", "effectgate",
            "-XAtc", query, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            return ""
        return done.stdout.strip()

    def send(self, port: int, event_id: str) -> tuple[int, str]:
        """``effectgate send`` (the host's) of a Stripe example event, signed, to the published port."""
        done = subprocess.run(
            [sys.executable, "-m", "effectgate.gateway.cli", "send", "--config", str(self.config),
             "--source", "stripe", "--example", "payment_intent.succeeded", "--event-id", event_id,
             "--url", f"http://127.0.0.1:{port}"],
            capture_output=True, text=True, timeout=60, check=False,
            env={**os.environ, **self.secrets},  # send loads the whole configuration
        )  # fmt: skip
        answer = done.stdout.strip()
        match = re.match(r"(\d{3}) ", answer)
        if not match:
            raise Miss(f"effectgate send: no answer ({done.stderr.strip()[-400:]})")
        return int(match[1]), answer

    def effect_rows(self) -> str:
        """Per effect: its delivery count, its job's state and attempts, and its steps."""
        return self.sql(
            "select e.delivery_count || ' ' || j.state || ' ' || j.attempt || ' ' || "
            "(select count(*) from steps s where s.effect_id = e.id and s.status = 'succeeded') "
            "from effects e join jobs j on j.effect_id = e.id order by e.id"
        )


def stop(container: str, grace: int) -> float:
    """SIGTERM (the image's STOPSIGNAL), SIGKILL only after ``grace`` s; a miss unless it exits 0 in time."""
    started = time.monotonic()
    podman("stop", "--time", str(grace), container, timeout=grace + 30)
    took = time.monotonic() - started
    code = podman("inspect", container, "--format", "{{.State.ExitCode}}").stdout.strip()
    if code != "0" or took >= grace:
        logs = podman("logs", "--tail", "15", container, check=False).stderr.strip()
        raise Miss(f"{container}: SIGTERM → exit {code} after {took:.1f} s (grace {grace} s)\n{logs}")
    return took


def health(container: str) -> bool:
    """``podman healthcheck run`` (the image's HEALTHCHECK, now) passes and the container says healthy."""
    if podman("healthcheck", "run", container, check=False).returncode != 0:
        return False
    status = podman("inspect", container, "--format", "{{.State.Health.Status}}", check=False).stdout.strip()
    return status == "healthy"


def run_image() -> None:
    stack = Stack(f"{PREFIX}-image")
    stack.start((DEPLOY / "effectgate.toml").read_text())
    migrate = stack.effectgate("migrate", ["migrate"], extra=["--no-healthcheck"])
    code = podman("wait", migrate, timeout=180).stdout.strip()
    if code != "0":
        raise Miss(f"migrate exited {code}: {podman('logs', migrate, check=False).stderr[-600:]}")
    port = free_port()
    gateway = stack.effectgate(
        "gateway", [], env=["STRIPE_WEBHOOK_SECRET", "EFFECTGATE_OPERATOR_TOKEN", "EFFECTGATE_SESSION_SECRET",
                            "EFFECTGATE_METRICS_TOKEN"], extra=["--publish", f"127.0.0.1:{port}:8000"],
    )  # fmt: skip
    took = wait_for("GET /healthz on the published port answers 200", lambda: http_get(
        f"http://127.0.0.1:{port}/healthz") == 200, 90, container=gateway)  # fmt: skip
    ready = http_get(f"http://127.0.0.1:{port}/readyz")
    if ready != 200:
        raise Miss(f"GET /readyz answered {ready}")
    record(f"image run read-only, --cap-drop ALL, uid 10001: /healthz 200 after {took:.1f} s, /readyz 200")
    took = wait_for(
        "the image's HEALTHCHECK (podman healthcheck run) reports healthy", lambda: health(gateway), 60
    )
    record(f"HEALTHCHECK: healthy (podman healthcheck run, after {took:.1f} s more)")
    worker = stack.effectgate(
        "worker", ["worker", "--no-migrate"], env=["PAYMENTS_API_KEY", "SHIPPING_API_KEY", "EFFECTGATE_METRICS_TOKEN"],
        extra=["--no-healthcheck"],
    )  # fmt: skip
    event = f"evt_ci_{secrets.token_hex(6)}"
    status, answer = stack.send(port, event)
    if status != 202:
        raise Miss(f"first delivery: {answer}")
    took = wait_for(
        "the worker container runs the effect", lambda: stack.effect_rows() == "1 succeeded 1 1", 90
    )
    record(f"signed delivery via 127.0.0.1:{port}: {status}; the worker container ran it in {took:.1f} s")
    status, answer = stack.send(port, event)
    if status != 200 or "duplicate" not in answer:
        raise Miss(f"the same delivery again: {answer}")
    rows = stack.effect_rows()
    if rows != "2 succeeded 1 1":
        raise Miss(f"after the duplicate the ledger says {rows!r}, not one effect run once seen twice")
    record(
        f"the same delivery again: {status} duplicate; ledger: 1 effect, 1 attempt, 1 step (ship), seen 2 times"
    )
    took_gateway = stop(gateway, 30)
    took_worker = stop(worker, 45)
    record(
        f"SIGTERM: gateway exit 0 in {took_gateway:.1f} s (grace 30 s), worker exit 0 in {took_worker:.1f} s (grace 45 s)"
    )


# -- Kubernetes -------------------------------------------------------------------------------------


def manifest_containers() -> list[dict[str, Any]]:
    """Each container of the rendered CI overlay (deploy/kubernetes/overlays/ci through kustomize: the
    base with the locally built image) with what starting it needs: its pod spec and its image."""
    found = []
    for document in kustomize.render(kustomize.CI_OVERLAY):
        if document["kind"] not in {"Deployment", "Job"}:
            continue
        pod = document["spec"]["template"]["spec"]
        for container in pod["containers"]:
            found.append(
                {
                    "file": f"{document['kind']}/{document['metadata']['name']}",
                    "kind": document["kind"],
                    "pod": pod,
                    "container": container,
                }
            )
    return found


def configmap_toml() -> str:
    """effectgate.toml of the rendered ConfigMap (configMapGenerator, named by its content hash)."""
    (document,) = [d for d in kustomize.render(kustomize.CI_OVERLAY) if d["kind"] == "ConfigMap"]
    text: str = document["data"]["effectgate.toml"]
    return text


def probe_port(container: dict[str, Any], port: int | str) -> int:
    if isinstance(port, int):
        return port
    for declared in container.get("ports", []):
        if declared["name"] == port:
            number: int = declared["containerPort"]
            return number
    raise Miss(f"{container['name']}: a probe names port {port!r}, which the container does not declare")


def run_kubernetes() -> None:
    stack = Stack(f"{PREFIX}-k8s")
    stack.start(configmap_toml())
    # The Secret's two database URLs (deploy/README.md, "Kubernetes"): the owner's for the migrate Job,
    # the runtime role's, made after the Job as the README says, for the gateway and the worker.
    urls = {"owner-database-url": stack.database_url, "database-url": stack.runtime_url}
    role_made = False
    # The manifests' secretKeyRef keys, mapped to the variables they fill.
    for item in sorted(manifest_containers(), key=lambda i: i["kind"] != "Job"):
        pod, container = item["pod"], item["container"]
        name = container["name"]
        context = {**pod.get("securityContext", {}), **container.get("securityContext", {})}
        flags = ["--user", f"{context['runAsUser']}:{context['runAsGroup']}"]
        if context.get("readOnlyRootFilesystem"):
            flags.append("--read-only")
        flags += [a for cap in context["capabilities"]["drop"] for a in ("--cap-drop", cap)]
        flags += ["--tmpfs", "/tmp", "--no-healthcheck"]  # Kubernetes ignores the image's HEALTHCHECK
        names = [e["name"] for e in container.get("env", []) if e["name"] != "DATABASE_URL"]
        (key,) = [
            e["valueFrom"]["secretKeyRef"]["key"]
            for e in container.get("env", [])
            if e["name"] == "DATABASE_URL"
        ]
        if key not in urls:
            raise Miss(f"{item['file']}: DATABASE_URL from the Secret key {key!r}, not one of {sorted(urls)}")
        if key == "database-url" and not role_made:
            stack.create_runtime_role()
            role_made = True
        ports = {p["containerPort"]: free_port() for p in container.get("ports", [])}
        publish = [a for inner, outer in ports.items() for a in ("--publish", f"127.0.0.1:{outer}:{inner}")]
        command = container.get("command", [])
        args = container.get("args", [])
        entry = ["--entrypoint", command[0]] if command else []
        cid = f"{stack.name}-{name}"
        if container["image"] != IMAGE:
            raise Miss(
                f"{item['file']}: the rendered image is {container['image']}, deploy-run built {IMAGE}"
            )
        podman(
            "run", "--detach", "--name", cid, "--network", stack.network, *flags, *publish, *entry,
            "-v", f"{stack.config}:/etc/effectgate/effectgate.toml:ro", "-e", f"DATABASE_URL={urls[key]}",
            *(a for e in names for a in ("-e", f"{e}={stack.secrets[e]}")), IMAGE, *command[1:], *args,
        )  # fmt: skip
        if item["kind"] == "Job":
            code = podman("wait", cid, timeout=300).stdout.strip()
            if code != "0":
                raise Miss(
                    f"{item['file']} {name} {args}: exit {code}: {podman('logs', cid, check=False).stderr[-600:]}"
                )
            record(f"kubernetes {item['file']}: {name} {' '.join(args)} as the owner ({key}) → exit 0")
            continue
        checked = []
        for kind in ("readinessProbe", "livenessProbe", "startupProbe"):
            probe = container.get(kind)
            if not probe:
                continue
            get = probe["httpGet"]
            url = f"http://127.0.0.1:{ports[probe_port(container, get['port'])]}{get['path']}"
            wait_for(
                f"{item['file']} {kind} GET {get['path']} answers 200",
                lambda u=url: http_get(u) == 200,
                90,
                container=cid,
            )
            checked.append(f"{kind} {get['path']} 200")
        if name == "worker" and "--metrics-port" in args:
            metrics = int(args[args.index("--metrics-port") + 1])
            url = f"http://127.0.0.1:{ports[metrics]}/metrics"
            token = stack.secrets["EFFECTGATE_METRICS_TOKEN"]
            wait_for(
                f"{item['file']} GET /metrics answers 200",
                lambda u=url, t=token: http_get(u, t) == 200,
                90,
                container=cid,
            )
            checked.append("/metrics on its metrics port 200")
        operator = [p["containerPort"] for p in container.get("ports", []) if p["name"] == "operator"]
        if operator:
            # The operator plane's Service targets this port: /metrics must answer there, with the token.
            url = f"http://127.0.0.1:{ports[operator[0]]}/metrics"
            token = stack.secrets["EFFECTGATE_METRICS_TOKEN"]
            wait_for(
                f"{item['file']} GET /metrics on the operator port answers 200",
                lambda u=url, t=token: http_get(u, t) == 200,
                90,
                container=cid,
            )
            checked.append(f"/metrics on the operator port {operator[0]} 200")
        pre_stop = container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command")
        if pre_stop:
            podman("exec", cid, *pre_stop, timeout=120)
            checked.append(f"preStop {' '.join(pre_stop)} exit 0")
        connected = stack.connected_roles()
        if set(connected) != {RUNTIME_ROLE}:
            raise Miss(f"{item['file']}: connections by role {connected}, not {RUNTIME_ROLE} ({key}) alone")
        checked.append(f"connected as {RUNTIME_ROLE} ({key})")
        took = stop(cid, int(pod.get("terminationGracePeriodSeconds", 30)))
        checked.append(f"SIGTERM exit 0 in {took:.1f} s")
        record(f"kubernetes {item['file']}: {name} {' '.join(args)}: {', '.join(checked) or 'started'}")


# -- compose ----------------------------------------------------------------------------------------


COMPOSE_PROJECT = f"{PREFIX}-compose"


def ci_compose(data: dict[str, Any], ports: dict[str, int]) -> dict[str, Any]:
    """deploy/compose.yaml as CI runs it, with these changes and no others: Postgres from the local
    Debian image with deploy/ci/postgres-entrypoint.sh (Debian's package has no entrypoint), and so is
    every other service of Postgres's image (runtime-role, for its psql); the build
    context made absolute (the copy lives in build/deploy-run/compose/, beside the CI effectgate.toml its
    ``./effectgate.toml`` mounts); each published host port moved to a free one (``ports``: old → new);
    and a ``fake`` service, the fake providers the CI configuration's downstream base_urls name."""
    data = copy.deepcopy(data)  # anchors already resolved by the YAML loader
    services = data["services"]
    postgres = services["postgres"]
    for service in services.values():
        if service is not postgres and service.get("image") == postgres["image"]:
            service["image"] = POSTGRES_BASE
    postgres["image"] = POSTGRES_BASE
    postgres["entrypoint"] = ["/ci/postgres-entrypoint.sh"]
    postgres["volumes"].append(f"{DEPLOY / 'ci' / 'postgres-entrypoint.sh'}:/ci/postgres-entrypoint.sh:ro")
    for service in services.values():
        if "build" in service:
            service["build"] = {**service["build"], "context": str(ROOT)}
        moved = []
        for mapping in service.get("ports", []):
            host, _, rest = mapping.rpartition(":")
            address, _, port = host.rpartition(":")
            moved.append(f"{address}:{ports[port]}:{rest}")
        if moved:
            service["ports"] = moved
    fake = {
        key: services["worker"][key] for key in ("image", "read_only", "tmpfs", "security_opt", "cap_drop")
    }
    services["fake"] = {**fake, "command": ["fake-providers", "--host", "0.0.0.0", "--port", str(FAKE_PORT)]}
    return data


def start_order(services: dict[str, Any]) -> list[str]:
    """The services in an order their depends_on allows (dependencies first; ties by name)."""
    order: list[str] = []
    while len(order) < len(services):
        ready = sorted(
            name
            for name, service in services.items()
            if name not in order and all(dep in order for dep in service.get("depends_on", {}))
        )
        if not ready:
            raise Miss(f"compose: depends_on has a cycle among {sorted(set(services) - set(order))}")
        order.append(ready[0])
    return order


def run_compose() -> None:
    if shutil.which("podman-compose") is None:
        raise Miss("podman-compose is missing (apt-get install podman-compose)")
    directory = WORK / "compose"
    directory.mkdir(exist_ok=True)
    data = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    ports = {
        mapping.split(":")[-2]: free_port()
        for service in data["services"].values()
        for mapping in service.get("ports", [])
    }
    data = ci_compose(data, ports)
    (directory / "compose.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    stack = Stack(COMPOSE_PROJECT)
    stack.config = directory / "effectgate.toml"
    stack.config.write_text(ci_config_text((DEPLOY / "effectgate.toml").read_text(), "fake"))
    shutil.copyfile(DEPLOY / "runtime-role.sql", directory / "runtime-role.sql")  # ./runtime-role.sql
    stack.postgres = f"{COMPOSE_PROJECT}_postgres_1"
    env = {
        **os.environ,
        **stack.secrets,
        "POSTGRES_PASSWORD": stack.password,
        "EFFECTGATE_APP_PASSWORD": stack.app_password,
    }
    base = ["podman-compose", "--project-name", COMPOSE_PROJECT, "--file", str(directory / "compose.yaml")]

    def compose(*args: str) -> None:
        done = subprocess.run(
            [*base, *args], capture_output=True, text=True, env=env, timeout=600, check=False
        )
        if done.returncode != 0:
            raise Miss(
                f"podman-compose {' '.join(args)}: exit {done.returncode}: {done.stderr.strip()[-800:]}"
            )

    services = data["services"]
    # podman-compose 1.0.3 starts services in depends_on order but waits for no condition
    # (service_healthy, service_completed_successfully), and `up SERVICE` restarts SERVICE's exited
    # dependencies (migrate again). So it creates every container as the file says (`up --no-start`),
    # and each service is started here once what it depends on meets the condition the file names.
    compose("up", "--no-start")
    order = start_order(services)
    containers: dict[str, list[str]] = {}
    for name in order:
        for dep, condition in services[name].get("depends_on", {}).items():
            wanted = condition["condition"] if isinstance(condition, dict) else "service_started"
            for container in containers[dep]:
                if wanted == "service_healthy":
                    wait_for(f"compose {dep} healthy before {name}", lambda c=container: health(c), 120)
                elif wanted == "service_completed_successfully":
                    code = podman("wait", container, timeout=300).stdout.strip()
                    if code != "0":
                        logs = podman("logs", container, check=False).stderr[-600:]
                        raise Miss(f"compose {dep} exited {code} before {name} could start: {logs}")
        replicas = int(services[name].get("deploy", {}).get("replicas", 1))
        containers[name] = [f"{COMPOSE_PROJECT}_{name}_{n}" for n in range(1, replicas + 1)]
        podman("start", *containers[name])
    # The order as it happened: each container started after every container it depends on started,
    # and after a dependency it waits to complete had finished.
    times = {
        c: [int(x) for x in podman("inspect", c, "--format", "{{.State.StartedAt.UnixNano}} "
                                   "{{.State.FinishedAt.UnixNano}}").stdout.split()]
        for cs in containers.values()
        for c in cs
    }  # fmt: skip
    for name in order:
        for dep, condition in services[name].get("depends_on", {}).items():
            completed = (
                isinstance(condition, dict) and condition["condition"] == "service_completed_successfully"
            )
            for container in containers[name]:
                for before in containers[dep]:
                    if times[container][0] <= times[before][1 if completed else 0]:
                        raise Miss(
                            f"compose: {container} started before {before} {'finished' if completed else 'started'}"
                        )
    record(
        f"compose up in the file's order: {' → '.join(order)} ({len(times)} containers; migrate, then runtime-role, exit 0 before gateway and worker started)"
    )
    running = podman(
        "ps", "--filter", f"label=io.podman.compose.project={COMPOSE_PROJECT}", "--format", "{{.Names}}"
    )
    for name in ("gateway", "worker"):
        for container in containers[name]:
            if container not in running.stdout.split():
                raise Miss(
                    f"compose: {container} is not running: {podman('logs', container, check=False).stderr[-600:]}"
                )
    port = ports["8000"]
    wait_for(
        "compose gateway /readyz answers 200",
        lambda: http_get(f"http://127.0.0.1:{port}/readyz") == 200,
        90,
        container=f"{COMPOSE_PROJECT}_gateway_1",
    )
    event = f"evt_ci_{secrets.token_hex(6)}"
    first, answer = stack.send(port, event)
    if first != 202:
        raise Miss(f"compose: first delivery: {answer}")
    wait_for("compose: a worker runs the effect", lambda: stack.effect_rows() == "1 succeeded 1 1", 90)
    second, answer = stack.send(port, event)
    if second != 200 or "duplicate" not in answer or stack.effect_rows() != "2 succeeded 1 1":
        raise Miss(f"compose: the same delivery again: {answer}; ledger {stack.effect_rows()!r}")
    record(f"compose delivery via 127.0.0.1:{port}: {first}, run once by a worker; again: {second} duplicate")
    # Gateway and workers connected as the runtime role only, and that role cannot change the schema.
    roles = stack.connected_roles()
    if set(roles) != {RUNTIME_ROLE}:
        raise Miss(
            f"compose: the gateway's and workers' connections are by role {roles}, not {RUNTIME_ROLE} alone"
        )
    refusals = stack.runtime_role_cannot_alter()
    record(
        f"compose runtime role: gateway and workers connected as {RUNTIME_ROLE} only ({roles[RUNTIME_ROLE]} "
        f"connections, none as the owner effectgate); as {RUNTIME_ROLE}: {refusals}"
    )
    # Down, each container given its stop_grace_period (podman-compose 1.0.3's down uses one -t for
    # all, default 1 s): SIGTERM in reverse start order, each must exit 0 within its grace.
    stops = []
    for name in reversed(order):
        grace = int(seconds_of(services[name].get("stop_grace_period", "10s")))
        for container in containers[name]:
            if podman("inspect", container, "--format", "{{.State.Running}}").stdout.strip() == "true":
                stops.append(f"{container.removeprefix(COMPOSE_PROJECT + '_')} {stop(container, grace):.1f}s")
    compose("down")
    left = podman(
        "ps", "-a", "--filter", f"label=io.podman.compose.project={COMPOSE_PROJECT}", "--format", "{{.Names}}"
    )
    if left.stdout.strip():
        raise Miss(f"compose down left containers: {left.stdout.split()}")
    volume = f"{COMPOSE_PROJECT}_pgdata"
    if podman("volume", "exists", volume, check=False).returncode != 0:
        raise Miss(f"compose down removed the volume {volume}")
    record(
        f"compose down: SIGTERM exit 0 for each ({', '.join(stops)}); no container left; volume {volume} kept"
    )


def seconds_of(duration: str) -> float:
    match = re.fullmatch(r"(\d+)(s|m)", duration)
    if not match:
        raise Miss(f"compose: stop_grace_period {duration!r} is not N s or N m")
    return int(match[1]) * (60 if match[2] == "m" else 1)


# What each tool of the run is and which Debian package brings it (.ci/run installs them all).
TOOLS = {
    "podman": ("runs every container", "podman"),
    "runc": ("the runtime containers.conf names: crun refuses these hybrid cgroups", "runc"),
    "debootstrap": ("makes the base images, deploy/ci/base-images.sh", "debootstrap"),
    "podman-compose": ("runs deploy/compose.yaml", "podman-compose"),
    "dnsname": (
        "the CNI plugin by which containers find postgres and each other by name",
        "golang-github-containernetworking-plugin-dnsname",
    ),
}
# Where podman's CNI backend looks for plugins (containers.conf ``cni_plugin_dirs``, its default list).
CNI_PLUGIN_DIRS = (
    "/usr/local/libexec/cni",
    "/usr/libexec/cni",
    "/usr/local/lib/cni",
    "/usr/lib/cni",
    "/opt/cni/bin",
)


def dnsname_installed_by_dpkg(which: Callable[[str], str | None]) -> bool:
    """Whether Debian's package installed a dnsname plugin, wherever it put it: a plugin directory
    configured away from the defaults must not fail a machine that has the plugin."""
    if which("dpkg-query") is None:
        return False
    listed = subprocess.run(
        ["dpkg-query", "--listfiles", TOOLS["dnsname"][1]], capture_output=True, text=True, check=False
    )
    return listed.returncode == 0 and any(line.endswith("/dnsname") for line in listed.stdout.splitlines())


def missing_tools(
    parts: Sequence[str],
    *,
    which: Callable[[str], str | None] | None = None,
    plugin_dirs: Sequence[str | Path] | None = None,
) -> list[str]:
    """The tools the chosen parts need that this machine lacks, named as in ``TOOLS`` (plus
    ``kustomize``). Asked all at once before the base images are made (minutes), so a machine short of
    a tool fails in a second and is told everything it lacks, not only the first thing."""
    which = which or shutil.which
    needed = ["podman", "runc", "debootstrap", *(["podman-compose"] if "compose" in parts else [])]
    missing = [tool for tool in needed if which(tool) is None]
    # Without dnsname the podman network still starts and the failure comes much later, after the image
    # build, as a migrate that cannot resolve "postgres".
    if not any(Path(directory, "dnsname").is_file() for directory in plugin_dirs or CNI_PLUGIN_DIRS):
        if not dnsname_installed_by_dpkg(which):
            missing.append("dnsname")
    if "kubernetes" in parts and which("kustomize") is None and which("kubectl") is None:
        missing.append("kustomize")
    return missing


def missing_report(missing: Sequence[str]) -> str:
    lines = ["deploy-run: missing, so nothing was built or started:"]
    for tool in missing:
        if tool == "kustomize":
            lines.append("  kustomize or kubectl: renders deploy/kubernetes (either on PATH)")
        elif tool == "dnsname":
            lines.append(f"  dnsname: {TOOLS[tool][0]} (looked in {', '.join(CNI_PLUGIN_DIRS)})")
        else:
            lines.append(f"  {tool}: {TOOLS[tool][0]}")
    packages = [TOOLS[tool][1] for tool in missing if tool in TOOLS]
    if packages:
        lines.append(f"deploy-run: apt-get install {' '.join(packages)}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", action="store_true", help="leave the containers for a look afterwards")
    parser.add_argument(
        "--only", choices=["image", "compose", "kubernetes"], action="append", help="run only these parts"
    )
    options = parser.parse_args(argv)
    missing = missing_tools(options.only or ["image", "compose", "kubernetes"])
    if missing:
        print(missing_report(missing))
        return 1
    WORK.mkdir(parents=True, exist_ok=True)
    (WORK / "containers.conf").write_text(CONTAINERS_CONF)
    os.environ["CONTAINERS_CONF"] = str(WORK / "containers.conf")
    parts = {"image": run_image, "compose": run_compose, "kubernetes": run_kubernetes}
    started = time.monotonic()
    failed = None
    cleanup()
    try:
        build_images()
        for part, run in parts.items():
            if not options.only or part in options.only:
                run()
    except (Miss, subprocess.SubprocessError) as exc:
        failed = exc
    finally:
        if not options.keep:
            cleanup()
    print(f"\ndeploy-run summary ({time.monotonic() - started:.0f} s):")
    for line in summary:
        print(f"  {line}")
    if failed is not None:
        print(f"deploy-run: FAILED: {failed}")
        return 1
    print("deploy-run: every check held")
    return 0


if __name__ == "__main__":
    sys.exit(main())

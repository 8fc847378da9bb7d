"""``effectgate config check|show|schema|reference`` as real processes: exit codes and messages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

from .processes import ROOT

SECRET = "whsec_" + "x" * 32
GOOD = '[gateway]\nclaim_deadline = 1.5\n[sources.stripe]\nscheme = "stripe"\nsecrets = ["S"]\n'


def run(*args: str, env: dict[str, str] | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("EFFECTGATE_")}
    return subprocess.run(
        [sys.executable, "-m", "effectgate.gateway.cli", *args],
        env={**base, "S": SECRET, **(env or {})},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_check_passes_a_good_file_and_names_each_mistake_with_exit_2(tmp_path: Path) -> None:
    good = tmp_path / "good.toml"
    good.write_text(GOOD)
    done = run("config", "check", "--config", str(good))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{good}: ok for role all (1 sources")

    bad = tmp_path / "bad.toml"
    bad.write_text(
        GOOD.replace("claim_deadline", "claim_deadlne") + '[handlers]\nmodules = ["nowhere_to_be_found"]\n'
    )
    done = run("config", "check", "--config", str(bad))
    assert done.returncode == 2
    assert (
        f"effectgate: {bad}: gateway.claim_deadlne: is not a known setting; did you mean 'claim_deadline'?"
        in done.stderr
    )
    assert "Traceback" not in done.stderr


def test_check_runs_the_handler_start_up_checks(tmp_path: Path) -> None:
    (tmp_path / "effects.py").write_text(
        "from effectgate import effect\n\n"
        "@effect(source='nosuch', events=['x'], key=lambda e: e.id)\n"
        "async def handle(ctx, event):\n    pass\n"
    )
    path = tmp_path / "effectgate.toml"
    path.write_text(GOOD + '[handlers]\nmodules = ["effects"]\n')
    done = run("config", "check", "--config", str(path))
    assert done.returncode == 2, done.stdout
    assert "nosuch" in done.stderr and "Traceback" not in done.stderr


def test_check_warns_of_an_event_type_its_provider_does_not_publish_and_still_passes(tmp_path: Path) -> None:
    (tmp_path / "effects.py").write_text(
        "from effectgate import effect\n\n"
        "@effect(source='stripe', events=['payment_intent.succeded'], key=lambda e: e.id)\n"
        "async def ship(ctx, event):\n    pass\n"
    )
    path = tmp_path / "effectgate.toml"
    path.write_text(GOOD + '[handlers]\nmodules = ["effects"]\n')
    done = run("config", "check", "--config", str(path))
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    [warning] = [line for line in lines if line["event"] == "handlers.event_type_not_in_catalogue"]
    assert (warning["level"], warning["event_type"], warning["nearest"]) == (
        "warning",
        "payment_intent.succeded",
        "payment_intent.succeeded",
    )


def test_check_loads_only_the_secrets_of_the_role(tmp_path: Path) -> None:
    path = tmp_path / "effectgate.toml"
    path.write_text(
        GOOD + '[downstream.payments]\nbase_url = "http://127.0.0.1:9"\napi_key_env = "PAY_KEY"\n'
    )
    assert run("config", "check", "--config", str(path), "--role", "gateway").returncode == 0
    done = run("config", "check", "--config", str(path), "--role", "worker")
    assert done.returncode == 2
    assert f"{path}: downstream.payments.api_key_env: environment variable PAY_KEY is not set" in done.stderr


def test_an_environment_override_is_checked_and_shown(tmp_path: Path) -> None:
    path = tmp_path / "effectgate.toml"
    path.write_text(GOOD)
    done = run("config", "check", "--config", str(path), env={"EFFECTGATE_GATEWAY__CLAIM_DEADLINE": "soon"})
    assert done.returncode == 2
    assert (
        "effectgate: environment EFFECTGATE_GATEWAY__CLAIM_DEADLINE: expected a number, got 'soon'"
        in done.stderr
    )

    env = {"EFFECTGATE_GATEWAY__CLAIM_DEADLINE": "3", "EFFECTGATE_GATEWAY__PENALTY_BOX__COOLING": "7"}
    done = run("config", "show", "--config", str(path), "--format", "json", env=env)
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert shown["gateway"]["claim_deadline"] == 3
    assert shown["gateway"]["penalty_box"]["cooling"] == 7
    assert shown["gateway"]["pool_max"] == 10
    done = run("config", "show", "--config", str(path), env=env)
    assert tomllib.loads(done.stdout) == shown


def test_schema_and_reference(tmp_path: Path) -> None:
    out = tmp_path / "effectgate.schema.json"
    assert run("config", "schema", "-o", str(out)).returncode == 0
    assert json.loads(out.read_text())["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    done = run("config", "reference")
    assert done.returncode == 0 and "| `connect_timeout` |" in done.stdout
    page = tmp_path / "page.md"
    page.write_text("no markers here\n")
    done = run("config", "reference", "--write", str(page))
    assert done.returncode == 2
    assert done.stderr.startswith(f"effectgate: {page}: the page has no generated part")


def taplo(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    # The taplo binary installed beside this Python (the dev extra), not whichever one is on PATH.
    binary = Path(sys.executable).parent / "taplo"
    return subprocess.run([str(binary), *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def test_taplo_checks_a_file_against_the_schema_both_ways_the_docs_say(tmp_path: Path) -> None:
    assert run("config", "schema", "-o", str(tmp_path / "effectgate.schema.json")).returncode == 0
    typo = GOOD.replace("claim_deadline", "claim_deadlne")

    # 1. A #:schema line at the top of the file.
    (tmp_path / "inline.toml").write_text("#:schema ./effectgate.schema.json\n" + typo)
    done = taplo("check", "inline.toml", cwd=tmp_path)
    assert done.returncode != 0 and "'claim_deadlne' was unexpected" in done.stdout + done.stderr

    # 2. A .taplo.toml rule for effectgate.toml.
    (tmp_path / ".taplo.toml").write_text(
        '[[rule]]\ninclude = ["**/effectgate.toml"]\n[rule.schema]\npath = "effectgate.schema.json"\n'
    )
    (tmp_path / "effectgate.toml").write_text(typo)
    done = taplo("check", "effectgate.toml", cwd=tmp_path)
    assert done.returncode != 0 and "'claim_deadlne' was unexpected" in done.stdout + done.stderr
    for shipped in (
        ROOT / "deploy" / "effectgate.toml",
        ROOT / "docs" / "examples" / "shop" / "effectgate.toml",
    ):
        (tmp_path / "effectgate.toml").write_text(shipped.read_text())
        done = taplo("check", "effectgate.toml", cwd=tmp_path)
        assert done.returncode == 0, (shipped, done.stdout + done.stderr)

"""EFFECTGATE_<SECTION>__<KEY> overrides: typed by the declaration, over the file, errors naming the variable."""

from __future__ import annotations

import pytest

from effectgate.gateway import cli, config
from effectgate.gateway.cli import flags

BASE = '[gateway]\nclaim_deadline = 1.5\n[sources.my-src]\nscheme = "stripe"\nsecrets = ["S"]\n'
ENV = {"S": "whsec_" + "x" * 32}


def test_an_override_wins_over_the_file_and_is_typed() -> None:
    cfg = config.parse(
        BASE,
        env={
            **ENV,
            "EFFECTGATE_GATEWAY__CLAIM_DEADLINE": "3",
            "EFFECTGATE_GATEWAY__PENALTY_BOX__COOLING": "7.5",
            "EFFECTGATE_GATEWAY__RUN_RECONCILER": "false",
            "EFFECTGATE_GATEWAY__FORWARDED_ALLOW_IPS": "10.0.0.0/8, 127.0.0.1",
            "EFFECTGATE_SOURCES__MY_SRC__TENANT": "shop",
            "EFFECTGATE_DATABASE_URL": "postgresql://ignored-here",  # the older single variables keep their meaning
        },
    )
    assert cfg.gateway.claim_deadline == 3
    assert cfg.gateway.penalty_box.cooling == 7.5
    assert cfg.gateway.run_reconciler is False
    assert cfg.gateway.forwarded_allow_ips == ("10.0.0.0/8", "127.0.0.1")
    assert cfg.sources["my-src"].tenant == "shop"


@pytest.mark.parametrize(
    ("var", "value", "said"),
    [
        ("EFFECTGATE_GATEWAY__CLAIM_DEADLINE", "soon", "expected a number, got 'soon'"),
        ("EFFECTGATE_GATEWAY__PORT", "80.5", "expected an integer"),
        ("EFFECTGATE_GATEWAY__CLAIM_DEADLINE", "0", "must be >= 0.001"),
        ("EFFECTGATE_GATEWAY__RUN_RECONCILER", "maybe", "expected true or false"),
        ("EFFECTGATE_GATEWAY__CLAIM_DEADLNE", "1", "did you mean EFFECTGATE_GATEWAY__CLAIM_DEADLINE?"),
        ("EFFECTGATE_GATEWAI__PORT", "1", "is not a known table"),
        ("EFFECTGATE_SOURCES__OTHER__TOLERANCE", "1", "the file has no [sources.NAME] spelt OTHER"),
        ("EFFECTGATE_OPERATORS__NAME", "x", "cannot be set from the environment"),
        ("EFFECTGATE_RETENTION__HISTORY_DAYS", "0", "must be > 0"),
        ("EFFECTGATE_TRACING__SAMPLE_RATIO", "1.5", "must be <= 1"),
        ("EFFECTGATE_SOURCES__MY_SRC__ON_CONFLICT", "404", "expected one of 409, 200"),
        ("EFFECTGATE_SOURCES__MY_SRC__OPTIONS", "x", "cannot be set from the environment"),
    ],
)
def test_a_bad_override_names_the_variable(var: str, value: str, said: str) -> None:
    with pytest.raises(config.ConfigError) as caught:
        config.parse(BASE, env={**ENV, var: value})
    assert any(p.startswith(f"environment {var}: ") and said in p for p in caught.value.problems), (
        caught.value.problems
    )


def test_the_older_single_variable_deprecated_still_wins_over_the_files_key_set_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cfg = config.parse(BASE, env={**ENV, "EFFECTGATE_DATABASE__STARTUP_WAIT": "7"})
    assert cfg.database.startup_wait == 7
    args = cli.build_parser().parse_args(["reconcile"])
    monkeypatch.delenv("EFFECTGATE_STARTUP_WAIT", raising=False)
    assert flags.database_wait(args, "startup_wait", cfg) == 7
    monkeypatch.setenv("EFFECTGATE_STARTUP_WAIT", "3")
    assert flags.database_wait(args, "startup_wait", cfg) == 3
    flagged = cli.build_parser().parse_args(["reconcile", "--startup-wait", "1"])
    assert flags.database_wait(flagged, "startup_wait", cfg) == 1


def test_a_rule_across_keys_names_the_variable_that_set_the_key() -> None:
    with pytest.raises(config.ConfigError) as caught:
        config.parse(BASE, path="f.toml", env={**ENV, "EFFECTGATE_GATEWAY__CLAIM_LOCK_TIMEOUT": "10"})
    assert caught.value.problems == (
        "f.toml: gateway.claim_lock_timeout: must be shorter than claim_statement_timeout (5), got 10 "
        "(set by EFFECTGATE_GATEWAY__CLAIM_LOCK_TIMEOUT)",
    )

"""Where the start-up wait comes from: the flag, then EFFECTGATE_STARTUP_WAIT, then [database] startup_wait."""

from __future__ import annotations

import pytest

from effectgate.gateway import cli
from effectgate.gateway.cli import common, database
from effectgate.gateway.config import parse

CONFIG = '[database]\nstartup_wait = 7\n[sources.s]\nscheme = "stripe"\nsecrets = ["S"]\n'


def test_the_flag_wins_then_the_environment_then_the_file_then_the_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = parse(CONFIG, env={"S": "whsec_x"})
    monkeypatch.delenv("EFFECTGATE_STARTUP_WAIT", raising=False)
    assert database.startup_wait(cli.build_parser().parse_args(["migrate"])) == 30.0
    assert database.startup_wait(cli.build_parser().parse_args(["reconcile"]), config) == 7.0
    monkeypatch.setenv("EFFECTGATE_STARTUP_WAIT", "12.5")
    assert database.startup_wait(cli.build_parser().parse_args(["reconcile"]), config) == 12.5
    assert (
        database.startup_wait(cli.build_parser().parse_args(["reconcile", "--startup-wait", "0"]), config)
        == 0
    )


@pytest.mark.parametrize("text", ["soon", "-1", "nan"])
def test_a_bad_environment_value_names_the_variable(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    monkeypatch.setenv("EFFECTGATE_STARTUP_WAIT", text)
    with pytest.raises(
        common.UsageError, match=r"EFFECTGATE_STARTUP_WAIT: expected a number of seconds >= 0"
    ):
        database.startup_wait(cli.build_parser().parse_args(["migrate"]))


def test_a_bad_flag_value_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.build_parser().parse_args(["serve", "--startup-wait", "-3"])
    assert exited.value.code == 2
    assert "--startup-wait: must be >= 0" in capsys.readouterr().err

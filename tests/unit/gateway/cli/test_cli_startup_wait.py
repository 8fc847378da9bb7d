"""Where the two database waits come from, read by one function (``gateway.cli.flags.database_wait``): the flag,
then the environment (``EFFECTGATE_DATABASE__<KEY>``, the deprecated ``EFFECTGATE_<KEY>`` before it), then
``[database] startup_wait`` / ``migration_wait``, then the default."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from effectgate.gateway import cli
from effectgate.gateway.cli import common, flags
from effectgate.gateway.config import ConfigError, parse

ROOT = Path(__file__).resolve().parents[4]
CONFIG = '[database]\nstartup_wait = 7\nmigration_wait = 8\n[sources.s]\nscheme = "stripe"\nsecrets = ["S"]\n'
WAITS: list[tuple[flags.WaitKey, str, str, float, float]] = [
    # key, its flag, the old variable, the file's value above, the default
    ("startup_wait", "--startup-wait", "EFFECTGATE_STARTUP_WAIT", 7.0, 30.0),
    ("migration_wait", "--migration-wait", "EFFECTGATE_MIGRATION_WAIT", 8.0, 60.0),
]


def args(*flag: str) -> object:
    return cli.build_parser().parse_args(["serve", *flag])


@pytest.mark.parametrize(("key", "flag", "old", "in_file", "default"), WAITS)
def test_the_flag_wins_then_the_environment_then_the_file_then_the_default(
    key: flags.WaitKey, flag: str, old: str, in_file: float, default: float
) -> None:
    new = f"EFFECTGATE_DATABASE__{key.upper()}"
    config = parse(CONFIG, env={"S": "whsec_x"})
    overridden = parse(CONFIG, env={"S": "whsec_x", new: "12.5"})  # the file's key set from the environment
    assert flags.database_wait(args(), key, None, env={}) == default
    assert flags.database_wait(args(), key, config, env={}) == in_file
    assert flags.database_wait(args(), key, overridden, env={new: "12.5"}) == 12.5
    # A command that reads no file (migrate) reads the variable itself, as the configuration would.
    assert flags.database_wait(args(), key, None, env={new: "12.5"}) == 12.5
    assert flags.database_wait(args(flag, "0"), key, overridden, env={new: "12.5", old: "3"}) == 0


@pytest.mark.parametrize(("key", "flag", "old", "in_file", "default"), WAITS)
def test_the_deprecated_variable_still_wins_over_the_new_one_and_says_so(
    key: flags.WaitKey,
    flag: str,
    old: str,
    in_file: float,
    default: float,
    caplog: pytest.LogCaptureFixture,
) -> None:
    new = f"EFFECTGATE_DATABASE__{key.upper()}"
    overridden = parse(CONFIG, env={"S": "whsec_x", new: "12.5"})
    with caplog.at_level(logging.WARNING, logger="effectgate.cli"):
        assert flags.database_wait(args(), key, overridden, env={new: "12.5", old: "3"}) == 3
        assert flags.database_wait(args(), key, None, env={old: "3"}) == 3
    said = [(r.getMessage(), r.__dict__["variable"], r.__dict__["use"]) for r in caplog.records]
    assert said == [("config.deprecated_variable", old, new)] * 2


@pytest.mark.parametrize("text", ["soon", "-1", "nan"])
def test_a_bad_environment_value_names_the_variable(text: str) -> None:
    with pytest.raises(
        common.UsageError, match=r"^EFFECTGATE_STARTUP_WAIT: expected a number of seconds >= 0"
    ):
        flags.database_wait(args(), "startup_wait", env={"EFFECTGATE_STARTUP_WAIT": text})
    # The new name, read without a file, says what the configuration says of it.
    var = "EFFECTGATE_DATABASE__MIGRATION_WAIT"
    with pytest.raises(ConfigError) as in_config:
        parse(CONFIG, env={"S": "whsec_x", var: text})
    with pytest.raises(common.UsageError) as without_file:
        flags.database_wait(args(), "migration_wait", env={var: text})
    assert in_config.value.problems == (str(without_file.value),)


def test_the_process_environment_is_read_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EFFECTGATE_STARTUP_WAIT", raising=False)
    monkeypatch.setenv("EFFECTGATE_DATABASE__STARTUP_WAIT", "4")
    assert flags.database_wait(cli.build_parser().parse_args(["migrate"]), "startup_wait") == 4


def test_a_bad_flag_value_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.build_parser().parse_args(["serve", "--startup-wait", "-3"])
    assert exited.value.code == 2
    assert "--startup-wait: must be >= 0" in capsys.readouterr().err


def test_the_waits_are_read_in_one_place() -> None:
    # Issue 52: each wait was read by its own copy of flag -> variable -> file, in cli/database.py and
    # cli/migrate.py. The older variables' names, and a read of any *_WAIT variable, appear in flags.py only.
    read = re.compile(r"EFFECTGATE_(?:STARTUP|MIGRATION)_WAIT|environ\w*\.get\([^)]*_WAIT")
    found = sorted(
        str(path.relative_to(ROOT))
        for folder in ("gateway", "handlers", "ledger")
        for path in (ROOT / folder).rglob("*.py")
        if read.search(path.read_text(encoding="utf-8"))
    )
    assert found == ["gateway/cli/flags.py", "gateway/config/env.py"]

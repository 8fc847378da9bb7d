"""docs/forwarding.md stays true: its configuration parses for the gateway and the worker, the mistakes it
shows are the ones the configuration reports, its transcript's secret signs, and the files it names exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from effectgate.gateway.config import ConfigError, parse
from effectgate.handlers.downstream.forward import decode_secret

ROOT = Path(__file__).resolve().parents[3]
DOC = (ROOT / "docs" / "forwarding.md").read_text()


def block(language: str) -> str:
    match = re.search(rf"```{language}\n(.*?)```", DOC, re.S)
    assert match is not None, language
    return match.group(1)


def transcript_secret() -> str:
    match = re.search(r"export .*ORDER_SERVICE_SECRET=(\S+)", block("console"))
    assert match is not None
    return match.group(1)


def test_the_configuration_parses_for_each_role_with_only_its_secrets() -> None:
    toml = block("toml")
    gateway = parse(toml, path="effectgate.toml", env={"STRIPE_WEBHOOK_SECRET": "whsec_x"}, role="gateway")
    worker = parse(
        toml, path="effectgate.toml", env={"ORDER_SERVICE_SECRET": transcript_secret()}, role="worker"
    )
    assert gateway.effects[0].forward.secret is None
    assert worker.effects[0].forward.secret == transcript_secret()
    decode_secret(transcript_secret())


def test_the_mistakes_shown_are_the_ones_reported() -> None:
    shown = [
        line.removeprefix("effectgate: ")
        for line in DOC.splitlines()
        if line.startswith("effectgate: effectgate.toml: effects.")
    ]
    broken = (
        block("toml").replace("{/data/object/metadata/order_id}", "{data}").replace("\nurl =", "\nurll =")
    )
    with pytest.raises(ConfigError) as caught:
        parse(broken, path="effectgate.toml", env={"STRIPE_WEBHOOK_SECRET": "whsec_x"}, role="gateway")
    assert shown and all(line in caught.value.problems for line in shown), caught.value.problems


def test_the_files_the_transcript_names_exist() -> None:
    for path in (
        "tests/node_receiver/server.js",
        "tests/node_receiver/package-lock.json",
        "tests/e2e/test_forward_node.py",
    ):
        assert (ROOT / path).is_file(), path

"""``config show``'s effective configuration: defaults filled in, secrets masked, TOML that reads back."""

from __future__ import annotations

import json
import tomllib
from typing import Any

from effectgate.gateway import config
from effectgate.gateway.config import show
from effectgate.gateway.config.env import override
from tests.unit.gateway.config.full_config import ENV, FULL, LEGACY


def test_defaults_are_filled_in_and_the_file_wins_over_them() -> None:
    shown = show.build(
        tomllib.loads('[gateway]\nport = 9000\n[sources.s]\nscheme = "stripe"\nsecrets = ["S"]\n')
    )
    assert shown["gateway"]["port"] == 9000
    assert shown["gateway"]["pool_max"] == 10
    assert shown["gateway"]["penalty_box"]["cooling"] == 60.0
    assert shown["sources"]["s"] == {"scheme": "stripe", "secrets": ["S"], "tenant": "default"}
    assert "tracing" not in shown and "reconciler" not in shown and "operators" not in shown
    assert shown["maintenance"]["lease_rescuer"]["batch"] == 1000


def test_an_environment_override_is_shown() -> None:
    data, problems = override(tomllib.loads(FULL), {"EFFECTGATE_GATEWAY__CLAIM_DEADLINE": "3"})
    assert problems == []
    assert show.build(data)["gateway"]["claim_deadline"] == 3


def test_the_toml_reads_back_to_the_same_values_and_loads_as_the_same_configuration() -> None:
    for text in (FULL, LEGACY):
        shown = show.build(tomllib.loads(text))
        assert tomllib.loads(show.as_toml(shown)) == shown
        assert json.loads(show.as_json(shown)) == shown
        original, again = config.parse(text, env=ENV), config.parse(show.as_toml(shown), env=ENV)
        assert (again.gateway, again.worker, again.database, again.operator) == (
            original.gateway,
            original.worker,
            original.database,
            original.operator,
        )
        assert again.sources.keys() == original.sources.keys()
        assert again.downstreams == original.downstreams


def test_secrets_are_masked() -> None:
    data = tomllib.loads(
        '[tracing]\nendpoint = "https://user:hunter2@otel.example:4318/v1/traces"\n'
        '[sources.p]\nscheme = "paypal"\nsecrets = ["S"]\n'
        '[sources.p.options]\nwebhook_id = "W"\nclient_id_env = "PAYPAL_ID"\nclient_secret = "in-clear"\n'
        '[downstream.d]\nbase_url = "https://u:pw@api.example"\n'
    )
    text = show.as_toml(show.build(data))
    assert "hunter2" not in text and "in-clear" not in text and ":pw@" not in text
    assert "https://user:***@otel.example:4318/v1/traces" in text
    assert (
        'client_id_env = "PAYPAL_ID"' in text and 'secrets = ["S"]' in text
    )  # names of secrets, not secrets


def test_the_retry_schedules_are_shown_as_comments_for_the_worker_and_each_kind_with_its_own() -> None:
    from effectgate.handlers.effect_kind import EffectKind
    from effectgate.handlers.worker.config import WorkerConfig

    async def handler(ctx: object, ev: object) -> None:
        return None

    def kind(name: str, **settings: Any) -> EffectKind:
        return EffectKind(name=name, source="s", events=("e",), fn=handler, **settings)

    kinds = [kind("plain"), kind("refund", backoff_base=60, backoff_cap=7200, max_attempts=12)]
    text = show.retry_schedules(WorkerConfig(), kinds)
    lines = text.splitlines()
    assert (
        "# [worker], for kinds that set none of their own: backoff_base 1 s, backoff_cap 3600 s, max_attempts 60"
        in lines
    )
    assert "#   total before attempt 60 fails the job: 1d0h4m-2d0h8m" in lines
    assert "# kind refund: backoff_base 60 s, backoff_cap 7200 s, max_attempts 12" in lines
    assert "#   after attempts 8-11: 1h0m-2h0m each" in lines
    assert "#   total before attempt 12 fails the job: 5h3m30s-10h7m" in lines
    assert "plain" not in text  # the worker's schedule is its schedule
    # Comments: the TOML still reads back to the same values.
    shown = show.build(tomllib.loads(FULL))
    assert tomllib.loads(show.as_toml(shown) + text) == shown
    # The testing switch is shown as what it does.
    off = show.retry_schedules(WorkerConfig(backoff_base=0), kinds)
    assert "#   59 retries at once (backoff_base = 0: waits off)" in off.splitlines()
    assert "#   11 retries at once (backoff_base = 0: waits off)" in off.splitlines()

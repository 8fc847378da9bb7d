"""Secrets from the environment, from ``NAME_FILE`` and from systemd's ``$CREDENTIALS_DIRECTORY``, and
each process role loading only its own."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from effectgate.gateway.config import ConfigError, parse
from effectgate.gateway.config.secrets import MAX_SECRET_BYTES, SecretEnv
from effectgate.gateway.config.sources import SecretsNotLoaded

CONFIG = """
[sources.stripe]
scheme = "stripe"
secrets = ["STRIPE_SECRET"]

[downstream.payments]
base_url = "https://payments.example.com"
api_key_env = "PAYMENTS_KEY"

[[operators]]
name = "oncall"
token_env = "OPERATOR_TOKEN"
scopes = ["operate"]

[dashboard]
session_secret_env = "SESSION_SECRET"

[metrics]
token_env = "METRICS_TOKEN"
"""
TOKEN = "operator-token-0123456789"
ALL = {
    "STRIPE_SECRET": "whsec_stripe",
    "PAYMENTS_KEY": "sk_payments",
    "OPERATOR_TOKEN": TOKEN,
    "SESSION_SECRET": "session-secret-0123456789",
    "METRICS_TOKEN": "metrics-token-0123456789",
}
WEBHOOK = {k: ALL[k] for k in ("STRIPE_SECRET", "OPERATOR_TOKEN", "SESSION_SECRET", "METRICS_TOKEN")}
DOWNSTREAM = {k: ALL[k] for k in ("PAYMENTS_KEY", "METRICS_TOKEN")}


def test_a_secret_is_read_from_the_environment_then_name_file_then_the_credentials_directory(
    tmp_path: Path,
) -> None:
    (tmp_path / "A_FILE.txt").write_text("from-file\n")
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "B").write_text("from-credentials\r\n")
    (creds / "C").write_text("ignored: C is in the environment")
    env = SecretEnv(
        {"A_FILE": str(tmp_path / "A_FILE.txt"), "CREDENTIALS_DIRECTORY": str(creds), "C": "from-env"}
    )
    assert (env.get("A"), env.get("B"), env.get("C"), env.get("D")) == (
        "from-file",
        "from-credentials",
        "from-env",
        None,
    )
    assert env.problems == []


def test_files_that_cannot_be_used_are_named_and_never_quoted(tmp_path: Path) -> None:
    (tmp_path / "big").write_bytes(b"x" * (MAX_SECRET_BYTES + 1))
    (tmp_path / "latin1").write_bytes(b"caf\xe9-secret")
    (tmp_path / "both").write_text("file-value")
    env = SecretEnv(
        {
            "GONE_FILE": str(tmp_path / "gone"),
            "BIG_FILE": str(tmp_path / "big"),
            "LATIN_FILE": str(tmp_path / "latin1"),
            "BOTH": "env-value",
            "BOTH_FILE": str(tmp_path / "both"),
        }
    )
    assert [env.get(name) for name in ("GONE", "BIG", "LATIN", "BOTH")] == [None] * 4
    assert env.problems == [
        f"secret GONE: GONE_FILE={tmp_path / 'gone'}: cannot read it: No such file or directory",
        f"secret BIG: BIG_FILE={tmp_path / 'big'}: larger than {MAX_SECRET_BYTES} bytes",
        f"secret LATIN: LATIN_FILE={tmp_path / 'latin1'}: not UTF-8 text",
        "secret BOTH: both BOTH and BOTH_FILE are set; keep one",
    ]
    assert not any("value" in problem or "secret-" in problem for problem in env.problems)


def test_a_bad_secret_file_stops_the_configuration_naming_the_variable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        parse(CONFIG, path="eg.toml", env={**ALL, "STRIPE_SECRET": "", "STRIPE_SECRET_FILE": str(tmp_path)})
    assert f"eg.toml: secret STRIPE_SECRET: STRIPE_SECRET_FILE={tmp_path}: cannot read it: " in str(
        caught.value
    )


def test_the_whole_configuration_reads_its_secrets_from_files(tmp_path: Path) -> None:
    env = {}
    for name, value in ALL.items():
        (tmp_path / name).write_text(value + "\n")
        env[f"{name}_FILE"] = str(tmp_path / name)
    config = parse(CONFIG, env=env)
    assert config.payments is not None and config.payments.api_key == "sk_payments"
    assert config.operators[0].token_sha256 == hashlib.sha256(TOKEN.encode()).digest()
    assert config.metrics_token_sha256 == hashlib.sha256(b"metrics-token-0123456789").digest()
    systemd = parse(CONFIG, env={"CREDENTIALS_DIRECTORY": str(tmp_path)})
    assert systemd.payments == config.payments and systemd.operators == config.operators


def test_the_gateway_loads_no_downstream_key_and_needs_none() -> None:
    config = parse(CONFIG, env=WEBHOOK, role="gateway")
    assert config.payments is None
    assert not isinstance(config.sources["stripe"].scheme, SecretsNotLoaded)
    assert [o.name for o in config.operators] == ["oncall"]
    # The key is not read even where it is set: a gateway never holds it.
    assert parse(CONFIG, env=ALL, role="gateway").payments is None


def test_the_worker_loads_no_webhook_secret_nor_operator_token_and_needs_none() -> None:
    config = parse(CONFIG, env=DOWNSTREAM, role="worker")
    assert config.payments is not None and config.payments.api_key == "sk_payments"
    scheme = config.sources["stripe"].scheme
    assert isinstance(scheme, SecretsNotLoaded) and config.sources["stripe"].scheme_name == "stripe"
    with pytest.raises(RuntimeError, match="does not hold the stripe webhook secrets"):
        scheme.verify(b"{}", {})
    assert config.operators == () and config.dashboard.session_secret is None
    assert config.metrics_token_sha256 is not None


@pytest.mark.parametrize(
    ("role", "env", "named"),
    [
        ("gateway", DOWNSTREAM, ["STRIPE_SECRET", "OPERATOR_TOKEN", "SESSION_SECRET"]),
        ("worker", WEBHOOK, ["PAYMENTS_KEY"]),
        ("all", {"METRICS_TOKEN": ALL["METRICS_TOKEN"]}, ["STRIPE_SECRET", "PAYMENTS_KEY", "OPERATOR_TOKEN"]),
    ],
)
def test_each_role_is_stopped_by_its_own_missing_secrets_only(
    role: str, env: dict[str, str], named: list[str]
) -> None:
    with pytest.raises(ConfigError) as caught:
        parse(CONFIG, path="eg.toml", env=env, role=role)  # type: ignore[arg-type]
    message = str(caught.value)
    for name in named:
        assert f"environment variable {name} is not set" in message
    for name in set(ALL) - set(named) - set(env):
        assert name not in message or role == "all"


def test_a_worker_still_refuses_a_mistyped_scheme() -> None:
    with pytest.raises(ConfigError, match=r"sources\.s\.scheme: unknown scheme 'strype'"):
        parse('[sources.s]\nscheme = "strype"\nsecrets = ["X"]\n', env={}, role="worker")


PAYPAL = """
[sources.paypal]
scheme = "paypal"
secrets = ["PAYPAL_WEBHOOK_ID"]
options = { confirm = "verify_api", client_id_env = "PP_ID", client_secret_env = "PP_SECRET" }
"""


def test_paypals_api_credentials_are_the_gateways_and_may_come_from_files(tmp_path: Path) -> None:
    # A worker neither reads nor needs them (nor the webhook id).
    assert parse(PAYPAL, env={}, role="worker").sources["paypal"].scheme_name == "paypal"
    with pytest.raises(
        ConfigError, match=r"options\.client_secret_env: environment variable PP_SECRET is not set"
    ):
        parse(PAYPAL, env={"PAYPAL_WEBHOOK_ID": "WH-1", "PP_ID": "client-id"}, role="gateway")
    (tmp_path / "PP_SECRET").write_text("client-secret\n")
    env = {"PAYPAL_WEBHOOK_ID": "WH-1", "PP_ID": "client-id", "CREDENTIALS_DIRECTORY": str(tmp_path)}
    assert parse(PAYPAL, env=env, role="gateway").sources["paypal"].scheme_name == "paypal"

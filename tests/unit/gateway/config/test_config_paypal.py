"""PayPal's confirmation options in the configuration file: the OAuth client id and secret come from the
environment, named by ``client_id_env`` / ``client_secret_env``, never from the file itself."""

from __future__ import annotations

import pytest

from effectgate.gateway.config import ConfigError, parse

ENV = {"PAYPAL_WEBHOOK_ID": "8PT597110X687430LKGECATA", "PP_ID": "client-id", "PP_SECRET": "client-secret"}


def source(options: str) -> str:
    return f"""
[sources.paypal]
scheme = "paypal"
secrets = ["PAYPAL_WEBHOOK_ID"]
options = {{ {options} }}
"""


def test_confirmation_with_credentials_from_the_environment() -> None:
    config = parse(
        source('confirm = "fetch_event", client_id_env = "PP_ID", client_secret_env = "PP_SECRET"'), env=ENV
    )
    assert config.sources["paypal"].scheme_name == "paypal"


def test_without_credentials_the_file_must_say_confirm_off() -> None:
    # fetch_event is the default: a source without credentials is refused at start, naming file and key.
    with pytest.raises(ConfigError) as caught:
        parse(source('cert_name = "messageverificationcerts.paypal.com"'), path="gw.toml", env=ENV)
    message = str(caught.value)
    assert "gw.toml" in message and "sources.paypal.scheme" in message
    assert "set client_id_env and client_secret_env" in message and 'confirm = "off"' in message
    assert "forged body" in message
    config = parse(source('confirm = "off"'), env=ENV)
    assert config.sources["paypal"].scheme_name == "paypal"


def test_fetch_event_is_the_default_with_credentials() -> None:
    config = parse(source('client_id_env = "PP_ID", client_secret_env = "PP_SECRET"'), env=ENV)
    assert config.sources["paypal"].scheme_name == "paypal"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            'confirm = "fetch_event", client_id = "client-id", client_secret_env = "PP_SECRET"',
            r"sources\.paypal\.options\.client_id: name an environment variable in client_id_env instead",
        ),
        (
            'confirm = "verify_api", client_id_env = "PP_ID", client_secret_env = "PP_NOPE"',
            r"sources\.paypal\.options\.client_secret_env: environment variable PP_NOPE is not set",
        ),
        (
            'confirm = "verify_api", client_id_env = "", client_secret_env = "PP_SECRET"',
            r"sources\.paypal\.options\.client_id_env: must be the name of an environment variable",
        ),
        (
            'confirm = "verify_api", client_id_env = "PP_ID"',
            r"sources\.paypal\.scheme: client_secret: required with confirm = 'verify_api'",
        ),
        ('confirm = "always"', r"sources\.paypal\.scheme: confirm: expected one of off, verify_api"),
    ],
)
def test_mistakes_name_the_key_and_never_the_secret(options: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        parse(source(options), env=ENV)
    assert "client-secret" not in str(caught.value)

"""``[gateway] forwarded_allow_ips`` and ``serve --forwarded-allow-ips``: who may say the request came over TLS."""

from __future__ import annotations

import pytest

from effectgate.gateway.cli import build_parser
from effectgate.gateway.config import ConfigError, parse

ENV = {"S1": "whsec_one"}
MINIMAL = '[sources.stripe]\nscheme = "stripe"\nsecrets = ["S1"]\n'


def test_no_proxy_is_trusted_by_default() -> None:
    assert parse(MINIMAL, env=ENV).gateway.forwarded_allow_ips == ()


def test_addresses_networks_and_star_are_accepted() -> None:
    text = MINIMAL + '[gateway]\nforwarded_allow_ips = ["10.0.0.0/8", "192.0.2.7", "::1", "fd00::/8"]\n'
    assert parse(text, env=ENV).gateway.forwarded_allow_ips == ("10.0.0.0/8", "192.0.2.7", "::1", "fd00::/8")
    star = MINIMAL + '[gateway]\nforwarded_allow_ips = ["*"]\n'
    assert parse(star, env=ENV).gateway.forwarded_allow_ips == ("*",)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ('"10.0.0.1"', r"gateway\.forwarded_allow_ips: must be a list"),
        ('["proxy.internal"]', r"gateway\.forwarded_allow_ips: 'proxy\.internal' is not an IP address"),
        ('["10.0.0.1/8"]', r"gateway\.forwarded_allow_ips: '10\.0\.0\.1/8' is not .*host bits zero"),
        ('["300.1.1.1"]', r"gateway\.forwarded_allow_ips: '300\.1\.1\.1' is not an IP address"),
        ("[1]", r"gateway\.forwarded_allow_ips: expected IP addresses"),
    ],
)
def test_a_malformed_entry_names_the_key(value: str, message: str) -> None:
    # uvicorn would keep a malformed entry as a literal that never matches: the proxy's headers would
    # be ignored without a word. Here it fails at start.
    with pytest.raises(ConfigError, match=message):
        parse(MINIMAL + f"[gateway]\nforwarded_allow_ips = {value}\n", path="eg.toml", env=ENV)


def test_the_flag_overrides_the_file_and_empty_means_none() -> None:
    parser = build_parser()
    assert parser.parse_args(["serve"]).forwarded_allow_ips is None
    assert parser.parse_args(
        ["serve", "--forwarded-allow-ips", "10.1.0.0/16, 127.0.0.1"]
    ).forwarded_allow_ips == (
        "10.1.0.0/16",
        "127.0.0.1",
    )
    assert parser.parse_args(["serve", "--forwarded-allow-ips", ""]).forwarded_allow_ips == ()


def test_a_malformed_flag_is_exit_2_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["serve", "--forwarded-allow-ips", "10.0.0.1,nope"])
    assert exited.value.code == 2
    assert "--forwarded-allow-ips: 'nope' is not an IP address" in capsys.readouterr().err

"""``[operator]``: where the operator plane listens, its cookies and its throttle."""

from __future__ import annotations

import pytest

from effectgate.gateway.config import ConfigError, parse
from effectgate.gateway.config.operator import parse_listen

ENV = {"S1": "whsec_one"}
MINIMAL = """
[sources.stripe]
scheme = "stripe"
secrets = ["S1"]
"""


def test_by_default_the_operator_plane_shares_the_gateways_listener() -> None:
    operator = parse(MINIMAL, env=ENV).operator
    assert (operator.apart, operator.listen_port, operator.secure_cookies) == (False, None, None)
    assert (operator.throttle_limit, operator.throttle_window) == (10, 300.0)


def test_the_operator_plane_can_listen_apart_with_secure_cookies() -> None:
    text = MINIMAL + '[operator]\nlisten = "0.0.0.0:9464"\nsecure_cookies = true\nthrottle_limit = 3\n'
    operator = parse(text, env=ENV).operator
    assert (operator.apart, operator.listen_host, operator.listen_port) == (True, "0.0.0.0", 9464)
    assert (operator.secure_cookies, operator.throttle_limit) == (True, 3)


@pytest.mark.parametrize(
    ("text", "host", "port"),
    [
        ("127.0.0.1:9464", "127.0.0.1", 9464),
        ("[::1]:9464", "::1", 9464),
        ("ops.internal:0", "ops.internal", 0),
    ],
)
def test_listen_addresses(text: str, host: str, port: int) -> None:
    assert parse_listen(text) == (host, port)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('listen = "9464"', r"eg\.toml: operator\.listen: expected HOST:PORT"),
        ('listen = "::1:9464"', r"operator\.listen: an IPv6 address is written in brackets"),
        ('listen = "127.0.0.1:70000"', r"operator\.listen: port must be 0\.\.65535"),
        ('listen = "127.0.0.1:8000"', r"operator\.listen: must not be the gateway's own port \(8000\)"),
        ('secure_cookies = "yes"', r"operator\.secure_cookies: "),
        ("throttle_limit = 0", r"operator\.throttle_limit: "),
        ("listn = 1", r"operator\.listn: .*listen"),
    ],
)
def test_operator_mistakes_name_the_key(line: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse(MINIMAL + f"[operator]\n{line}\n", path="eg.toml", env=ENV)

"""``[downstream.<any name>]``: base URL, credentials from the environment or a file, auth scheme,
idempotency header and timeouts, each mistake named by file and key (issue 19)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from effectgate.gateway.config import ConfigError, load, parse

ENV = {"S1": "whsec_one", "CARRIER_KEY": "ck_live_1", "PAYMENTS_KEY": "sk_1"}
MINIMAL = """
[sources.stripe]
scheme = "stripe"
secrets = ["S1"]
"""


def test_any_name_is_a_downstream_and_payments_and_shipping_keep_working() -> None:
    config = parse(
        MINIMAL
        + """
[downstream.payments]
base_url = "http://127.0.0.1:9001"
api_key_env = "PAYMENTS_KEY"

[downstream.carrier]
base_url = "http://127.0.0.1:9002/api/"
api_key_env = "CARRIER_KEY"
auth_scheme = "basic"
idempotency_header = "PayPal-Request-Id"
timeout = 3
connect_timeout = 1.5
""",
        path="eg.toml",
        env=ENV,
    )
    assert sorted(config.downstreams) == ["carrier", "payments"]
    assert config.payments is config.downstreams["payments"] and config.shipping is None
    assert (config.payments.api_key, config.payments.auth_scheme) == ("sk_1", "bearer")
    assert config.payments.idempotency_header == "Idempotency-Key"
    carrier = config.downstreams["carrier"]
    assert carrier.base_url == "http://127.0.0.1:9002/api"
    assert (carrier.api_key, carrier.auth_scheme, carrier.idempotency_header) == (
        "ck_live_1",
        "basic",
        "PayPal-Request-Id",
    )
    assert (carrier.timeout, carrier.connect_timeout) == (3, 1.5)


def test_an_api_that_takes_no_key_says_false_and_a_header_scheme_names_the_header() -> None:
    config = parse(
        MINIMAL
        + '[downstream.labels]\nbase_url = "http://127.0.0.1:9"\napi_key_env = "CARRIER_KEY"\n'
        + 'auth_scheme = "X-Shopify-Access-Token"\nidempotency_header = false\n',
        env=ENV,
    )
    labels = config.downstreams["labels"]
    assert (labels.auth_scheme, labels.idempotency_header) == ("X-Shopify-Access-Token", None)


def test_the_key_file_is_read_relative_to_the_configuration(tmp_path: Path) -> None:
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "carrier.key").write_text("ck_from_file\n")
    path = tmp_path / "effectgate.toml"
    path.write_text(
        MINIMAL
        + '[downstream.carrier]\nbase_url = "http://127.0.0.1:9"\napi_key_file = "secrets/carrier.key"\n'
    )
    config = load(str(path), env=ENV)
    assert config.downstreams["carrier"].api_key == "ck_from_file"
    # A gateway holds no downstream credential: it checks the table and never opens the file.
    (tmp_path / "secrets" / "carrier.key").unlink()
    assert load(str(path), env=ENV, role="gateway").downstreams == {}
    with pytest.raises(
        ConfigError, match=r"downstream\.carrier\.api_key_file: .*carrier\.key: cannot read it"
    ):
        load(str(path), env=ENV, role="worker")


def test_a_key_variable_may_point_at_a_file_as_every_secret_may(tmp_path: Path) -> None:
    (tmp_path / "k").write_text("ck_via_var_file\n")
    config = parse(
        MINIMAL + '[downstream.carrier]\nbase_url = "http://127.0.0.1:9"\napi_key_env = "CK"\n',
        env={"S1": "whsec_one", "CK_FILE": str(tmp_path / "k")},
    )
    assert config.downstreams["carrier"].api_key == "ck_via_var_file"


@pytest.mark.parametrize(
    ("table", "message"),
    [
        (
            'base_url = "http://x"\napi_key = "sk_live_in_clear"',
            r"downstream\.carrier\.api_key: .*never read .* in clear",
        ),
        (
            'base_url = "http://x"\napi_key_env = "CARRIER_KEY"\napi_key_file = "k"',
            r"downstream\.carrier\.api_key_file: set api_key_env or api_key_file, not both",
        ),
        (
            'base_url = "http://x"\napi_key_env = "NOPE"',
            r"downstream\.carrier\.api_key_env: environment variable NOPE",
        ),
        (
            'base_url = "http://x"\nauth_scheme = "bad header"',
            r"downstream\.carrier\.auth_scheme: .*'bearer', 'basic' or a header",
        ),
        (
            'base_url = "http://x"\nidempotency_header = true',
            r"downstream\.carrier\.idempotency_header: .*false",
        ),
        (
            'base_url = "http://x"\nidempotency_header = ""',
            r"downstream\.carrier\.idempotency_header: .*false",
        ),
        (
            'base_url = "http://x"\nidempotency_header = "a b"',
            r"downstream\.carrier\.idempotency_header: .*header name",
        ),
        ('base_url = "ftp://x"', r"downstream\.carrier\.base_url: .*http"),
        ('base_url = "http://x"\ntimeout = 0', r"downstream\.carrier\.timeout: must be >= 0\.001"),
        ('base_url = "http://x"\nauth = "bearer"', r"downstream\.carrier\.auth: is not a known setting"),
        ("timeout = 1", r"downstream\.carrier\.base_url: is required"),
    ],
)
def test_each_mistake_names_the_file_and_key(table: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse(MINIMAL + "[downstream.carrier]\n" + table, path="eg.toml", env=ENV)


def test_a_downstream_that_is_not_a_table_or_has_a_bad_name_is_refused() -> None:
    with pytest.raises(ConfigError) as caught:
        parse(
            MINIMAL + '[downstream]\ncarrier = "http://x"\n\n[downstream."a b"]\nbase_url = "http://x"\n',
            path="eg.toml",
            env=ENV,
        )
    assert caught.value.problems == (
        "eg.toml: downstream.carrier: must be a table ([downstream.NAME])",
        "eg.toml: downstream.a b: downstream names may use letters, digits, '-' and '_' only",
    )


def test_the_documented_examples_are_valid_as_written() -> None:
    doc = (Path(__file__).resolve().parents[4] / "docs" / "downstream.md").read_text()
    tomls = re.findall(r"```toml\n(.*?)```", doc, re.S)
    assert len(tomls) == 2
    for block in tomls:
        config = parse(MINIMAL + block, path="docs/downstream.md", env={**ENV, "CARRIER_API_KEY": "ck_doc"})
        assert config.downstreams["carrier"].api_key == "ck_doc"
    pythons = re.findall(r"```python\n(.*?)```", doc, re.S)
    assert len(pythons) == 3
    for block in pythons:
        ast.parse(block)


def test_a_downstream_s_pace_is_read_and_a_wrong_limit_is_named_by_its_key() -> None:
    table = '[downstream.stripe]\nbase_url = "http://127.0.0.1:9"\napi_key_env = "CARRIER_KEY"\n'
    config = parse(MINIMAL + table + "max_in_flight = 8\nmax_per_second = 20\n", env=ENV)
    stripe = config.downstreams["stripe"]
    assert (stripe.max_in_flight, stripe.max_per_second) == (8, 20)
    pace = stripe.pace()
    assert (pace.max_in_flight, pace.max_per_second, pace.max_wait) == (8, 20, stripe.timeout)
    unset = parse(MINIMAL + table, env=ENV).downstreams["stripe"]
    assert (unset.max_in_flight, unset.max_per_second) == (None, None)
    # Shared by the ledger's workers unless said otherwise.
    assert stripe.pace_scope == unset.pace_scope == "ledger"
    own = parse(MINIMAL + table + 'pace_scope = "process"\n', env=ENV).downstreams["stripe"]
    assert own.pace_scope == "process"
    for wrong, message in (
        ("max_in_flight = 0", r"downstream\.stripe\.max_in_flight: must be >= 1"),
        ("max_in_flight = 2.5", r"downstream\.stripe\.max_in_flight: "),
        ('max_per_second = "fast"', r"downstream\.stripe\.max_per_second: "),
        ("max_per_second = 0", r"downstream\.stripe\.max_per_second: must be >= 0\.001"),
        ("max_in_flgiht = 4", r"downstream\.stripe\.max_in_flgiht: .*did you mean 'max_in_flight'"),
        ('pace_scope = "cluster"', r"downstream\.stripe\.pace_scope: must be 'ledger' or 'process'"),
        ("pace_scope = 1", r"downstream\.stripe\.pace_scope: "),
    ):
        with pytest.raises(ConfigError, match=message):
            parse(MINIMAL + table + wrong + "\n", path="eg.toml", env=ENV)

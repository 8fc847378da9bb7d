"""Operator tokens: configuration (hashes only, mistakes named by file and key) and authentication."""

from __future__ import annotations

import hashlib

import pytest

from effectgate.gateway.config import ConfigError, parse
from effectgate.gateway.config.operator import OperatorToken
from effectgate.gateway.operator.auth import AuthFailure, authenticate, hash_token

SOURCE = """
[sources.stripe]
scheme = "stripe"
secrets = ["STRIPE_SECRET"]
"""
ENV = {"STRIPE_SECRET": "whsec_test", "ALICE_TOKEN": "alice-token-0123456789", "SHORT": "short"}
BOB = "bob-token-0123456789abcdef"


def load(operators: str) -> tuple[OperatorToken, ...]:
    return parse(SOURCE + operators, path="effectgate.toml", env=ENV).operators


def test_no_operators_by_default() -> None:
    assert load("") == ()


def test_tokens_from_the_environment_and_from_hashes_are_kept_as_hashes() -> None:
    operators = load(
        f"""
[[operators]]
name = "alice"
token_env = "ALICE_TOKEN"
scopes = ["view"]

[[operators]]
name = "bob"
token_sha256 = "{hash_token(BOB).upper()}"
scopes = ["view", "operate"]
"""
    )
    alice, bob = operators
    assert alice.token_sha256 == hashlib.sha256(ENV["ALICE_TOKEN"].encode()).digest()
    assert bob.token_sha256 == hashlib.sha256(BOB.encode()).digest()
    assert (alice.scopes, bob.scopes) == (frozenset({"view"}), frozenset({"view", "operate"}))
    assert ENV["ALICE_TOKEN"] not in repr(operators)


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('name = "a"\nscopes = ["view"]', r"operators\[0\]\.token_sha256: set exactly one"),
        (
            f'name = "a"\ntoken_env = "ALICE_TOKEN"\ntoken_sha256 = "{"0" * 64}"\nscopes = ["view"]',
            r"operators\[0\]\.token_sha256: set exactly one",
        ),
        ('name = "a"\ntoken_sha256 = "abc"\nscopes = ["view"]', r"operators\[0\]\.token_sha256: must be 64"),
        (
            'name = "a"\ntoken_env = "MISSING"\nscopes = ["view"]',
            r"operators\[0\]\.token_env: .*MISSING is not set",
        ),
        (
            'name = "a"\ntoken_env = "SHORT"\nscopes = ["view"]',
            r"operators\[0\]\.token_env: .*shorter than 16",
        ),
        (
            'name = "a"\ntoken_env = "ALICE_TOKEN"\nscopes = []',
            r"operators\[0\]\.scopes: must be a non-empty",
        ),
        ('name = "a"\ntoken_env = "ALICE_TOKEN"\nscopes = ["admin"]', r"operators\[0\]\.scopes"),
        ('name = "a"\ntoken_env = "ALICE_TOKEN"\nscopes = "view"', r"operators\[0\]\.scopes: must be a list"),
        (
            'name = " "\ntoken_env = "ALICE_TOKEN"\nscopes = ["view"]',
            r"operators\[0\]\.name: must not be empty",
        ),
        ('token_env = "ALICE_TOKEN"\nscopes = ["view"]', r"operators\[0\]\.name: is required"),
        (
            'name = "a"\ntoken_env = "ALICE_TOKEN"\nscopes = ["view"]\ntoken = "x"',
            r"operators\[0\]\.token: is not a known setting",
        ),
    ],
)
def test_mistakes_name_the_file_and_key(table: str, message: str) -> None:
    with pytest.raises(ConfigError, match=r"^effectgate\.toml: " + message):
        load("[[operators]]\n" + table + "\n")


def test_a_name_or_token_used_twice_is_refused() -> None:
    one = '[[operators]]\nname = "a"\ntoken_env = "ALICE_TOKEN"\nscopes = ["view"]\n'
    with pytest.raises(ConfigError, match=r"operators\[1\]\.name: operator 'a' is configured twice"):
        load(one + one)
    other = (
        f'[[operators]]\nname = "b"\ntoken_sha256 = "{hash_token(ENV["ALICE_TOKEN"])}"\nscopes = ["view"]\n'
    )
    with pytest.raises(ConfigError, match=r"operators\[1\]\.token_sha256: two operators share one token"):
        load(one + other)
    with pytest.raises(ConfigError, match="operators: must be a list"):
        load('[operators]\nname = "a"\n')


VIEWER = OperatorToken("viewer", hashlib.sha256(b"viewer-token-xyz").digest(), frozenset({"view"}))
OPERATOR = OperatorToken("op", hashlib.sha256(b"operator-token-xyz").digest(), frozenset({"operate"}))


@pytest.mark.parametrize(
    ("header", "scope", "expected"),
    [
        ("Bearer viewer-token-xyz", "view", "viewer"),
        ("bearer   viewer-token-xyz  ", "view", "viewer"),
        ("Bearer operator-token-xyz", "view", "op"),
        ("Bearer operator-token-xyz", "operate", "op"),
        (None, "view", (401, "missing_token")),
        ("", "view", (401, "missing_token")),
        ("Bearer", "view", (401, "invalid_token")),
        ("Basic dmlld2VyOng=", "view", (401, "invalid_token")),
        ("Bearer viewer-token-xy", "view", (401, "invalid_token")),
        ("Bearer viewer-token-xyz", "operate", (403, "insufficient_scope")),
    ],
)
def test_authenticate(header: str | None, scope: str, expected: object) -> None:
    result = authenticate(header, [VIEWER, OPERATOR], scope)
    if isinstance(expected, str):
        assert isinstance(result, OperatorToken) and result.name == expected
    else:
        assert isinstance(result, AuthFailure) and (result.status, result.code) == expected
        assert "token-xy" not in result.detail


def test_no_configured_operator_lets_nobody_in() -> None:
    result = authenticate("Bearer anything-at-all", [], "view")
    assert isinstance(result, AuthFailure) and result.status == 401
    assert 'error="invalid_token"' in result.www_authenticate

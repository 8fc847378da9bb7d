"""Dashboard sessions and the sign-in throttle, on their own clocks."""

from __future__ import annotations

from effectgate.gateway.config.operator import OperatorToken
from effectgate.gateway.operator import sessions
from effectgate.gateway.operator.auth import hash_token

ALICE = OperatorToken("alice", bytes.fromhex(hash_token("alice-token-0123456789")), frozenset({"view"}))
BOB = OperatorToken("bob", bytes.fromhex(hash_token("bob-token-0123456789")), frozenset({"operate"}))
KEY = b"k" * 32


def test_a_session_names_its_operator_until_it_expires() -> None:
    cookie = sessions.issue(KEY, BOB, 600, now=1000)
    who = sessions.read(KEY, cookie, [ALICE, BOB], now=1599)
    assert who is not None and (who.name, who.scopes, who.expires) == ("bob", BOB.scopes, 1600)
    assert sessions.read(KEY, cookie, [ALICE, BOB], now=1600) is None
    # The operator's token changed or was removed: its sessions name no one.
    assert sessions.read(KEY, cookie, [ALICE], now=1001) is None


def test_each_session_has_its_own_form_token_and_id() -> None:
    one = sessions.read(KEY, sessions.issue(KEY, ALICE, 60, now=0), [ALICE], now=1)
    two = sessions.read(KEY, sessions.issue(KEY, ALICE, 60, now=0), [ALICE], now=1)
    assert one is not None and two is not None
    assert one.session_id != two.session_id and one.csrf != two.csrf


def test_a_changed_key_or_a_changed_byte_ends_the_session() -> None:
    cookie = sessions.issue(KEY, ALICE, 60, now=0)
    assert sessions.read(b"j" * 32, cookie, [ALICE], now=1) is None
    for i in range(len(cookie)):
        flipped = cookie[:i] + ("0" if cookie[i] != "0" else "1") + cookie[i + 1 :]
        assert sessions.read(KEY, flipped, [ALICE], now=1) is None
    for junk in (None, "", "v1", "." * 4, "x" * 1000, cookie + ".x"):
        assert sessions.read(KEY, junk, [ALICE], now=1) is None

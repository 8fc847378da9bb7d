"""[gateway]'s claim-path bounds: defaults from the batcher, values read, and a lock timeout that would end as
a statement timeout refused with the key named."""

from __future__ import annotations

import pytest

from effectgate.gateway.config import ConfigError, parse
from effectgate.ledger import claim_batcher

BASE = """
[sources.stripe]
scheme = "stripe"
secrets = ["S"]
"""
ENV = {"S": "whsec_x"}


def test_defaults_are_the_batchers() -> None:
    gw = parse(BASE, env=ENV).gateway
    assert (gw.claim_queue_max, gw.claim_deadline, gw.claim_lock_timeout, gw.claim_statement_timeout) == (
        claim_batcher.DEFAULT_MAX_QUEUE,
        claim_batcher.DEFAULT_DEADLINE,
        claim_batcher.DEFAULT_LOCK_TIMEOUT,
        claim_batcher.DEFAULT_STATEMENT_TIMEOUT,
    )


def test_values_are_read() -> None:
    text = (
        "[gateway]\nclaim_queue_max = 10\nclaim_deadline = 0.5\nclaim_lock_timeout = 0.1\n"
        "claim_statement_timeout = 2\n" + BASE
    )
    gw = parse(text, env=ENV).gateway
    assert (gw.claim_queue_max, gw.claim_deadline, gw.claim_lock_timeout, gw.claim_statement_timeout) == (
        10,
        0.5,
        0.1,
        2,
    )


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("claim_queue_max = 0", r"gateway\.claim_queue_max: must be >= 1"),
        ("claim_deadline = 0", r"gateway\.claim_deadline: must be >= 0\.001"),
        (
            "claim_lock_timeout = 5",
            r"gateway\.claim_lock_timeout: must be shorter than claim_statement_timeout",
        ),
    ],
)
def test_bad_values_name_their_key(setting: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse(f"[gateway]\n{setting}\n" + BASE, env=ENV)

"""What counts as a lost worker node in a shard read (ledger/cluster/shards.py): the messages Citus 12.1 and its
master_run_on_worker give for a node that is down or went away mid-read, and nothing a faulty read says."""

from __future__ import annotations

import pytest

from effectgate.ledger.cluster.shards import UNREACHABLE


@pytest.mark.parametrize(
    "message",
    [
        "failed to connect to 127.0.0.1:9702",  # master_run_on_worker, a node that refuses
        "query result unavailable",  # the node stopped mid-read (the chaos run)
        "connection lost",
        "failed to send query to 127.0.0.1:9702",
        "connection to the remote node postgres@127.0.0.1:9702 failed with the following error: Connection refused",
        "failure on connection marked as essential: 127.0.0.1:9702",  # a session's cached connection broke
    ],
)
def test_a_node_that_is_not_there_is_skipped(message: str) -> None:
    assert UNREACHABLE.search(message)


@pytest.mark.parametrize(
    "message",
    [
        'syntax error at or near "LIMIT"',
        'column "at" does not exist',
        'invalid input syntax for type timestamp with time zone: "x"',
        "permission denied for table jobs_102008",
    ],
)
def test_a_faulty_read_is_not_passed_off_as_a_lost_node(message: str) -> None:
    assert not UNREACHABLE.search(message)

"""A pass that skips a lost Citus node's shards is counted on /metrics, per pass and node, once per pass.

tests/citus/test_lost_node.py produces the skips with a node really stopped; here the count's own arithmetic."""

from __future__ import annotations

from effectgate.gateway import metrics
from effectgate.ledger.cluster import shards
from effectgate.ledger.cluster.shards import Skipped
from tests.prometheus import value

SKIPPED = "effectgate_shard_reads_skipped_total"


def test_each_pass_counts_each_node_it_skipped_once() -> None:
    lost, other = "10.0.0.7:5432", "10.0.0.8:5432"
    before = metrics.render()
    unlisten = shards.SKIPS.listen(metrics.shard_reads_skipped)
    try:
        # One pass that read three of a node's shards in two reads, and another node's one: each node once.
        shards.log_skipped(
            "fetch",
            [
                Skipped(lost, (102008, 102010), "refused"),
                Skipped(lost, (102012,), "refused"),
                Skipped(other, (7,), "x"),
            ],
        )
        shards.log_skipped("lease_rescuer", [Skipped(lost, (102008,), "refused")])
        shards.log_skipped("pending_waker", [])
    finally:
        unlisten()
    shards.log_skipped("fetch", [Skipped(lost, (102008,), "refused")])  # no one listening: not counted
    after = metrics.render()

    def grew(pass_name: str, node: str) -> float:
        return value(after, SKIPPED, pass_name=pass_name, node=node) - value(
            before, SKIPPED, pass_name=pass_name, node=node
        )

    assert (grew("fetch", lost), grew("fetch", other), grew("lease_rescuer", lost)) == (1, 1, 1)
    assert grew("pending_waker", lost) == 0


def test_a_failing_listener_does_not_fail_the_pass() -> None:
    def broken(pass_name: str, node: str, shards_skipped: int) -> None:
        raise RuntimeError("a listener's bug")

    unlisten = shards.SKIPS.listen(broken)
    try:
        shards.log_skipped("fetch", [Skipped("10.0.0.7:5432", (1,), "refused")])
    finally:
        unlisten()

"""What `effectgate migrate` says when a Citus step needs an object this role does not own: the steps it
could not take, by name, whether the ledger was never distributed or only needs a regroup."""

from __future__ import annotations

from effectgate.ledger.cluster.distribution import Step, not_owned_message


def test_an_undistributed_ledger_names_the_distribution_steps_and_the_tables_not_owned() -> None:
    foreign = [
        Step("distribute effects by tenant in a colocation group of its own", "effects", "effects", False),
        Step("distribute jobs by tenant, colocated with effects", "table", "jobs", False),
    ]
    message = not_owned_message("app", foreign)
    assert "role app does not own effects, jobs" in message
    assert (
        "distribute effects by tenant in a colocation group of its own; "
        "distribute jobs by tenant, colocated with effects" in message
    )
    assert "nothing was changed" in message


def test_a_regroup_of_a_distributed_ledger_is_not_called_undistributed() -> None:
    what = (
        "move effects out of the colocation group it shares with another schema's tables into one of its own"
    )
    message = not_owned_message("app", [Step(what, "regroup", "effects", False)])
    assert "not yet distributed" not in message
    assert what in message
    assert "role app does not own effects" in message

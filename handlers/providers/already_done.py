"""What a provider step records when its effect was already performed elsewhere (DESIGN invariant 16).

A capture made in a dashboard, a refund issued by hand, a label bought with the step's reference, an order
fulfilled in the admin: the provider then refuses the step's call with its documented "already in that
state" answer, or (for an API with no such answer) shows the finished object where the step looks first.
The step fetches the provider's object, checks that it is in the state the step wanted, and returns it as
its result, with one field added:

    recovered: "already_captured" | "already_refunded" | "already_bought" | "already_fulfilled"

The result is recorded by `ctx.step` like any other, so the job succeeds and a later attempt replays it; the
mark is how a handler, an operator reading the step, or a report tells a recognised effect from one this
step performed. The steps table has no column for it: a step's result is the one place a recorded outcome
carries detail, and `find=` (a lost answer of the step's *own* call) records its object unmarked.

A *different* terminal state (an intent canceled, not captured; an order cancelled, not fulfilled; a label
refunded) is not success: the step raises `TerminalError` with a message naming the state.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "ALREADY_BOUGHT",
    "ALREADY_CAPTURED",
    "ALREADY_FULFILLED",
    "ALREADY_REFUNDED",
    "RECOVERED",
    "recovered",
]

#: The result field that marks a step's outcome as found, not performed.
RECOVERED = "recovered"
ALREADY_CAPTURED = "already_captured"
ALREADY_REFUNDED = "already_refunded"
ALREADY_BOUGHT = "already_bought"
ALREADY_FULFILLED = "already_fulfilled"


def recovered(found: Mapping[str, Any], how: str) -> dict[str, Any]:
    """The provider's object `found`, as a step's result marked `recovered: how`."""
    return {**found, RECOVERED: how}

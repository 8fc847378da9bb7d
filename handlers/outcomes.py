"""How a slice of a job ends, and the signal a handler returns to hand the rest of its work back.

A handler that has spent its slice budget (``ctx.should_yield()``) returns ``HAND_BACK``: the job is
re-queued at once, keeps its attempt, and resumes from its last checkpoint on the next slice::

    if ctx.should_yield():
        return HAND_BACK
"""

from __future__ import annotations

import enum
from enum import StrEnum
from typing import Final


class HandBack(enum.Enum):
    """The type of ``HAND_BACK``; annotate a handler that may hand back as ``-> HandBack | None``."""

    HAND_BACK = "hand_back"

    def __repr__(self) -> str:
        return "HAND_BACK"


#: Return this from a handler to hand the rest of the work back: re-queued at once, attempt kept.
HAND_BACK: Final = HandBack.HAND_BACK


class SliceOutcome(StrEnum):
    """How one leased slice ended, as the worker reports it to its observer (and metrics label it)."""

    SUCCEEDED = "succeeded"  # finished
    FAILED = "failed"  # terminal error or attempts exhausted
    CANCELLED = "cancelled"  # a cancel was asked and won the transition
    PARKED = "parked"  # handed back as poison
    RETRY = "retry"  # given back with a backoff
    HANDED_BACK = "handed_back"  # slice budget spent or draining, re-queued at once
    ABANDONED = "abandoned"  # left to lease expiry: ignored its deadline, or the drain gave up on it
    LEASE_LOST = "lease_lost"  # someone else holds the job now; nothing of this slice was recorded
    CRASHED = "crashed"  # the outcome could not be recorded (database down); left to lease expiry

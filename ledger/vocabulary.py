"""The ledger's words, typed: job states, delivery outcomes, refusal codes.

Each is a ``StrEnum`` whose values are exactly what the database stores and what the operator API
and CLI print, so a member compares equal to, serialises as and is sent to Postgres as its text.
Code names a member, never the bare string: a typo is then an ``AttributeError`` at import or a
mypy error, not a branch that silently never runs.
"""

from __future__ import annotations

from enum import StrEnum


class JobState(StrEnum):
    """A job's state (the ``job_state`` type of migrations/0001); docs/state_machine.md draws them."""

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    PARKED = "parked"
    RESOLVED = "resolved"  # a failed or parked job an operator closed by hand (migrations/0016)


#: Reached once, left only by a redrive (failed, parked) or a resolution by hand (failed, parked → resolved).
TERMINAL_STATES = frozenset(
    {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.PARKED, JobState.RESOLVED}
)
#: The states an operator may redrive from; the same states wait for a human and may be resolved by hand.
REDRIVABLE_STATES = frozenset({JobState.FAILED, JobState.PARKED})


class DeliveryOutcome(StrEnum):
    """What one effect of a delivery came to (``deliveries.outcome``)."""

    ACCEPTED = "accepted"  # a new claim: the effect will run
    DUPLICATE = "duplicate"  # the same request again: counted, not run
    REJECTED = "rejected"  # another request under a held key: recorded, never run
    UNMATCHED = "unmatched"  # no handler asked for the event
    SUPERSEDED = "superseded"  # older than the newest version claimed for its object: recorded, never run
    REFUSED = "refused"  # verified, but could not become effects: kept with its body, replayable


class StepStatus(StrEnum):
    """How a recorded step ended (``steps.status``): its result, or the terminal error it raised.

    ``started`` is not an ending: a step with ``find=`` marks itself started before its call, so a later
    attempt knows the call may have reached the API (migrations/0015); its outcome replaces the marker.
    """

    STARTED = "started"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class RefusalCode(StrEnum):
    """Why an operator action on a job was not carried out."""

    NOT_FOUND = "not_found"
    NOT_CANCELLABLE = "not_cancellable"
    NOT_REDRIVABLE = "not_redrivable"
    UNRECOVERABLE_REQUIRES_FORCE = "unrecoverable_requires_force"
    # a step recorded a terminal error (a decline) that a redrive replays without calling the provider
    RECORDED_FAILURE_REQUIRES_FORCE = "recorded_failure_requires_force"
    LOCK_KEY_HELD = "lock_key_held"
    PAYLOAD_PURGED = "payload_purged"  # retention purged what the job would run on
    NOT_RESOLVABLE = "not_resolvable"  # only failed and parked jobs can be resolved by hand
    ALREADY_RESOLVED = "already_resolved"  # resolved before, by someone else or for another reason

"""What a handler is given: the verified event, and a terminal transition as ``on_transition`` sees it.

A module of its own, importing nothing else of the handler side, so the context and the registry can
both name ``Event`` without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from effectgate.ledger.vocabulary import JobState


@dataclass(frozen=True, slots=True)
class Event:
    """A verified event as a handler sees it."""

    source: str
    id: str
    type: str
    payload: Any
    tenant: str = "default"


@dataclass(frozen=True, slots=True)
class Transition:
    """A terminal transition, as the ``on_transition`` hook sees it (inside the same transaction)."""

    job_id: int
    effect_key: str
    state: JobState
    reason: str | None

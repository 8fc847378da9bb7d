"""Retry waits: how long a job whose attempt failed waits before its next one, and the whole schedule a
retry budget (backoff base, cap and ``max_attempts``) gives an effect before it fails for good.

One place for both, so the worker's waits and what ``effectgate config show`` prints cannot disagree.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..effect_kind import EffectKind
    from .config import WorkerConfig

__all__ = ["JITTER_LOW", "RetrySchedule", "backoff_delay", "kind_backoff"]

# A wait is drawn from [JITTER_LOW, 1] x its ceiling: jobs that failed together (one outage) come back
# spread out instead of in lockstep, and the shortest a schedule can be is JITTER_LOW x its ceilings.
JITTER_LOW = 0.5
# 2.0 ** 1024 raises OverflowError; past any real cap, a larger exponent changes nothing.
_MAX_EXPONENT = 1023


def backoff_delay(attempt: int, base: float, cap: float, rng: random.Random | None = None) -> float:
    """Exponential backoff with jitter: a random delay in [0.5, 1] * min(cap, base * 2 ** (attempt - 1))."""
    ceiling = _ceiling(attempt, base, cap)
    draw = rng.random() if rng is not None else random.random()
    return ceiling * (JITTER_LOW + (1.0 - JITTER_LOW) * draw)


def _ceiling(attempt: int, base: float, cap: float) -> float:
    return min(cap, base * 2.0 ** min(_MAX_EXPONENT, max(0, attempt - 1)))


def kind_backoff(kind: EffectKind, config: WorkerConfig) -> tuple[float, float]:
    """The (base, cap) a failed attempt of ``kind`` waits by: the kind's own where it sets them, else the
    worker's. A worker ``backoff_base`` of 0 turns every wait off, the kinds' own too: it is the one switch
    tests use, and a kind's setting must not bring the waits back under it. A kind that sets only a base
    above the worker's cap waits its base (the cap never shortens a wait below the first)."""
    if config.backoff_base == 0:
        return 0.0, 0.0
    base = config.backoff_base if kind.backoff_base is None else kind.backoff_base
    cap = config.backoff_cap if kind.backoff_cap is None else kind.backoff_cap
    return base, max(base, cap)


@dataclass(frozen=True, slots=True)
class RetrySchedule:
    """The waits a retry budget gives: after each failed attempt but the last, a wait drawn from
    [0.5, 1] x ``min(cap, base * 2 ** (attempt - 1))``; attempt ``max_attempts`` failing fails the job.
    ``shortest_total`` is how long an effect keeps being retried at the least (every draw at its low end),
    ``longest_total`` at the most. A ``Retry-After`` longer than a wait lengthens it."""

    base: float
    cap: float
    max_attempts: int

    def ceilings(self) -> tuple[float, ...]:
        """The longest wait after each failed attempt, 1 to ``max_attempts - 1``."""
        return tuple(_ceiling(n, self.base, self.cap) for n in range(1, self.max_attempts))

    @property
    def shortest_total(self) -> float:
        return JITTER_LOW * sum(self.ceilings())

    @property
    def longest_total(self) -> float:
        return sum(self.ceilings())

    def describe(self) -> list[str]:
        """The schedule in words: runs of equal waits folded (``after attempts 13-59: 30m-1h each``)."""
        ceilings = self.ceilings()
        if not ceilings:
            return ["no retry: the first failed attempt fails the job"]
        if self.base == 0:
            return [f"{len(ceilings)} retries at once (backoff_base = 0: waits off)"]
        lines = []
        start = 1
        for n in range(1, len(ceilings) + 1):
            if n < len(ceilings) and ceilings[n] == ceilings[n - 1]:
                continue
            ceiling = ceilings[n - 1]
            after = f"attempt {n}" if start == n else f"attempts {start}-{n}"
            each = "" if start == n else " each"
            lines.append(f"after {after}: {duration(JITTER_LOW * ceiling)}-{duration(ceiling)}{each}")
            start = n + 1
        lines.append(
            f"total before attempt {self.max_attempts} fails the job: "
            f"{duration(self.shortest_total)}-{duration(self.longest_total)}"
        )
        return lines


def duration(seconds: float) -> str:
    """``seconds`` for a reader: ``0.5s``, ``17m4s``, ``1d0h3m``."""
    if seconds < 60:
        return f"{seconds:.3g}s"
    whole = round(seconds)
    days, rest = divmod(whole, 86_400)
    hours, rest = divmod(rest, 3_600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours}h{minutes}m"
    if hours:
        return f"{hours}h{minutes}m" + (f"{secs}s" if secs else "")
    return f"{minutes}m" + (f"{secs}s" if secs else "")

"""Sweeps: the registry's own repair functions (``registry.sweep``), each under a lock of its own.

A sweep is user code that returns how many things it acted on. Each runs in a transaction of its own
under an advisory lock derived from its id: one that throws counts as one error and stops nothing else,
and two processes never run the same sweep at once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from ..db import Conn
from .service import lock_id, run_locked

Sweep = Callable[[Conn], Awaitable[int]]


def sweep_lock_id(sweep_id: str) -> int:
    """The advisory lock one sweep runs under: stable across processes and versions, signed 64-bit."""
    return lock_id("effectgate.sweep", sweep_id)


@dataclass(frozen=True, slots=True)
class SweepConfig:
    """Which sweeps run; ``enabled=False`` leaves every sweep to other processes (or to none)."""

    enabled: bool = True


@dataclass(slots=True)
class SweepResult:
    """Per sweep: how many things it acted on, what it raised, or that another process held it."""

    acted: dict[str, int] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        """Whether the pass did anything worth logging."""
        return bool(self.errors) or any(self.acted.values())


class SweepRunner:
    """Runs every registered sweep once, each in its own transaction under its own lock."""

    name = "sweeps"

    def __init__(self, sweeps: Mapping[str, Sweep] | None = None, config: SweepConfig | None = None) -> None:
        self.sweeps = dict(sweeps or {})
        self.config = config or SweepConfig()

    async def run_once(self, conn: Conn, *, now: datetime | None = None) -> SweepResult:
        """One pass over every sweep (``now`` is accepted for the common shape; sweeps read their own clock)."""
        result = SweepResult()
        if not self.config.enabled:
            return result
        for name, sweep in self.sweeps.items():
            try:
                owned, acted = await run_locked(conn, sweep_lock_id(name), lambda s=sweep: s(conn))  # type: ignore[misc]
            except Exception as exc:
                result.errors[name] = f"{type(exc).__name__}: {exc}"
                continue
            if not owned:
                result.skipped.append(name)
            else:
                result.acted[name] = int(acted or 0)
        return result

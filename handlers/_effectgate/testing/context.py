"""``MemoryContext``: the handler's ``EffectContext`` with its ledger in memory, for unit tests.

It *is* an ``EffectContext`` — a subclass that overrides only the methods which reach the database — so
``step`` (its replay rules, the ``find=`` marker, the check that a result can be recorded), the
idempotency keys and every property run the runtime's own code. A test in the project lists every
``EffectContext`` method that touches the pool and fails if this class does not override it, and another
compares the public members and signatures of the two classes.

Recorded steps live in a ``MemoryLedger`` shared by every run of one effect: ``ctx.rerun()`` is the next
attempt, which replays what the previous ones recorded exactly as a worker would.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

from effectgate.handlers.context import EffectContext, Services
from effectgate.handlers.event import Event
from effectgate.ledger import jobs
from effectgate.ledger.jobs.steps import RecordedStep
from effectgate.ledger.vocabulary import StepStatus

if TYPE_CHECKING:
    from effectgate.ledger import db

T = TypeVar("T")

# A slice budget no unit test reaches: ``should_yield`` answers only to cancel and drain requests.
UNBOUNDED_BUDGET = 1e9


@dataclass
class MemoryLedger:
    """The recorded steps and checkpoint of one effect, shared by its runs (attempts).

    ``steps`` maps a step name to what it recorded, exactly as the ledger's ``steps`` table would hold
    it: results round-tripped through JSON (a tuple comes back a list, as from Postgres).
    """

    steps: dict[str, RecordedStep] = field(default_factory=dict)
    checkpoint: Any = None
    # Step names that were run with find=: their lost answer leaves the started marker behind.
    found_with_find: set[str] = field(default_factory=set)

    def lose_answer(self, name: str) -> None:
        """Simulate a crash between step ``name``'s downstream call and its record: the next run calls
        again with the same key, or, for a step with ``find=``, looks with ``find`` first."""
        recorded = self.steps.pop(name, None)
        if recorded is None:
            raise KeyError(
                f"step {name!r} has recorded nothing to lose (recorded: {', '.join(self.steps) or 'none'})"
            )
        if name in self.found_with_find:
            self.steps[name] = _recorded(recorded.name, recorded.idempotency_key, StepStatus.STARTED)


class MemoryContext(EffectContext):
    """An ``EffectContext`` whose steps, checkpoints and keys live in memory (``MemoryLedger``).

    ``event`` is the event the handler gets (``example_event`` builds one from the ``send`` examples);
    ``effect_key`` and ``tenant`` default to what the real ingress would decide for it when built with
    ``context_for``. ``services`` holds the downstream clients (``ctx.payments``, ``ctx.shipping``,
    ``ctx.downstream(name)``): build them over an ``httpx.AsyncClient`` with a mock transport or a respx
    router (``services_over``). ``calls`` lists, for this run only, the steps whose ``fn`` was
    called (not replayed), and ``finds`` those whose ``find`` was.
    """

    def __init__(
        self,
        event: Event,
        *,
        effect_key: str,
        tenant: str | None = None,
        services: Services | None = None,
        ledger: MemoryLedger | None = None,
        attempt: int = 1,
        job_id: int = 1,
        kind: str = "handler",
    ) -> None:
        self.ledger = ledger if ledger is not None else MemoryLedger()
        self.calls: list[str] = []
        self.finds: list[str] = []
        lease = jobs.Lease(
            job_id=job_id,
            effect_id=job_id,
            kind=kind,
            tenant=tenant if tenant is not None else event.tenant,
            attempt=attempt,
            max_attempts=attempt,
            lease_token=attempt,
            checkpoint=self.ledger.checkpoint,
            cancel_requested=False,
            effect_key=effect_key,
            source=event.source,
            event_id=event.id,
            event_type=event.type,
            payload=event.payload,
        )
        super().__init__(
            pool=None,  # type: ignore[arg-type]  # every method that would use it is overridden
            lease=lease,
            event=event,
            # The runtime hands each slice its own snapshot of the recorded steps, read before it starts.
            recorded=dict(self.ledger.steps),
            services=services if services is not None else Services(),
            slice_budget=UNBOUNDED_BUDGET,
        )

    def rerun(self) -> MemoryContext:
        """The next attempt of the same effect: a fresh context over the same ``MemoryLedger``, which
        replays every step recorded so far (recorded results, recorded terminal errors)."""
        return MemoryContext(
            self.event,
            effect_key=self.effect_key,
            tenant=self.tenant,
            services=self._services,
            ledger=self.ledger,
            attempt=self.attempt + 1,
            job_id=self.job_id,
            kind=self._lease.kind,
        )

    @property
    def kind(self) -> str:
        """The name of the handler this context runs (``run_handler`` looks it up in the registry)."""
        return self._lease.kind

    @property
    def steps(self) -> Mapping[str, RecordedStep]:
        """Every step recorded for this effect so far (by any run), by name."""
        return dict(self.ledger.steps)

    # -- counting what reached the downstream ------------------------------------------------------

    async def step(
        self,
        name: str,
        fn: Callable[[str], Awaitable[T]],
        *,
        find: Callable[[str], Awaitable[T | None]] | None = None,
    ) -> T:
        """``EffectContext.step``, recording into this context's ``MemoryLedger``."""

        async def called(key: str) -> T:
            self.calls.append(name)
            return await fn(key)

        async def looked(key: str) -> T | None:
            assert find is not None
            self.finds.append(name)
            return await find(key)

        if find is not None:
            self.ledger.found_with_find.add(name)
        return await super().step(name, called, find=None if find is None else looked)

    # -- the database, in memory -----------------------------------------------------------------

    async def _record(
        self,
        name: str,
        key: str,
        status: StepStatus,
        *,
        result: Any = None,
        error: Any = None,
        found: bool = False,
    ) -> None:
        self._check_fence()
        # What Postgres would give back from a jsonb column: a JSON round trip.
        self.ledger.steps[name] = _recorded(name, key, status, _jsonb(result), _jsonb(error), self, found)

    async def _mark_started(self, name: str, key: str) -> None:
        self._check_fence()
        self.ledger.steps[name] = _recorded(name, key, StepStatus.STARTED, context=self)

    async def save_checkpoint(self, value: Any) -> None:
        """Keep a resume point in the ``MemoryLedger``; the next ``rerun()`` starts from it."""
        self._check_fence()
        self.ledger.checkpoint = _jsonb(value)
        self._checkpoint = self.ledger.checkpoint

    async def fenced_write(self, fn: Callable[[db.Conn], Awaitable[T]]) -> T:
        """Not available in memory: a fenced write needs the ledger's database. Test such a handler with
        the pytest plugin's ``effectgate_ledger`` fixture, which runs it through the real worker."""
        raise RuntimeError(
            "fenced_write needs a database: run this handler with the effectgate_ledger fixture "
            "(pytest_plugins = ['effectgate.testing.pytest_plugin'])"
        )


def _jsonb(value: Any) -> Any:
    return None if value is None else json.loads(json.dumps(value))


def _recorded(
    name: str,
    key: str,
    status: StepStatus,
    result: Any = None,
    error: Any = None,
    context: MemoryContext | None = None,
    found: bool = False,
) -> RecordedStep:
    return RecordedStep(
        name=name,
        idempotency_key=key,
        status=status,
        result=result,
        error=error,
        job_id=context.job_id if context is not None else 0,
        lease_token=context.attempt if context is not None else 0,
        recorded_at=datetime.now(UTC),
        found=found,
    )

"""What a handler runs with: recorded steps, idempotency keys, checkpoints, the slice budget.

Every write the context makes is fenced by the lease token the job was claimed with; once the
lease is lost (or the slice abandoned), every later write raises ``LeaseLost`` and changes nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from effectgate.ledger import db, jobs
from effectgate.ledger.cluster.topology import SINGLE_NODE, Topology
from effectgate.ledger.errors import LeaseLost, LedgerUnavailable, StepAlreadyRecorded
from effectgate.ledger.jobs import steps
from effectgate.ledger.jobs.steps import RecordedStep
from effectgate.ledger.storable import jsonb_problem
from effectgate.ledger.vocabulary import StepStatus

from . import tracing
from .errors import StepAlreadyRun, TerminalError, UnrecoverableError, facts
from .event import Event
from .idempotency import idempotency_key

if TYPE_CHECKING:
    import httpx

    from .downstream import DownstreamClient
    from .downstream.payments import PaymentsClient
    from .downstream.shipping import ShippingClient

T = TypeVar("T")

log = logging.getLogger("effectgate.worker")


@dataclass(slots=True)
class Services:
    """Clients a handler can reach through its context; configured once per worker process."""

    http: httpx.AsyncClient | None = None
    payments: PaymentsClient | None = None
    shipping: ShippingClient | None = None
    # Every [downstream.NAME] of the configuration, payments and shipping included (``ctx.downstream``).
    downstreams: Mapping[str, DownstreamClient] = field(default_factory=dict)


class EffectContext:
    """The handle a running handler gets: ``step``, ``checkpoint``, ``should_yield`` and the clients."""

    def __init__(
        self,
        *,
        pool: db.Pool,
        lease: jobs.Lease,
        event: Event,
        recorded: dict[str, RecordedStep],
        services: Services,
        slice_budget: float,
        clock: Callable[[], float] = time.monotonic,
        topology: Topology = SINGLE_NODE,
        outage_wait: float = 0.0,
    ) -> None:
        self._pool = pool
        # How long a step's record or marker, or a checkpoint, is retried while the database is lost (the
        # worker gives its kind's lease TTL): a failover must not turn a call that reached the downstream into
        # an orphan. Past the TTL the lease may be rescued anyway, and the fence refuses a late write.
        self._outage_wait = outage_wait
        self._lease = lease
        # On a ledger distributed by tenant (Citus) a step's write is two router statements (ledger.jobs.steps).
        self._topology = topology
        self.event = event
        self._recorded = recorded
        self._services = services
        self._used: set[str] = set()
        # The exceptions that left a step, with the step's name: what a retry or failure log line names.
        self._step_errors: list[tuple[BaseException, str]] = []
        self._clock = clock
        self._deadline = clock() + slice_budget
        self._checkpoint = lease.checkpoint
        self.cancel_requested = lease.cancel_requested
        self.draining = False
        # Set by the runtime when the lease is gone or the slice abandoned: refuse every later write
        # without asking the database, which could only refuse it too.
        self.fenced_off = False

    @property
    def job_id(self) -> int:
        """The job this slice runs."""
        return self._lease.job_id

    @property
    def effect_key(self) -> str:
        """The logical effect key this job performs."""
        return self._lease.effect_key

    @property
    def handler(self) -> str:
        """The name of the effect kind this job runs."""
        return self._lease.kind

    @property
    def tenant(self) -> str:
        """The tenant the effect belongs to."""
        return self._lease.tenant

    @property
    def attempt(self) -> int:
        """Which attempt this is, from 1; for logs only, never for idempotency keys."""
        return self._lease.attempt

    @property
    def checkpoint(self) -> Any:
        """The last committed resume point, or ``None``."""
        return self._checkpoint

    @property
    def payments(self) -> PaymentsClient:
        """The payment API client (``[downstream.payments]`` in the configuration)."""
        if self._services.payments is None:
            raise RuntimeError("no payments client: configure [downstream.payments]")
        return self._services.payments

    @property
    def shipping(self) -> ShippingClient:
        """The shipping API client (``[downstream.shipping]`` in the configuration)."""
        if self._services.shipping is None:
            raise RuntimeError("no shipping client: configure [downstream.shipping]")
        return self._services.shipping

    def downstream(self, name: str) -> DownstreamClient:
        """The client of ``[downstream.NAME]``: its base URL, credentials, idempotency header and timeouts.

        An unconfigured name raises ``TerminalError`` (code ``unknown_downstream``) naming the configured
        ones: retrying cannot fix a configuration, and a redrive after fixing it runs the job again.
        """
        client = self._services.downstreams.get(name)
        if client is None:
            known = ", ".join(sorted(self._services.downstreams)) or "none"
            raise TerminalError(
                f"no downstream {name!r}: configure [downstream.{name}] (configured: {known})",
                code="unknown_downstream",
            )
        return client

    @property
    def http(self) -> httpx.AsyncClient:
        """A shared HTTP client for other downstream calls."""
        if self._services.http is None:
            raise RuntimeError("no HTTP client in this worker")
        return self._services.http

    def idempotency_key(self, step: str) -> str:
        """The downstream idempotency key of ``step`` for this effect, without running it."""
        return idempotency_key(self.tenant, self.effect_key, step)

    def should_yield(self) -> bool:
        """True once the slice budget is spent, a cancel was requested or the worker is draining."""
        return self.cancel_requested or self.draining or self._clock() >= self._deadline

    def _check_fence(self) -> None:
        if self.fenced_off:
            raise LeaseLost(self._lease.job_id, self._lease.lease_token)

    async def step(
        self,
        name: str,
        fn: Callable[[str], Awaitable[T]],
        *,
        find: Callable[[str], Awaitable[T | None]] | None = None,
    ) -> T:
        """Run ``fn(idempotency_key)`` once per (effect, ``name``) and record its result, fenced.

        A step recorded by any earlier attempt returns its recorded result without calling ``fn``
        (or raises its recorded terminal error again). Only a crash between ``fn`` returning and the
        record committing repeats the call — with the same idempotency key, which is what makes the
        downstream answer with the original result instead of acting twice.

        ``find`` is for a downstream that takes no idempotency key. ``fn`` stamps the key into a field
        of what it creates (a reference, metadata, a tag) and ``find(key)`` searches that field, returning
        the object or ``None``. The step then commits a ``started`` marker before calling ``fn``; a later
        attempt that sees the marker without an outcome calls ``find(key)`` first and records what it
        returns instead of calling ``fn`` again. Errors ``find`` raises count as the step's, like ``fn``'s.
        """
        attributes: dict[str, tracing.AttributeValue] = {
            "effectgate.effect_key": self.effect_key,
            "effectgate.step": name,
            # A started marker is not an answer: the step still runs (or looks with find).
            "effectgate.step.replayed": name in self._recorded
            and self._recorded[name].status != StepStatus.STARTED,
        }
        with tracing.span("effectgate.step", attributes):
            try:
                return await self._step(name, fn, find)
            except BaseException as exc:
                self._step_errors.append((exc, name))
                raise

    def step_of(self, exc: BaseException) -> str | None:
        """The step ``exc`` left (or the one an exception it was raised from or during left), or
        ``None`` when it came from outside every step."""
        seen: set[int] = set()
        chain: BaseException | None = exc
        while chain is not None and id(chain) not in seen:
            seen.add(id(chain))
            for error, name in reversed(self._step_errors):
                if error is chain:
                    return name
            chain = chain.__cause__ or chain.__context__
        return None

    async def _step(
        self,
        name: str,
        fn: Callable[[str], Awaitable[T]],
        find: Callable[[str], Awaitable[T | None]] | None,
    ) -> T:
        if name in self._used:
            raise StepAlreadyRun(f"step {name!r} ran already in this handler run; step names must be unique")
        self._used.add(name)
        recorded = self._recorded.get(name)
        started = recorded is not None and recorded.status == StepStatus.STARTED
        if recorded is not None and not started:
            if recorded.status == StepStatus.SUCCEEDED:
                return recorded.result  # type: ignore[no-any-return]
            error = recorded.error or {}
            # Replayed as the same class, so an unrecoverable failure still needs force to redrive.
            replay = UnrecoverableError if error.get("type") == UnrecoverableError.__name__ else TerminalError
            # With the provider's facts as recorded, so the replaying attempt's record still names them.
            raise replay(
                error.get("message"),
                code=error.get("code"),
                http_status=_int_or_none(error.get("http_status")),
                request_id=_str_or_none(error.get("request_id")),
                decline_code=_str_or_none(error.get("decline_code")),
            )
        self._check_fence()
        key = self.idempotency_key(name)
        try:
            found = None
            if find is not None and started:
                # An earlier attempt committed the marker, so its call may have reached the API and its
                # answer been lost: look before creating a second one.
                found = await find(key)
            elif find is not None:
                # Committed before the call: were it written after, a crash in between would leave no
                # sign that anything was sent, and the next attempt would create again without looking.
                await self._mark_started(name, key)
            result = found if found is not None else await fn(key)
        except TerminalError as exc:
            await self._record(name, key, StepStatus.FAILED, error=_error_record(exc))
            raise
        problem = jsonb_problem(result)
        if problem is not None:
            # The call happened; a result we cannot record would re-run it on every retry. A bug to fix.
            raise UnrecoverableError(f"step {name!r} returned a value the ledger cannot record: {problem}")
        # Found, not called: the record says so, and the timeline shows the step as recovered by find=.
        await self._record(name, key, StepStatus.SUCCEEDED, result=result, found=found is not None)
        return result

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
        tries = 0

        async def record() -> None:
            nonlocal tries
            tries += 1
            self._check_fence()
            async with db.connection(self._pool) as conn:
                try:
                    await steps.record(
                        conn,
                        job_id=self._lease.job_id,
                        lease_token=self._lease.lease_token,
                        tenant=self._lease.tenant,
                        topology=self._topology,
                        name=name,
                        idempotency_key=key,
                        status=status,
                        result=result,
                        error=error,
                        found=found,
                    )
                except StepAlreadyRecorded:
                    # A try before this one committed and lost its answer with its connection: under the
                    # lease this slice still holds, no one else could have recorded this step's outcome (an
                    # earlier attempt's would have been returned above, without a call).
                    if tries == 1:
                        raise

        await self._outlast_outage(record, name)

    async def _outlast_outage(self, write: Callable[[], Awaitable[None]], what: str) -> None:
        def retrying(exc: LedgerUnavailable, delay: float) -> None:
            log.warning(
                "worker.write_retry",
                extra={"job_id": self.job_id, "write": what, "delay": delay, "error": str(exc)},
            )

        await db.retry_while_unavailable(write, within=self._outage_wait, on_retry=retrying)

    async def _mark_started(self, name: str, key: str) -> None:
        self._check_fence()

        async def mark() -> None:
            # Sent again after a lost connection, it moves this attempt's own marker to itself: no change.
            self._check_fence()
            async with db.connection(self._pool) as conn:
                await steps.mark_started(
                    conn,
                    job_id=self._lease.job_id,
                    lease_token=self._lease.lease_token,
                    tenant=self._lease.tenant,
                    topology=self._topology,
                    name=name,
                    idempotency_key=key,
                )

        await self._outlast_outage(mark, f"{name} started")

    async def save_checkpoint(self, value: Any) -> None:
        """Commit a resume point, fenced; a reclaimed job starts from the last one committed."""
        self._check_fence()

        async def save() -> None:
            self._check_fence()
            async with db.connection(self._pool) as conn:
                await jobs.save_checkpoint(
                    conn, self._lease.job_id, self._lease.lease_token, value, tenant=self._lease.tenant
                )

        await self._outlast_outage(save, "checkpoint")
        self._checkpoint = value

    async def fenced_write(self, fn: Callable[[db.Conn], Awaitable[T]]) -> T:
        """Run ``fn(conn)`` in a transaction that commits only while this slice holds the lease."""
        self._check_fence()
        async with (
            db.connection(self._pool) as conn,
            jobs.fenced_transaction(
                conn, self._lease.job_id, self._lease.lease_token, tenant=self._lease.tenant
            ),
        ):
            return await fn(conn)


def _error_record(exc: BaseException) -> dict[str, Any]:
    return {"type": type(exc).__name__, "message": str(exc), "code": getattr(exc, "code", None), **facts(exc)}


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None

"""Seams through which the worker and the downstream clients report what happened, for metrics.

``handlers`` must not import ``gateway``, so nothing here counts: the composition root hands in
callables (``gateway.cli.worker`` passes the ``gateway.metrics`` functions). Without them the worker
and the clients pay one ``None`` check per event. An observer that raises is logged and ignored:
counting must never change the outcome of a job or of a downstream call.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from effectgate.ledger.maintenance.scheduler import ReconcileResult
from effectgate.ledger.vocabulary import JobState

from .outcomes import SliceOutcome

log = logging.getLogger("effectgate.observe")

#: ``(kind, outcome, seconds)`` when a slice ends.
SliceObserver = Callable[[str, SliceOutcome, float], None]
#: ``(kind)`` per retry scheduled, or per job the reconciler took back from an expired lease.
KindObserver = Callable[[str], None]
#: ``()`` when a reconciler pass finished (owned by this process or not), for a "last tick" gauge.
TickObserver = Callable[[], None]
#: ``(service, status, seconds)`` per downstream call: the HTTP status code, or the transport error's class
#: name, and the call's wall time (sending the request to reading the answer, or to the error).
CallObserver = Callable[[str, int | str, float], None]

SLICE_OUTCOMES = frozenset(SliceOutcome)
# Reconciler repairs that took a job back from a worker whose lease expired; a cancel that lands on an
# expired lease is the operator's doing, not a reclaim.
RECLAIM_STATES = frozenset({JobState.PENDING, JobState.PARKED})


@dataclass(frozen=True, slots=True)
class WorkerObserver:
    """What a worker reports, each part optional: slice ends, retries scheduled, reclaims by the reconciler.

    ``on_slice(kind, outcome, seconds)`` runs once per leased slice with one of ``SLICE_OUTCOMES`` and the
    slice's wall time; ``on_retry(kind)`` once per attempt given back with a backoff; ``on_reclaim(kind)``
    once per job a reconciler pass of this process redrove or parked after its lease expired;
    ``on_tick()`` once per reconciler pass that finished.
    """

    on_slice: SliceObserver | None = None
    on_retry: KindObserver | None = None
    on_reclaim: KindObserver | None = None
    on_tick: TickObserver | None = None

    def slice_ended(self, kind: str, outcome: SliceOutcome, seconds: float) -> None:
        """Report one slice's end to ``on_slice``, if set."""
        if self.on_slice is not None:
            _safely(self.on_slice, kind, outcome, seconds)

    def retry_scheduled(self, kind: str) -> None:
        """Report one retry to ``on_retry``, if set."""
        if self.on_retry is not None:
            _safely(self.on_retry, kind)

    def reconciled(self, result: ReconcileResult) -> None:
        """Report the pass to ``on_tick`` and each job ``result`` redrove or parked to ``on_reclaim``."""
        if self.on_tick is not None:
            _safely(self.on_tick)
        if self.on_reclaim is not None:
            for repaired in result.repaired:
                if repaired.state in RECLAIM_STATES:
                    _safely(self.on_reclaim, repaired.kind)


def report_call(on_call: CallObserver | None, service: str, status: int | str, seconds: float) -> None:
    """Report one downstream call to ``on_call``, if set."""
    if on_call is not None:
        _safely(on_call, service, status, seconds)


def _safely(fn: Callable[..., None], *args: object) -> None:
    try:
        fn(*args)
    except Exception as exc:
        log.warning("observer.failed", extra={"error": f"{type(exc).__name__}: {exc}"})

"""The fake providers' idempotency layer: `Idempotency-Key` honoured the way Stripe documents it, in front of
a fake's endpoints, with the faults injected around it. ``IdempotentFake`` holds it; the fake Stripe and
shipping API (``providers``) is its subclass.

For POST requests carrying the header (keys are scoped to one fake's instance, as Stripe scopes them to an
account):

    first use of a key               → run the endpoint, store its answer
    same key, same parameters        → the stored answer byte-for-byte, plus `Idempotent-Replayed: true`
    same key, different parameters   → 400 idempotency_error
    same key, first still running    → 409 idempotency_error / idempotency_key_in_use
    parameters that fail validation  → the error, and the key stays unused (Stripe saves no result then)

Every request, with a key or without, is recorded (the latest ``_RECORDED_REQUESTS``) and counted, and may
draw a fault (``faults``): a 500 or a 429 in front of the layer, so nothing is stored; a hang before or after
the effect; or the connection dropped after it.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import anyio
from starlette.requests import Request
from starlette.responses import Response

from .answers import Answer, Invalid, deliver, error_body, reply, request_fingerprint
from .faults import FaultConfig, FaultMode, sleep_unless_gone

# Stripe refuses longer keys; the fake does too, so a client that sends one fails here and not in production.
_MAX_KEY_LENGTH = 255
_RECORDED_REQUESTS = 1000
_RECORDED_HEADERS = ("idempotency-key", "traceparent", "tracestate")
_RATE_LIMIT_RETRY_AFTER = 7


@dataclass(slots=True)
class _KeyRecord:
    fingerprint: str
    answer: Answer | None = None  # None while the first request with the key is still running


_Action = Callable[[Request, bytes], Answer]


class LayerCounts(Protocol):
    """The counts the idempotency layer keeps among a fake's counters."""

    requests: int
    replays: int
    requests_without_key: int


class IdempotentFake:
    """One fake's state behind one lock, with Stripe's idempotency layer in front of its endpoints.

    A subclass holds its effects and its counters (``_counters``, the layer's three counts among them), clears
    them in its ``_clear`` after this one's, and serves each endpoint through ``endpoint``; the lock, the stored
    answers, the recorded requests and the faults are this class's.
    """

    _counters: LayerCounts

    def __init__(self, faults: FaultConfig) -> None:
        # One lock for all state. The sections it guards contain no await today, but the idempotency claim
        # (look up, then insert) and each effect (check state, then change it) must stay atomic against
        # interleaving requests if one is ever added.
        self._lock = asyncio.Lock()
        self._set_faults(faults)
        self._clear()

    def _clear(self) -> None:
        self._keys: dict[str, _KeyRecord] = {}
        self._requests: deque[dict[str, Any]] = deque(maxlen=_RECORDED_REQUESTS)

    def _set_faults(self, faults: FaultConfig) -> None:
        self._faults = faults
        self._rng = random.Random(faults.seed)

    def _draw_fault(self, path: str) -> FaultMode:
        faults = self._faults
        if faults.mode == "none":
            return "none"
        if faults.paths and not any(path.startswith(prefix) for prefix in faults.paths):
            return "none"
        return faults.mode if self._rng.random() < faults.rate else "none"

    def endpoint(self, action: _Action, *, mutating: bool) -> Callable[[Request], Awaitable[Response]]:
        async def run(request: Request) -> Response:
            return await self._serve(request, action, mutating=mutating)

        return run

    async def _serve(self, request: Request, action: _Action, *, mutating: bool) -> Response:
        body = await request.body()
        key = request.headers.get("idempotency-key") or None
        if not mutating:
            key = None  # Stripe ignores idempotency keys on GET: reading twice has no effect to guard
        async with self._lock:
            self._counters.requests += 1
            self._requests.append(
                {
                    "method": request.method,
                    "path": request.url.path,
                    "headers": {h: request.headers[h] for h in _RECORDED_HEADERS if h in request.headers},
                    # When it arrived (this host's clock, seconds): how fast the callers together sent.
                    "at": time.time(),
                }
            )
            if mutating and key is None:
                self._counters.requests_without_key += 1
            fault = self._draw_fault(request.url.path)
        if fault == "error_500":
            # Injected in front of the idempotency layer, like a failing load balancer: nothing is stored,
            # so a retry with the same key runs the endpoint for real.
            return reply(500, error_body("api_error", "fake_fault", "Injected error_500 fault."))
        if fault == "rate_limit":
            response = reply(429, error_body("invalid_request_error", "rate_limit", "Too many requests."))
            response.headers["Retry-After"] = str(_RATE_LIMIT_RETRY_AFTER)
            return response
        if key is not None and len(key) > _MAX_KEY_LENGTH:
            return reply(
                400, error_body("invalid_request_error", "idempotency_key_too_long", "Key too long.")
            )

        record: _KeyRecord | None = None
        if key is not None:
            fingerprint = request_fingerprint(request, body)
            async with self._lock:
                existing = self._keys.get(key)
                if existing is None:
                    record = self._keys[key] = _KeyRecord(fingerprint)
            if existing is not None:
                return await self._answer_again(request, existing, fingerprint, key, fault)

        done = False
        try:
            if fault == "hang" and await sleep_unless_gone(request, self._faults.hang_seconds):
                return reply(503, error_body("api_error", "client_disconnected", "The client went away."))
            async with self._lock:
                try:
                    answer = action(request, body)
                except Invalid as invalid:
                    answer = invalid.answer
                else:
                    if record is not None:
                        record.answer = answer
                        done = True
            if fault == "hang_after_effect":
                await sleep_unless_gone(request, self._faults.hang_seconds)
        finally:
            # Abandoned (cancelled, disconnected, invalid, crashed): free the key so a retry can run, as
            # Stripe does for requests whose endpoint never completed.
            if record is not None and not done and key is not None:
                with anyio.CancelScope(shield=True):
                    async with self._lock:
                        if self._keys.get(key) is record:
                            del self._keys[key]
        return deliver(answer, key, fault, replayed=False)

    async def _answer_again(
        self, request: Request, existing: _KeyRecord, fingerprint: str, key: str, fault: FaultMode
    ) -> Response:
        if existing.fingerprint != fingerprint:
            message = (
                "Keys for idempotent requests can only be used with the same parameters "
                "they were first used with."
            )
            return reply(400, error_body("idempotency_error", None, message))
        if existing.answer is None:
            message = "There is currently another in-progress request using this Idempotent Key."
            return reply(409, error_body("idempotency_error", "idempotency_key_in_use", message))
        if fault == "hang" and await sleep_unless_gone(request, self._faults.hang_seconds):
            return reply(503, error_body("api_error", "client_disconnected", "The client went away."))
        async with self._lock:
            self._counters.replays += 1
        return deliver(existing.answer, key, fault, replayed=True)

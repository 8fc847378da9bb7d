"""Stripe through its own SDK (`stripe`, 16.x): capture, refund and transfer as recorded steps.

Each call runs inside `ctx.step`, sends the step's key as Stripe's `Idempotency-Key` (the `idempotency_key`
request option), and turns Stripe's errors into the handler outcomes:

    RateLimitError (429, lock_timeout)   → TransientError, retry_after from `Retry-After`
    APIConnectionError                   → TransientError (the call may have reached Stripe: replay the key)
    APIError (5xx, 409 key in use)       → TransientError
    IdempotencyError                     → UnrecoverableError (the key was used with other parameters: a bug)
    CardError, InvalidRequestError,
    AuthenticationError, PermissionError,
    any other StripeError                → TerminalError, code = Stripe's error code

What already happened counts as done (`already_done`): a capture refused with
`payment_intent_unexpected_state` and a refund refused with `charge_already_refunded` read the intent back,
and an intent in the state the step wanted is its outcome, marked `recovered`. A transfer has no such state
to read: a new transfer is a new object, so only the idempotency key guards it.

Stripe keeps an idempotent answer for at least 24 hours and replays it, `Idempotent-Replayed: true`, to a
request with the same key and parameters (https://docs.stripe.com/api/idempotent_requests). That is what
makes the one crash window of a recorded step — the call reached Stripe, its record never committed — safe.

Every call is sent with `max_network_retries=0`, whatever the client was built with: the SDK's own retries
would sleep inside the job's slice, unseen by the lease deadline, the attempt limit and the operator, and
retry errors the job runtime would have classified otherwise. The job runtime re-runs the step with the
same key instead, with backoff it owns.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from effectgate.handlers.context import EffectContext
from effectgate.handlers.downstream import DownstreamConfig, Pace, retry_after_seconds
from effectgate.handlers.errors import HandlerError, TerminalError, TransientError, UnrecoverableError
from effectgate.handlers.providers.already_done import ALREADY_CAPTURED, ALREADY_REFUNDED, recovered

if TYPE_CHECKING:
    import stripe

__all__ = ["StripeSteps", "call_stripe", "close_clients", "outcome_of", "stripe_client", "stripe_steps"]

# One SDK client per configured downstream and process: the SDK pools its connections per client.
_STEPS: dict[tuple[str, DownstreamConfig], StripeSteps] = {}
_HTTP: dict[tuple[str, DownstreamConfig], stripe.HTTPXClient] = {}


def _require_sdk() -> None:
    """Stripe's SDK is an optional extra: say how to get it, once, where it is first needed."""
    try:
        import stripe  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            "effectgate.handlers.providers.stripe needs Stripe's SDK: pip install 'effectgate[stripe]'"
        ) from exc


def stripe_client(
    api_key: str,
    *,
    base_url: str | None = None,
    timeout: float = 30.0,
    http_client: stripe.HTTPClient | None = None,
) -> stripe.StripeClient:
    """A `stripe.StripeClient` for use inside steps: async HTTP (httpx), no SDK retries, `timeout` seconds.

    `base_url` replaces `https://api.stripe.com` (Stripe's own `base_addresses={"api": …}` setting), which is
    how tests and demos point the SDK at a local fake. `http_client` (default: a new `stripe.HTTPXClient`
    with `timeout`) is yours to close with `await http_client.close_async()` when the process stops.
    """
    _require_sdk()
    import stripe

    if not isinstance(api_key, str) or not api_key or api_key != api_key.strip():
        raise ValueError("api_key must be a non-empty string without surrounding whitespace")
    if not (isinstance(timeout, int | float) and timeout > 0):
        raise ValueError(f"timeout must be a number of seconds > 0, got {timeout!r}")
    return stripe.StripeClient(
        api_key,
        base_addresses={"api": base_url.rstrip("/")} if base_url else None,
        max_network_retries=0,
        http_client=http_client or stripe.HTTPXClient(timeout=timeout),
    )


def stripe_steps(ctx: EffectContext, name: str = "stripe") -> StripeSteps:
    """`StripeSteps` over the SDK, configured by `[downstream.NAME]`: its `base_url`, key and `timeout`.

    The API key comes from `api_key_env`/`api_key_file` like any downstream's; `base_url` is Stripe's
    (`https://api.stripe.com`) or a local fake's. One SDK client per downstream and process.
    """
    config = ctx.downstream(name).config
    steps = _STEPS.get((name, config))
    if steps is None:
        if config.api_key is None:
            raise TerminalError(f"[downstream.{name}] has no api key for Stripe", code="no_api_key")
        import stripe

        http = stripe.HTTPXClient(timeout=config.timeout)
        client = stripe_client(
            config.api_key, base_url=config.base_url, timeout=config.timeout, http_client=http
        )
        steps = _STEPS[(name, config)] = StripeSteps(client, downstream=name)
        _HTTP[(name, config)] = http
    return steps


async def close_clients() -> None:
    """Close the SDK clients ``stripe_steps`` built in this process, and forget them (the next
    ``stripe_steps`` builds a new one): for a process that stops, and for tests, whose event loop and
    fake server end with the test while the clients' pooled connections would outlive both."""
    while _HTTP:
        key, http = _HTTP.popitem()
        _STEPS.pop(key, None)
        await http.close_async()  # type: ignore[no-untyped-call]  # stripe 16 leaves it unannotated


class StripeSteps:
    """Stripe calls a handler makes as recorded steps, each once per (effect, step name).

    Each method takes the handler's context and a step name (default: the call's name), runs the call in
    `ctx.step` with the step's idempotency key, and returns the Stripe object as a plain dict — the value the
    ledger records and a later attempt gets back without calling Stripe again.
    """

    def __init__(self, client: stripe.StripeClient, *, downstream: str | None = None) -> None:
        """`downstream` names the `[downstream.NAME]` whose `Pace` (its `max_in_flight`, `max_per_second`
        and a 429's hold) the calls take turns by; None: not paced (`stripe_steps` passes its name)."""
        self._client = client
        self._downstream = downstream

    def _pace(self, ctx: EffectContext) -> Pace | None:
        return ctx.downstream(self._downstream).pace if self._downstream is not None else None

    async def capture(
        self,
        ctx: EffectContext,
        payment_intent: str,
        *,
        amount_to_capture: int | None = None,
        step: str = "capture",
    ) -> dict[str, Any]:
        """Capture a `requires_capture` payment intent, in full or for `amount_to_capture` minor units.

        An intent captured already — in the Dashboard, automatically, or by this step's own call once
        Stripe's 24-hour idempotency window has passed — is refused by Stripe with
        `payment_intent_unexpected_state`. The step then retrieves the intent: `succeeded` with
        `amount_received` equal to the amount this step captures is its outcome, returned with
        `recovered: "already_captured"`. Any other state (`canceled`, or captured for another amount) is a
        `TerminalError` naming it.
        """
        params: dict[str, Any] = {}
        if amount_to_capture is not None:
            params["amount_to_capture"] = amount_to_capture
        service = self._client.v1.payment_intents
        pace = self._pace(ctx)

        async def capture(key: str) -> dict[str, Any]:
            try:
                return await call_stripe(
                    lambda: service.capture_async(payment_intent, params, _options(key)),  # type: ignore[arg-type]
                    pace=pace,
                )
            except TerminalError as refused:
                if refused.code != "payment_intent_unexpected_state":
                    raise
                intent = await call_stripe(
                    lambda: service.retrieve_async(payment_intent, None, _READ), pace=pace
                )
                return _captured_already(intent, amount_to_capture, refused)

        return await ctx.step(step, capture)

    async def refund(
        self,
        ctx: EffectContext,
        *,
        payment_intent: str,
        amount: int | None = None,
        reason: str | None = None,
        step: str = "refund",
    ) -> dict[str, Any]:
        """Refund a captured payment intent, in full or for `amount` minor units.

        A charge refunded in full already (in the Dashboard, or by this step's own call once Stripe's
        idempotency window has passed) is refused by Stripe with `charge_already_refunded`. The step then
        reads the intent and its refunds: a `succeeded` intent whose refunds add up to `amount_received`
        is its outcome — the latest refund, returned with `recovered: "already_refunded"`. A `canceled`
        intent is refused the same way (cancelling releases the uncaptured amount as a refund) but was
        never captured: a `TerminalError` naming the state.
        """
        params: dict[str, Any] = {"payment_intent": payment_intent}
        if amount is not None:
            params["amount"] = amount
        if reason is not None:
            params["reason"] = reason
        refunds = self._client.v1.refunds
        intents = self._client.v1.payment_intents
        pace = self._pace(ctx)

        async def refund(key: str) -> dict[str, Any]:
            try:
                return await call_stripe(
                    lambda: refunds.create_async(params, _options(key)),  # type: ignore[arg-type]
                    pace=pace,
                )
            except TerminalError as refused:
                if refused.code != "charge_already_refunded":
                    raise
                intent = await call_stripe(
                    lambda: intents.retrieve_async(payment_intent, None, _READ), pace=pace
                )
                listed = await call_stripe(
                    lambda: refunds.list_async({"payment_intent": payment_intent, "limit": 100}, _READ),
                    pace=pace,
                )
                return _refunded_already(intent, listed.get("data") or [], refused)

        return await ctx.step(step, refund)

    async def transfer(
        self,
        ctx: EffectContext,
        *,
        amount: int,
        currency: str,
        destination: str,
        transfer_group: str | None = None,
        metadata: Mapping[str, str] | None = None,
        step: str = "transfer",
    ) -> dict[str, Any]:
        """Move `amount` minor units of `currency` to the connected account `destination`."""
        params: dict[str, Any] = {"amount": amount, "currency": currency, "destination": destination}
        if transfer_group is not None:
            params["transfer_group"] = transfer_group
        if metadata:
            params["metadata"] = dict(metadata)
        service = self._client.v1.transfers
        pace = self._pace(ctx)
        return await ctx.step(
            step,
            lambda key: call_stripe(
                lambda: service.create_async(params, _options(key)),  # type: ignore[arg-type]
                pace=pace,
            ),
        )


async def call_stripe(
    call: Callable[[], Awaitable[stripe.StripeObject]], *, pace: Pace | None = None
) -> dict[str, Any]:
    """Await one SDK call; return its object as a JSON-ready dict, or raise the handler outcome.

    For calls `StripeSteps` does not wrap: `ctx.step("payout", lambda key: call_stripe(lambda:
    client.v1.payouts.create_async(params, {"idempotency_key": key, "max_network_retries": 0}),
    pace=ctx.downstream("stripe").pace))`. With `pace`, the call waits for its turn or is not sent
    (`PaceExceeded`, a `TransientError`), and a `RateLimitError` holds the downstream's next calls back.
    """
    import stripe

    try:
        if pace is None:
            answer = await call()
        else:
            async with pace.turn():
                answer = await call()
    except stripe.StripeError as exc:
        if pace is not None and isinstance(exc, stripe.RateLimitError):
            pace.hold(_retry_after(exc))
        raise outcome_of(exc) from exc
    return answer.to_dict(for_json=True)


def outcome_of(exc: stripe.StripeError) -> HandlerError:
    """The handler outcome a Stripe SDK error stands for (the table in the module docstring)."""
    import stripe

    message = f"stripe {type(exc).__name__}: {exc.user_message or exc}"
    # Kept in the attempt's record: the Request-Id Stripe's support asks for, and why a card was declined.
    said: dict[str, Any] = {
        "http_status": exc.http_status,
        "request_id": exc.request_id or None,
        "decline_code": _error_attribute(exc, "decline_code"),
    }
    if isinstance(exc, stripe.RateLimitError | stripe.APIConnectionError):
        return TransientError(message, retry_after=_retry_after(exc), **said)
    if isinstance(exc, stripe.IdempotencyError):
        return UnrecoverableError(message, code=exc.code or "idempotency_error", **said)
    if isinstance(exc, stripe.APIError):
        status = exc.http_status
        if status is None or status == 409 or status >= 500:
            return TransientError(message, retry_after=_retry_after(exc), **said)
    return TerminalError(message, code=exc.code or _error_type(exc) or f"http_{exc.http_status}", **said)


def _options(key: str) -> dict[str, Any]:
    return {"idempotency_key": key, "max_network_retries": 0}


# Reads take no idempotency key; no SDK retries inside a step, as for every call here.
_READ: Any = {"max_network_retries": 0}


def _captured_already(
    intent: dict[str, Any], amount_to_capture: int | None, refused: TerminalError
) -> dict[str, Any]:
    """The intent as the capture's outcome if it is captured for the amount the step captures; else the
    `TerminalError` naming the state it is in."""
    status, received = intent.get("status"), intent.get("amount_received")
    wanted = amount_to_capture if amount_to_capture is not None else intent.get("amount")
    where = f"stripe: payment intent {intent.get('id')}"
    if status == "succeeded" and received == wanted:
        return recovered(intent, ALREADY_CAPTURED)
    if status == "succeeded":
        message = f"{where} was captured elsewhere for {received}, not the {wanted} this step captures"
    else:
        message = f"{where} is {status}, not captured: it cannot be captured"
    raise TerminalError(message, code=refused.code) from refused


def _refunded_already(
    intent: dict[str, Any], refunds: list[dict[str, Any]], refused: TerminalError
) -> dict[str, Any]:
    """The latest refund as the refund's outcome if the captured intent is refunded in full; else the
    `TerminalError` naming the state it is in."""
    status, received = intent.get("status"), intent.get("amount_received") or 0
    where = f"stripe: payment intent {intent.get('id')}"
    if status != "succeeded":
        message = f"{where} is {status}, never captured: its authorization was released, nothing refunded"
        raise TerminalError(message, code=refused.code) from refused
    # A failed or canceled refund returned its money to the balance: it does not count as refunded.
    counted = [r for r in refunds if r.get("status") in ("succeeded", "pending", "requires_action")]
    total = sum(int(r.get("amount") or 0) for r in counted)
    if not counted or total < received:
        message = f"{where} has {total} of {received} refunded, yet Stripe calls its charge refunded"
        raise TerminalError(message, code=refused.code) from refused
    latest = max(counted, key=lambda r: int(r.get("created") or 0))
    return recovered(latest, ALREADY_REFUNDED)


def _retry_after(exc: stripe.StripeError) -> float | None:
    for name, value in (exc.headers or {}).items():
        if name.lower() == "retry-after":
            return retry_after_seconds(value)
    return None


def _error_type(exc: stripe.StripeError) -> str | None:
    return _error_attribute(exc, "type")


def _error_attribute(exc: stripe.StripeError, name: str) -> str | None:
    error = exc.error
    value = getattr(error, name, None) if error is not None else None
    return value if isinstance(value, str) and value else None

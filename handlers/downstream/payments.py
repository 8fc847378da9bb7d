"""Client for a Stripe-compatible payments API: capture a payment intent, refund one.

Bodies are form-encoded and authentication is a bearer API key, as with Stripe. Every call carries the
caller's idempotency key and is classified by `handlers.downstream`, so a retry of the same step with the same
key is replayed by the provider instead of capturing or refunding twice.
"""

from __future__ import annotations

import re
from typing import Any

import httpx

from effectgate.handlers.downstream import DownstreamConfig, Pace, send_idempotent
from effectgate.handlers.observe import CallObserver

__all__ = ["PaymentsClient"]

# Stripe ids are letters, digits and underscores (`pi_3Mtw…`); a hyphen is allowed for other providers.
# Dots and slashes are refused so an id can never walk the request to another path.
_ID = re.compile(r"[A-Za-z0-9_-]{1,255}")


class PaymentsClient:
    """Mutating calls to a Stripe-compatible payments API over a shared `httpx.AsyncClient`.

    The client holds no state beyond its configuration and does no retries: each method sends exactly one
    request and either returns the provider's object or raises `TransientError`, `TerminalError` or
    `UnrecoverableError` (see `handlers.downstream`). Ids and amounts are checked before anything is sent,
    and a bad one raises `ValueError`.
    """

    def __init__(
        self,
        http: httpx.AsyncClient,
        config: DownstreamConfig,
        *,
        on_call: CallObserver | None = None,
        pace: Pace | None = None,
    ) -> None:
        self._http = http
        self._config = config
        self._on_call = on_call
        self._pace = pace

    async def capture_payment_intent(
        self,
        payment_intent_id: str,
        *,
        idempotency_key: str,
        amount_to_capture: int | None = None,
    ) -> dict[str, Any]:
        """Capture an authorised payment intent, in full or for `amount_to_capture` minor units.

        Returns the payment intent as the provider reports it after the capture (Stripe: `status` is
        `succeeded`). Capturing an intent that is already captured is refused by the provider as
        `payment_intent_unexpected_state`, which surfaces as a `TerminalError` with that code.
        """
        _check_id(payment_intent_id, "payment_intent_id")
        form: dict[str, str] = {}
        if amount_to_capture is not None:
            form["amount_to_capture"] = str(_check_amount(amount_to_capture, "amount_to_capture"))
        return await send_idempotent(
            self._http,
            self._config,
            f"/v1/payment_intents/{payment_intent_id}/capture",
            idempotency_key=idempotency_key,
            form=form,
            service="payments",
            on_call=self._on_call,
            pace=self._pace,
        )

    async def create_refund(
        self,
        *,
        payment_intent: str,
        idempotency_key: str,
        amount: int | None = None,
        reason: str | None = None,
    ) -> dict[str, Any]:
        """Refund a captured payment intent, in full or for `amount` minor units, and return the refund.

        `reason` is passed through as given (Stripe accepts `duplicate`, `fraudulent` and
        `requested_by_customer`); the provider, not this client, is the authority on what it accepts.
        """
        _check_id(payment_intent, "payment_intent")
        form = {"payment_intent": payment_intent}
        if amount is not None:
            form["amount"] = str(_check_amount(amount, "amount"))
        if reason is not None:
            if not isinstance(reason, str) or not reason:
                raise ValueError("reason must be a non-empty string when given")
            form["reason"] = reason
        return await send_idempotent(
            self._http,
            self._config,
            "/v1/refunds",
            idempotency_key=idempotency_key,
            form=form,
            service="payments",
            on_call=self._on_call,
            pace=self._pace,
        )


def _check_id(value: str, name: str) -> None:
    if not isinstance(value, str) or not _ID.fullmatch(value):
        raise ValueError(f"{name} must be 1-255 characters of letters, digits, '_' or '-', got {value!r}")


def _check_amount(value: int, name: str) -> int:
    # bool is an int subclass; `True` cents is a bug, not an amount.
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive integer of minor units, got {value!r}")
    return value

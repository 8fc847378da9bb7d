"""Adyen (Checkout API) captures over documented HTTP, as recorded steps with `Idempotency-Key`.

Adyen supports idempotency on POST requests through the `Idempotency-Key` header: a retry with the same key
is answered with the first request's result instead of acting again
(https://docs.adyen.com/development-resources/api-idempotency). A capture is answered 201 with
`status: "received"`; Adyen reports its outcome later in a `CAPTURE` webhook. So unlike the other providers'
steps this one cannot recognise a payment captured already (`already_done`): Adyen documents no synchronous
"already captured" answer and no API to read a payment's state; a capture that cannot happen fails in the
webhook (`CAPTURE_FAILED`, https://docs.adyen.com/online-payments/capture/failure-reasons), which is where an
effect must look. The client is a `[downstream.NAME]`:

    [downstream.adyen]
    base_url = "https://checkout-test.adyen.com/v71"
    auth_scheme = "X-API-Key"
    api_key_env = "ADYEN_API_KEY"
    # idempotency_header defaults to Idempotency-Key
"""

from __future__ import annotations

import re
from typing import Any

from effectgate.handlers.context import EffectContext
from effectgate.handlers.downstream import DownstreamClient

__all__ = ["IDEMPOTENCY_HEADER", "capture_payment"]

IDEMPOTENCY_HEADER = "Idempotency-Key"
_PSP = re.compile(r"[A-Za-z0-9]{1,64}")


async def capture_payment(
    ctx: EffectContext,
    adyen: DownstreamClient,
    psp_reference: str,
    *,
    merchant_account: str,
    value: int,
    currency: str,
    reference: str | None = None,
    step: str = "capture",
) -> dict[str, Any]:
    """Capture `value` minor units of an authorised payment once per (effect, `step`).

    Returns Adyen's answer (`pspReference` of the capture, `status: "received"`).
    """
    if adyen.config.idempotency_header != IDEMPOTENCY_HEADER:
        raise ValueError(
            f"[downstream.{adyen.name}] must send keys in {IDEMPOTENCY_HEADER!r} for Adyen, "
            f"not {adyen.config.idempotency_header!r}"
        )
    if not _PSP.fullmatch(psp_reference):
        raise ValueError(f"psp_reference must be Adyen's reference (letters, digits), got {psp_reference!r}")
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"value must be a positive integer of minor units, got {value!r}")
    body: dict[str, Any] = {
        "merchantAccount": merchant_account,
        "amount": {"value": value, "currency": currency},
    }
    if reference is not None:
        body["reference"] = reference
    path = f"/payments/{psp_reference}/captures"
    return await ctx.step(step, lambda key: adyen.request("POST", path, json=body, idempotency_key=key))

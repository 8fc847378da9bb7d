"""Providers' own SDKs as recorded steps: one module per provider, each importing its SDK on first use.

    stripe     capture, refund, transfer with the step's key as Stripe's `Idempotency-Key`
               (pip install 'effectgate[stripe]')
    shopify    fulfilmentCreate over the GraphQL Admin API; no idempotency key, so it looks first
    easypost   a shipping label (buy a shipment); no idempotency key, so it looks first
               (pip install 'effectgate[easypost]')
    paypal     capture an authorization or an order over documented HTTP, the key as `PayPal-Request-Id`
    adyen      capture a payment over documented HTTP (Checkout API), the key as `Idempotency-Key`

No provider module is imported by the rest of effectgate: a worker that never names one never imports its
SDK. At shutdown the worker calls `close_clients()` here, which closes the clients of the provider modules
this process imported and leaves the others unimported.
"""

from __future__ import annotations

import sys

__all__ = ["close_clients"]


async def close_clients() -> None:
    """Close the SDK clients the provider modules imported in this process built, once its handlers are done.

    Stripe's SDK clients pool connections (`providers.stripe.close_clients`). EasyPost's SDK offers no
    public way to close its `requests` session, which the process's exit closes; the others go over
    `ctx.downstream`, whose HTTP client the worker closes itself.
    """
    stripe = sys.modules.get(f"{__name__}.stripe")
    if stripe is not None:
        await stripe.close_clients()

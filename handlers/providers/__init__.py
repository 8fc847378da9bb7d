"""Providers' own SDKs as recorded steps: one module per provider, each importing its SDK on first use.

    stripe     capture, refund, transfer with the step's key as Stripe's `Idempotency-Key`
               (pip install 'effectgate[stripe]')
    shopify    fulfilmentCreate over the GraphQL Admin API; no idempotency key, so it looks first
    easypost   a shipping label (buy a shipment); no idempotency key, so it looks first
               (pip install 'effectgate[easypost]')
    paypal     capture an authorization or an order over documented HTTP, the key as `PayPal-Request-Id`
    adyen      capture a payment over documented HTTP (Checkout API), the key as `Idempotency-Key`

Nothing here is imported by the rest of effectgate: a worker that never names a provider module never
imports its SDK.
"""

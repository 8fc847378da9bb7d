"""Client for a generic REST shipping API: create a shipment and get its label and tracking number.

Bodies are JSON, authentication is a bearer API key. Every call carries the caller's idempotency key and is
classified by `handlers.downstream`, so a retried step is replayed by the provider instead of shipping twice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from effectgate.handlers.downstream import DownstreamConfig, Pace, send_idempotent
from effectgate.handlers.observe import CallObserver

__all__ = ["ShippingClient"]


class ShippingClient:
    """Mutating calls to a REST shipping API over a shared `httpx.AsyncClient`.

    Like `PaymentsClient`, it holds only its configuration, never retries, and raises `TransientError`,
    `TerminalError` or `UnrecoverableError` as `handlers.downstream` classifies the answer; malformed
    arguments raise `ValueError` before any request is sent.
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

    async def create_shipment(
        self,
        *,
        order_id: str,
        address: Mapping[str, Any],
        items: Sequence[Mapping[str, Any]],
        idempotency_key: str,
        service: str = "standard",
    ) -> dict[str, Any]:
        """Create one shipment for `order_id` and return it, including `id`, `tracking_number`, `label_url`.

        `address` and `items` are sent as given; they must be JSON-serialisable and, for the idempotency key
        to replay rather than be refused, the same on every retry of the step.
        """
        if not isinstance(order_id, str) or not order_id:
            raise ValueError("order_id must be a non-empty string")
        if not isinstance(address, Mapping):
            raise ValueError("address must be a mapping")
        # A str is a Sequence too; refusing it here saves a confusing provider error about characters.
        if isinstance(items, str | bytes) or not isinstance(items, Sequence) or not items:
            raise ValueError("items must be a non-empty sequence of mappings")
        if not all(isinstance(item, Mapping) for item in items):
            raise ValueError("items must be a non-empty sequence of mappings")
        if not isinstance(service, str) or not service:
            raise ValueError("service must be a non-empty string")
        body = {
            "order_id": order_id,
            "address": dict(address),
            "items": [dict(item) for item in items],
            "service": service,
        }
        return await send_idempotent(
            self._http,
            self._config,
            "/v1/shipments",
            idempotency_key=idempotency_key,
            json=body,
            service="shipping",
            on_call=self._on_call,
            pace=self._pace,
        )

"""Asking PayPal itself about a delivery: the out-of-band confirmation behind the ``confirm`` option.

PayPal's signature covers the body only through a CRC32, so a verified signature says the transmission
is PayPal's, not that the body is the one PayPal sent. Two documented calls close that gap:

- ``fetch_event``: ``GET /v1/notifications/webhooks-events/{event_id}`` returns the event as PayPal stored
  it; the delivery is confirmed when its ``id``, ``event_type``, ``resource_type`` and ``resource`` equal
  PayPal's. A forged body either names an event PayPal does not have (404) or differs from it. This is the
  check whose strength does not depend on anything PayPal leaves undocumented.
- ``verify_api``: ``POST /v1/notifications/verify-webhook-signature`` with the transmission headers, the
  webhook id and the event (spliced in byte for byte, as received); PayPal answers
  ``{"verification_status": "SUCCESS"|"FAILURE"}``. PayPal does not document whether it compares the event
  with the one it sent or only recomputes the same CRC-based signature.

Both authenticate with OAuth client credentials (``POST /v1/oauth2/token``); the token is cached until
shortly before it expires and fetched once for concurrent callers. Whatever goes wrong on the way
(connection, status, shape) is ``ConfirmationUnavailable`` with a fixed detail; the log gets the reason.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

from ._common import https_url_parts
from .base import ConfirmationFailed, ConfirmationUnavailable, SchemeConfigError

log = logging.getLogger("effectgate.gateway.paypal")

CONFIRM_MODES = ("off", "verify_api", "fetch_event")
DEFAULT_API_BASE = "https://api-m.paypal.com"
# The event fields a handler acts on; links and summaries are presentation and may be rendered anew.
COMPARED_FIELDS = ("id", "event_type", "resource_type", "resource")
# A token is refreshed this long before PayPal says it expires, so a call never carries a stale one.
_TOKEN_MARGIN = 60.0
# PayPal's answers here are a few KB; an event with a large resource stays far below this.
_MAX_ANSWER_BYTES = 1024 * 1024

UNAVAILABLE = "PayPal's API could not confirm the delivery now (the gateway log has the reason)"


@dataclass(frozen=True, slots=True)
class Transmission:
    """The signed headers of one delivery, as PayPal's verify API takes them."""

    transmission_id: str
    transmission_time: str
    transmission_sig: str
    cert_url: str
    auth_algo: str


class PayPalApi:
    """A client of PayPal's REST API for confirming deliveries; one per source, built at start-up.

    ``base_url`` is ``https://api-m.paypal.com`` (live) or ``https://api-m.sandbox.paypal.com``;
    ``ca_bundle`` a PEM file trusted for its TLS (default: certifi's). No request is made at construction.
    """

    def __init__(
        self,
        *,
        mode: str,
        base_url: str,
        client_id: str,
        client_secret: str,
        ca_bundle: str | None,
        timeout: float,
    ) -> None:
        if mode not in CONFIRM_MODES[1:]:
            raise SchemeConfigError(f"confirm: expected one of {', '.join(CONFIRM_MODES)}, got {mode!r}")
        self.mode = mode
        self._base = api_base(base_url)
        self._credentials = (client_id, client_secret)
        self._verify: ssl.SSLContext | bool = (
            True if ca_bundle is None else ssl.create_default_context(cafile=ca_bundle)
        )
        self._timeout = timeout
        self._token: tuple[str, float] | None = None
        self._token_fetch: asyncio.Future[str] | None = None

    async def confirm(
        self, event: Mapping[str, Any], body: bytes, transmission: Transmission, webhook_id: str
    ) -> None:
        """Raise ``ConfirmationFailed`` when PayPal disowns the delivery, ``ConfirmationUnavailable`` when
        it cannot be asked; return when PayPal confirms it."""
        if self.mode == "fetch_event":
            await self._compare_with_stored(event)
        else:
            await self._verify_signature(body, transmission, webhook_id)

    async def _compare_with_stored(self, event: Mapping[str, Any]) -> None:
        event_id = str(event.get("id"))
        status, answer = await self._call(
            "GET", f"/v1/notifications/webhooks-events/{quote(event_id, safe='')}"
        )
        if status == 404:
            raise ConfirmationFailed(f"PayPal has no webhook event {event_id[:64]!r}")
        stored = _object(status, answer, "webhooks-events")
        differing = [
            name for name in COMPARED_FIELDS if _canonical(stored.get(name)) != _canonical(event.get(name))
        ]
        if differing:
            raise ConfirmationFailed(
                f"the body differs from the event PayPal stored under its id, in: {', '.join(differing)}"
            )

    async def _verify_signature(self, body: bytes, transmission: Transmission, webhook_id: str) -> None:
        fields = {
            "auth_algo": transmission.auth_algo,
            "cert_url": transmission.cert_url,
            "transmission_id": transmission.transmission_id,
            "transmission_sig": transmission.transmission_sig,
            "transmission_time": transmission.transmission_time,
            "webhook_id": webhook_id,
        }
        # The event goes in as the bytes PayPal sent (verify already parsed them as a JSON object), not
        # re-serialised: PayPal's check covers a checksum of the event, which a re-encoding would change.
        content = json.dumps(fields).encode()[:-1] + b', "webhook_event": ' + body + b"}"
        status, answer = await self._call("POST", "/v1/notifications/verify-webhook-signature", content)
        verdict = _object(status, answer, "verify-webhook-signature").get("verification_status")
        if verdict == "SUCCESS":
            return
        if verdict == "FAILURE":
            raise ConfirmationFailed("PayPal's verify-webhook-signature answered FAILURE")
        log.warning("paypal.confirmation_unavailable", extra={"reason": f"verification_status {verdict!r}"})
        raise ConfirmationUnavailable(UNAVAILABLE)

    async def _call(self, method: str, path: str, content: bytes | None = None) -> tuple[int, bytes]:
        for attempt in (1, 2):
            token = await self._access_token()
            headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
            if content is not None:
                headers["Content-Type"] = "application/json"
            status, answer = await self._request(method, path, headers=headers, content=content)
            if status == 401 and attempt == 1:
                # Revoked or expired early: one new token, once.
                self._token = None
                continue
            return status, answer
        raise AssertionError("unreachable")  # pragma: no cover

    async def _access_token(self) -> str:
        cached = self._token
        if cached is not None and time.monotonic() < cached[1]:
            return cached[0]
        if self._token_fetch is None or self._token_fetch.done():
            self._token_fetch = asyncio.ensure_future(self._new_token())
            # Retrieved here too, so a failure whose every waiter went away is not reported as unseen.
            self._token_fetch.add_done_callback(lambda done: done.cancelled() or done.exception())
        # Shared and shielded: concurrent confirmations wait for one token request.
        return await asyncio.shield(self._token_fetch)

    async def _new_token(self) -> str:
        status, answer = await self._request(
            "POST",
            "/v1/oauth2/token",
            headers={"Accept": "application/json", "Content-Type": "application/x-www-form-urlencoded"},
            content=b"grant_type=client_credentials",
            auth=self._credentials,
        )
        token = _object(status, answer, "oauth2/token")
        access, lifetime = token.get("access_token"), token.get("expires_in")
        if not isinstance(access, str) or not access or not isinstance(lifetime, int | float):
            log.warning("paypal.confirmation_unavailable", extra={"reason": "oauth2/token: no access_token"})
            raise ConfirmationUnavailable(UNAVAILABLE)
        self._token = (access, time.monotonic() + max(0.0, float(lifetime) - _TOKEN_MARGIN))
        return access

    async def _request(
        self,
        method: str,
        path: str,
        *,
        headers: dict[str, str],
        content: bytes | None,
        auth: tuple[str, str] | None = None,
    ) -> tuple[int, bytes]:
        try:
            # One client per call: the event loop that runs the gateway is the only one that may own its
            # connections, and confirmations are per money-moving delivery, not per request.
            async with (
                httpx.AsyncClient(
                    base_url=self._base, verify=self._verify, timeout=self._timeout, follow_redirects=False
                ) as client,
                client.stream(method, path, headers=headers, content=content, auth=auth) as response,
            ):
                chunks: list[bytes] = []
                size = 0
                async for chunk in response.aiter_bytes():
                    size += len(chunk)
                    if size > _MAX_ANSWER_BYTES:
                        raise OSError(f"answer larger than {_MAX_ANSWER_BYTES} bytes")
                    chunks.append(chunk)
                return response.status_code, b"".join(chunks)
        except Exception as exc:
            log.warning(
                "paypal.confirmation_unavailable",
                extra={"reason": f"{method} {path}: {type(exc).__name__}: {str(exc)[:300]}"},
            )
            raise ConfirmationUnavailable(UNAVAILABLE) from None


def api_base(value: object) -> str:
    """PayPal's API base URL: https, a host, no path beyond ``/``, no query."""
    parts = https_url_parts(value)
    if parts is None or parts.path not in ("", "/"):
        raise SchemeConfigError(
            f"api_base: expected an https URL with no path, such as '{DEFAULT_API_BASE}', got {value!r}"
        )
    return str(value).rstrip("/")


def _object(status: int, answer: bytes, what: str) -> dict[str, Any]:
    if status == 200:
        try:
            document = json.loads(answer)
        except ValueError:
            document = None
        if isinstance(document, dict):
            return document
    # PayPal's error answers carry a name and a debug_id; they go to the log, not to the sender.
    log.warning(
        "paypal.confirmation_unavailable", extra={"reason": f"{what}: HTTP {status}: {answer[:300]!r}"}
    )
    raise ConfirmationUnavailable(UNAVAILABLE)


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)

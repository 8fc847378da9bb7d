"""What a downstream's answer says: its JSON object, or the handler outcome it stands for (`classify_response`,
the table in the package's docstring), and what is read from it on the way (the provider's error code and
request id, `Retry-After`)."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import httpx

from effectgate.handlers.errors import TerminalError, TransientError, UnrecoverableError

#: The answers retried with the same idempotency key, by every client here and by a declared forward unless
#: its effect names its own: the request may not have been acted on yet, or the API asks to be asked later.
#: 408 Request Timeout; 409, which Stripe (`idempotency_key_in_use`) and the IETF Idempotency-Key draft answer
#: while the first request with the key still runs (its outcome is replayed to a later retry: failing there
#: would record a refusal for an effect that is happening); 425 Too Early (RFC 8470 5.2: the server did not
#: process it, the client may retry); 429 Too Many Requests; and every 5xx. Statuses past 599 are not HTTP.
RETRY_STATUSES: frozenset[int] = frozenset({408, 409, 425, 429, *range(500, 600)})


def classify_response(response: httpx.Response) -> dict[str, Any]:
    """Turn a provider's answer into its JSON object, or raise the handler outcome it stands for.

    This is the single place the answer classes in the module docstring are decided, so the payment and
    shipping clients (and any future one) cannot drift apart on what is worth a retry.
    """
    status = response.status_code
    where = _describe_request(response)
    if 200 <= status < 300:
        try:
            body = response.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            # A 2xx means the provider may well have performed the effect, so failing the job would hide a
            # real charge or shipment. Re-sending the same key makes the provider replay its stored answer,
            # which is safe, and the attempt limit still bounds a provider that keeps answering garbage.
            raise TransientError(f"{where}: HTTP {status} with a body that is not a JSON object")
        return body
    code, message = _provider_error(response)
    detail = f"{where}: HTTP {status}" + (f": {message}" if message else "")
    # Kept in the attempt's record: what the provider's support asks for, and why a card was declined.
    said: dict[str, Any] = {
        "http_status": status,
        "request_id": provider_request_id(response),
        "decline_code": _error_field(response, "decline_code"),
    }
    if status in RETRY_STATUSES:
        # Before the idempotency_error check: Stripe's 409 idempotency_key_in_use has that type too.
        raise TransientError(detail, retry_after=_retry_after(response), **said)
    if 400 <= status < 500:
        if _error_field(response, "type") == "idempotency_error":
            # The key was already used with different parameters. Keys derive from (tenant, effect, step),
            # so this means a handler sends different data for the same step: retrying cannot fix it.
            raise UnrecoverableError(detail, code=code or "idempotency_error", **said)
        raise TerminalError(detail, code=code or f"http_{status}", **said)
    # 1xx/3xx: httpx follows no redirects, and a moved API is a configuration problem, not a blip; a status
    # past 599 is not HTTP (RFC 9110), as a declared forward has always treated it.
    raise TerminalError(detail, code=f"http_{status}", **said)


# Where providers put the id of one request, as their support asks for it: Stripe's Request-Id, PayPal's
# Paypal-Debug-Id (also the body's debug_id), EasyPost's X-Ep-Request-Uuid, Shopify's X-Request-Id.
_REQUEST_ID_HEADERS = ("request-id", "paypal-debug-id", "x-ep-request-uuid", "x-request-id", "pspreference")
_MAX_REQUEST_ID = 200


def provider_request_id(response: httpx.Response) -> str | None:
    """The provider's id for this request (a header, else PayPal's ``debug_id`` or Adyen's ``pspReference``
    in the body), or ``None``; cut to 200 characters."""
    for name in _REQUEST_ID_HEADERS:
        header: str | None = response.headers.get(name)
        if header:
            return header[:_MAX_REQUEST_ID]
    body = _error_body(response)
    for name in ("debug_id", "pspReference", "request_id"):
        value = body.get(name)
        if isinstance(value, str) and value:
            return value[:_MAX_REQUEST_ID]
    return None


def _describe_request(response: httpx.Response) -> str:
    try:
        request = response.request
    except RuntimeError:  # a Response built by hand (tests, adapters) has no request attached
        return "downstream request"
    return f"{request.method} {request.url.path}"


def _error_body(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _error_field(response: httpx.Response, name: str) -> str | None:
    error = _error_body(response).get("error")
    value = error.get(name) if isinstance(error, dict) else None
    return value if isinstance(value, str) and value else None


def _provider_error(response: httpx.Response) -> tuple[str | None, str | None]:
    """(code, message) from Stripe's `{"error": {...}}`, PayPal's `{"name", "details": [{"issue",
    "description"}]}` or a flat `{"error": "...", "message": "..."}`."""
    body = _error_body(response)
    error = body.get("error")
    details = body.get("details")
    detail = details[0] if isinstance(details, list) and details and isinstance(details[0], dict) else {}
    if isinstance(detail.get("issue"), str):
        # PayPal: the issue says what happened (AUTHORIZATION_ALREADY_CAPTURED), the name only its class
        # (UNPROCESSABLE_ENTITY), and a step must be able to tell one issue from another.
        code, message = detail["issue"], detail.get("description") or body.get("message")
    elif isinstance(error, dict):
        code = error.get("code") or error.get("type")
        message = error.get("message")
    else:
        code = error if isinstance(error, str) else body.get("code")
        message = body.get("message")
    return (
        code if isinstance(code, str) and code else None,
        message if isinstance(message, str) and message else None,
    )


def _retry_after(response: httpx.Response) -> float | None:
    return retry_after_seconds(response.headers.get("Retry-After"))


def retry_after_seconds(value: str | None) -> float | None:
    """Seconds to wait from a `Retry-After` value (delta-seconds or an HTTP date), or None if unusable.

    Shared with the SDK adapters in `handlers.providers`, whose errors carry the header but no response.
    """
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - datetime.now(UTC)).total_seconds()
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)

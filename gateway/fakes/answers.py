"""What the fake providers answer, in Stripe's shapes: a stored answer (``Answer``) and how it is delivered
(with ``Idempotent-Replayed``, or dropped), Stripe's error body, form and metadata parsing, a payment
intent, and the fingerprint that tells a key's same parameters from different ones.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

from starlette.requests import Request
from starlette.responses import Response

from .faults import DroppedResponse, FaultMode


@dataclass(frozen=True, slots=True)
class Answer:
    """An endpoint's answer as stored under its idempotency key: replayed byte for byte."""

    status: int
    body: bytes


class Invalid(Exception):
    """The request failed validation: answer it, but store nothing under its key (as Stripe does)."""

    def __init__(self, answer: Answer) -> None:
        super().__init__(answer.status)
        self.answer = answer


def deliver(answer: Answer, key: str | None, fault: FaultMode, *, replayed: bool) -> Response:
    """The response for a stored answer, cut short when the fault is ``drop_after_effect``."""
    headers = {}
    if key is not None:
        headers["Idempotency-Key"] = key
    if replayed:
        headers["Idempotent-Replayed"] = "true"
    response_class = DroppedResponse if fault == "drop_after_effect" else Response
    return response_class(
        answer.body, status_code=answer.status, headers=headers, media_type="application/json"
    )


def reply(status: int, payload: Mapping[str, Any]) -> Response:
    """A JSON response that stores nothing (faults, idempotency errors)."""
    return Response(json_answer(status, payload).body, status_code=status, media_type="application/json")


def json_answer(status: int, payload: Mapping[str, Any]) -> Answer:
    """``payload`` as compact JSON, ready to store."""
    return Answer(status, json.dumps(payload, separators=(",", ":")).encode())


def error_body(type_: str, code: str | None, message: str | None) -> dict[str, Any]:
    """Stripe's error shape: ``{"error": {"type", "code", "message"}}``."""
    error: dict[str, Any] = {"type": type_}
    if code is not None:
        error["code"] = code
    if message is not None:
        error["message"] = message
    return {"error": error}


def form_params(body: bytes) -> dict[str, str]:
    """A form-encoded body; a malformed one is ``Invalid`` (400, nothing stored)."""
    try:
        return dict(parse_qsl(body.decode("ascii"), keep_blank_values=True, errors="strict"))
    except ValueError as exc:  # UnicodeDecodeError is a ValueError
        message = f"The request body is not valid form encoding: {exc}"
        raise Invalid(
            json_answer(400, error_body("invalid_request_error", "parameter_invalid", message))
        ) from exc


def new_intent(intent_id: str, amount: int, currency: str, status: str) -> dict[str, Any]:
    """A payment intent in Stripe's shape (the fields a capture reads and changes)."""
    captured = status == "succeeded"
    return {
        "id": intent_id,
        "object": "payment_intent",
        "amount": amount,
        "amount_capturable": amount if status == "requires_capture" else 0,
        "amount_received": amount if captured else 0,
        "capture_method": "manual" if status == "requires_capture" else "automatic",
        "created": int(time.time()),
        "currency": currency,
        "latest_charge": f"ch_{secrets.token_hex(12)}" if captured else None,
        "livemode": False,
        "metadata": {},
        "status": status,
    }


def metadata_of(params: Mapping[str, str]) -> dict[str, str]:
    """Stripe's form encoding of a hash: `metadata[order]=42`."""
    return {
        k[len("metadata[") : -1]: v
        for k, v in params.items()
        if k.startswith("metadata[") and k.endswith("]")
    }


def amount_param(params: Mapping[str, str], name: str, *, default: int) -> int:
    """A positive integer parameter, or ``default`` when absent; anything else is ``Invalid``."""
    raw = params.get(name)
    if raw is None:
        return default
    if not raw.isdigit() or int(raw) <= 0:
        message = f"Invalid positive integer: {name}={raw!r}"
        raise Invalid(
            json_answer(400, error_body("invalid_request_error", "parameter_invalid_integer", message))
        )
    return int(raw)


def request_fingerprint(request: Request, body: bytes) -> str:
    """Hash of method, path, query and the body in canonical form, so equal parameters compare equal."""
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    canonical = body
    if media_type == "application/x-www-form-urlencoded":
        try:
            pairs = parse_qsl(body.decode("ascii"), keep_blank_values=True, errors="strict")
        except ValueError:
            pass
        else:
            # Sorted by name only: a stable sort keeps repeated names (Stripe's list params) in order.
            canonical = json.dumps(sorted(pairs, key=lambda pair: pair[0])).encode()
    elif media_type == "application/json" or media_type.endswith("+json"):
        try:
            canonical = json.dumps(json.loads(body), sort_keys=True, separators=(",", ":")).encode()
        except ValueError:
            pass
    digest = hashlib.sha256()
    for part in (request.method.encode(), request.url.path.encode(), request.url.query.encode(), canonical):
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()

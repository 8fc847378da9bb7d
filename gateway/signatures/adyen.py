"""Adyen: ``additionalData.hmacSignature`` inside each ``NotificationRequestItem`` of a JSON batch.

See https://docs.adyen.com/development-resources/webhooks/verify-hmac-signatures. Each item is signed
on its own: base64 HMAC-SHA256, keyed by the hex-encoded HMAC key from the Customer Area, over

    pspReference:originalReference:merchantAccountCode:merchantReference:value:currency:eventCode:success

with a missing field as the empty string and ``value``/``currency`` taken from ``amount``. Because the
signature covers fields rather than bytes, this is the one scheme that must parse the body before it can
authenticate it; an unparseable body is therefore a signature error, not a payload error. For the same
reason a proxy re-encoding the JSON cannot break it, so no re-encoding hint is given.
"""

from __future__ import annotations

import binascii
import json
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from ._common import (
    Headers,
    SchemeBase,
    SigningRequest,
    b64_hmac,
    decode_digest,
    decode_json,
    require_text,
    secret_strings,
)
from ._matching import hmac_index
from .base import (
    Covers,
    Event,
    SchemeConfigError,
    SignatureError,
    SignatureInvalid,
    SignatureMalformed,
    SignatureMissing,
    SigningError,
    Verified,
)

ACKNOWLEDGEMENT = b"[accepted]"
"""What Adyen expects in the body of a 2xx answer to count a notification as delivered."""

_SIGNED_FIELDS = (
    "pspReference",
    "originalReference",
    "merchantAccountCode",
    "merchantReference",
    "value",
    "currency",
    "eventCode",
    "success",
)
# Adyen batches at most a few dozen items; a cap keeps one request from costing thousands of HMACs.
_MAX_ITEMS = 1000


class AdyenScheme(SchemeBase):
    """Verifies Adyen standard notifications (JSON). Each configured secret is an HMAC key as Adyen
    shows it: hex, 32 bytes or more. Every ``NotificationRequestItem`` in the batch must carry a valid
    ``additionalData.hmacSignature``; one bad item fails the whole delivery, since Adyen retries the
    batch as a whole. Each item becomes one event with id ``"<pspReference>:<eventCode>"`` and type
    ``eventCode``, its payload the item itself; the gateway answers ``[accepted]``. Adyen signs no
    timestamp, so replays are only caught by the ledger's duplicate check."""

    name: ClassVar[str] = "adyen"
    covers = Covers(body=False, timestamp=False, id=True, type=True)

    def __init__(self, secrets: Sequence[str]) -> None:
        self._keys = tuple(_hex_key(secret, index) for index, secret in enumerate(secret_strings(secrets)))

    def _verify(self, body: bytes, headers: Headers, now: float) -> Verified:
        items = _items(body)
        events: list[Event] = []
        indices: list[int] = []
        for position, item in enumerate(items, start=1):
            where = f"item {position} of {len(items)}"
            presented = _signature(item, where)
            message = ":".join(_field(item, name, where) for name in _SIGNED_FIELDS).encode("utf-8")
            index = hmac_index(self._keys, "sha256", [presented], [message])
            if index is None:
                raise SignatureInvalid(
                    f"{where}: hmacSignature matches none of the {len(self._keys)} configured HMAC key(s)"
                    " (a key from another merchant account or environment?)"
                )
            indices.append(index)
            psp = require_text(item.get("pspReference"), f"{where}: pspReference")
            code = require_text(item.get("eventCode"), f"{where}: eventCode")
            events.append(Event(id=f"{psp}:{code}", type=code, payload=item))
        # _items never returns an empty batch; Adyen signs a batch with one key, so the first speaks for all.
        return Verified(events=tuple(events), secret_index=indices[0], acknowledgement=ACKNOWLEDGEMENT)

    def _sign(self, request: SigningRequest) -> tuple[bytes, Headers]:
        # Adyen signs inside the body: each item gets its own hmacSignature, so the body is rewritten.
        try:
            document = json.loads(request.body.decode("utf-8"), parse_constant=_refuse_constant)
        except (ValueError, RecursionError):
            raise SigningError(
                "body: not JSON; an Adyen notification is an object with notificationItems"
            ) from None
        try:
            items = _document_items(document)
            for position, item in enumerate(items, start=1):
                where = f"item {position} of {len(items)}"
                additional = item.setdefault("additionalData", {})
                if not isinstance(additional, dict):
                    raise SigningError(f"body: {where}: additionalData is not an object")
                additional["hmacSignature"] = _item_signature(item, self._keys[0], where)
        except SignatureError as exc:
            raise SigningError(f"body: {exc.detail}") from None
        return json.dumps(document).encode("utf-8"), {}


def item_signature(item: Mapping[str, Any], hmac_key: str | bytes) -> str:
    """The ``additionalData.hmacSignature`` Adyen puts in a ``NotificationRequestItem``, for the HMAC
    key as the Customer Area shows it (hex) or as raw bytes; as Adyen's ``generate_notification_sig``."""
    try:
        key = binascii.a2b_hex(hmac_key) if isinstance(hmac_key, str) else hmac_key
    except (binascii.Error, ValueError):
        raise SigningError("hmac_key: an Adyen HMAC key is hex") from None
    try:
        return _item_signature(item, key, "item")
    except SignatureError as exc:
        raise SigningError(str(exc)) from None


def _item_signature(item: Mapping[str, Any], key: bytes, where: str) -> str:
    message = ":".join(_field(item, name, where) for name in _SIGNED_FIELDS).encode("utf-8")
    return b64_hmac(key, message)


def _hex_key(secret: str, index: int) -> bytes:
    try:
        key = binascii.a2b_hex(secret)
    except (binascii.Error, ValueError):
        raise SchemeConfigError(f"secrets[{index}]: an Adyen HMAC key is hex") from None
    if len(key) < 32:
        raise SchemeConfigError(f"secrets[{index}]: an Adyen HMAC key has at least 64 hex digits")
    return key


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _items(body: bytes) -> list[dict[str, Any]]:
    try:
        document = decode_json(body.decode("utf-8"))
    except (ValueError, RecursionError):
        raise SignatureMalformed("body is not JSON, so it carries no Adyen notification to verify") from None
    return _document_items(document)


def _document_items(document: Any) -> list[dict[str, Any]]:
    raw_items = document.get("notificationItems") if isinstance(document, dict) else None
    if not isinstance(raw_items, list) or not raw_items:
        # Nothing to authenticate must not pass as authenticated: it would be acknowledged unsigned.
        raise SignatureMissing("body has no notificationItems, so there is no hmacSignature to verify")
    if len(raw_items) > _MAX_ITEMS:
        raise SignatureMalformed(f"more than {_MAX_ITEMS} notificationItems in one delivery")
    items = []
    for position, wrapper in enumerate(raw_items, start=1):
        item = wrapper.get("NotificationRequestItem") if isinstance(wrapper, dict) else None
        if not isinstance(item, dict):
            raise SignatureMalformed(f"item {position} of {len(raw_items)} is not a NotificationRequestItem")
        items.append(item)
    return items


def _signature(item: dict[str, Any], where: str) -> bytes:
    additional = item.get("additionalData")
    value = additional.get("hmacSignature") if isinstance(additional, dict) else None
    if value is None or value == "":
        raise SignatureMissing(f"{where}: additionalData.hmacSignature is missing")
    digest = decode_digest(value, "base64", 32) if isinstance(value, str) else None
    if digest is None:
        raise SignatureMalformed(f"{where}: hmacSignature is not a base64 HMAC-SHA256")
    return digest


def _field(item: Mapping[str, Any], name: str, where: str) -> str:
    if name in ("value", "currency"):
        amount = item.get("amount")
        if amount is None:
            value: Any = None
        elif isinstance(amount, dict):
            value = amount.get(name)
        else:
            raise SignatureMalformed(f"{where}: amount is not an object")
    else:
        value = item.get(name)
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    # Adyen sends strings and an integer value; a signer's rendering of anything else is a guess.
    raise SignatureMalformed(f"{where}: {name} is neither a string nor an integer")

"""Standard Webhooks (and Svix): ``webhook-id``, ``webhook-timestamp``, ``webhook-signature``.

See https://github.com/standard-webhooks/standard-webhooks/blob/main/spec/standard-webhooks.md. The
signed content is ``"<id>.<timestamp>." + body``; the signature header is a space-separated list of
``v1,<base64 HMAC-SHA256>`` and ``v1a,<base64 Ed25519>`` entries.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from typing import ClassVar

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from ._common import (
    Headers,
    SchemeBase,
    SigningRequest,
    b64_hmac,
    check_timestamp,
    decode_digest,
    describe_labels,
    json_field,
    parse_json,
    parse_timestamp,
    require_header,
    require_text,
    resolve_tolerance,
    secret_strings,
)
from ._matching import hmac_matcher, require_match
from .base import (
    Covers,
    Event,
    SchemeConfigError,
    SignatureMalformed,
    SigningError,
    UnsupportedSignatureVersion,
    Verified,
)

_SYMMETRIC_PREFIX = "whsec_"
_PUBLIC_KEY_PREFIX = "whpk_"
_SIGNING_KEY_PREFIX = "whsk_"
_ID = ("webhook-id", "svix-id")
_TIMESTAMP = ("webhook-timestamp", "svix-timestamp")
_SIGNATURE = ("webhook-signature", "svix-signature")


class StandardWebhooksScheme(SchemeBase):
    """Verifies Standard Webhooks and Svix deliveries. Each configured secret is either ``whsec_<base64>``
    (HMAC-SHA256; without the prefix it is read as base64 too, like the reference library) or
    ``whpk_<base64>``, the provider's raw 32-byte Ed25519 public key; the two kinds may be mixed during
    a migration. The timestamp must be within ``tolerance`` seconds (default 300); the event id is
    ``webhook-id`` and the type the body's ``type``."""

    name: ClassVar[str] = "standard-webhooks"
    covers = Covers(body=True, timestamp=True, id=True, type=True)

    def __init__(self, secrets: Sequence[str], *, tolerance: int | None = None) -> None:
        self._hmac_keys: list[bytes | None] = []
        self._public_keys: list[Ed25519PublicKey | None] = []
        for index, secret in enumerate(secret_strings(secrets)):
            option = f"secrets[{index}]"
            if secret.startswith(_PUBLIC_KEY_PREFIX):
                raw = _b64_secret(secret.removeprefix(_PUBLIC_KEY_PREFIX), option)
                if len(raw) != 32:
                    raise SchemeConfigError(f"{option}: whpk_ key must be 32 bytes, got {len(raw)}")
                self._hmac_keys.append(None)
                self._public_keys.append(Ed25519PublicKey.from_public_bytes(raw))
            elif secret.startswith(_SIGNING_KEY_PREFIX):
                # Verifying needs only the public half; a private key in gateway config is a leak waiting.
                raise SchemeConfigError(f"{option}: whsk_ is a private signing key; configure its whpk_ key")
            else:
                self._hmac_keys.append(_b64_secret(secret.removeprefix(_SYMMETRIC_PREFIX), option))
                self._public_keys.append(None)
        self._tolerance = resolve_tolerance(tolerance)

    def _verify(self, body: bytes, headers: Headers, now: float) -> Verified:
        msg_id = require_header(headers, *_ID)
        raw_timestamp = require_header(headers, *_TIMESTAMP)
        signatures = require_header(headers, *_SIGNATURE)
        timestamp = parse_timestamp(raw_timestamp, "webhook-timestamp")
        symmetric, asymmetric = _parse_signatures(signatures)
        try:
            prefix = f"{msg_id}.{raw_timestamp}.".encode()
        except UnicodeEncodeError:
            # Starlette decodes headers as latin-1, but a hand-built mapping may carry lone surrogates.
            raise SignatureMalformed("webhook-id is not encodable text") from None
        by_hmac = hmac_matcher(self._hmac_keys, "sha256", symmetric, lambda b: prefix + b)

        def match(candidate: bytes) -> int | None:
            index = by_hmac(candidate)
            if index is not None or not asymmetric:
                return index
            message = prefix + candidate
            for key_index, key in enumerate(self._public_keys):
                if key is None:
                    continue
                for signature in asymmetric:
                    try:
                        key.verify(signature, message)
                    except InvalidSignature:
                        continue
                    return key_index
            return None

        presented = len(symmetric) + len(asymmetric)
        index = require_match(body, match, secrets=len(self._hmac_keys), signatures=presented)
        check_timestamp(timestamp, now, self._tolerance)
        document = parse_json(body)
        event = Event(
            id=msg_id, type=require_text(json_field(document, "type"), "body field 'type'"), payload=document
        )
        return Verified(events=(event,), secret_index=index)

    def _takes_signing_key(self) -> bool:
        return self._public_keys[0] is not None

    def _sign(self, request: SigningRequest) -> tuple[bytes, Headers]:
        msg_id = request.id_or_fresh("msg_")
        hmac_key, public_key = self._hmac_keys[0], self._public_keys[0]
        if hmac_key is not None:
            signature = hmac_signature(request.body, hmac_key, msg_id=msg_id, timestamp=request.timestamp)
        else:
            # Only the public half is configured: the sender's private key must be given, and match it.
            assert public_key is not None  # each configured secret is exactly one of the two kinds
            if request.signing_key is None:
                raise SigningError(
                    "signing_key: required, the first secret is a whpk_ public key; give the matching whsk_ key"
                )
            private = signing_key(request.signing_key)
            if _raw(private.public_key()) != _raw(public_key):
                raise SigningError("signing_key: is not the private half of the first configured whpk_ key")
            signature = ed25519_signature(request.body, private, msg_id=msg_id, timestamp=request.timestamp)
        return request.body, {
            "webhook-id": msg_id,
            "webhook-timestamp": str(request.timestamp),
            "webhook-signature": signature,
        }


def hmac_signature(body: bytes, secret: str | bytes, *, msg_id: str, timestamp: int) -> str:
    """The ``v1,<base64>`` entry of ``webhook-signature`` for ``body``. ``secret`` is the ``whsec_…``
    text (the prefix optional, the rest base64) or the raw key bytes."""
    key = secret if isinstance(secret, bytes) else _signing_secret(secret)
    return "v1," + b64_hmac(key, _signed_content(body, msg_id, timestamp))


def ed25519_signature(body: bytes, private_key: Ed25519PrivateKey, *, msg_id: str, timestamp: int) -> str:
    """The ``v1a,<base64>`` entry of ``webhook-signature``: Ed25519 over the same content as ``v1``."""
    signature = private_key.sign(_signed_content(body, msg_id, timestamp))
    return "v1a," + base64.b64encode(signature).decode("ascii")


def signing_key(text: str) -> Ed25519PrivateKey:
    """The Ed25519 private key in a ``whsk_<base64>`` text: the 32-byte seed, or the 64-byte seed and
    public key (libsodium's form). ``SigningError`` naming ``signing_key`` when it is not one; the
    message never quotes the key."""
    if not text.startswith(_SIGNING_KEY_PREFIX):
        raise SigningError("signing_key: expected whsk_<base64 Ed25519 private key>")
    value = text.removeprefix(_SIGNING_KEY_PREFIX)
    try:
        raw = base64.b64decode(value + "=" * (-len(value) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise SigningError("signing_key: not valid base64") from None
    if len(raw) not in (32, 64):
        raise SigningError(f"signing_key: an Ed25519 private key is 32 or 64 bytes, got {len(raw)}")
    private = Ed25519PrivateKey.from_private_bytes(raw[:32])
    if len(raw) == 64 and raw[32:] != _raw(private.public_key()):
        raise SigningError("signing_key: its last 32 bytes are not the public key of its first 32")
    return private


def new_ed25519_keys() -> tuple[str, str]:
    """A fresh ``(whsk_…, whpk_…)`` pair: the sender's private key and the public key a source configures."""
    private = Ed25519PrivateKey.generate()
    seed = private.private_bytes_raw()
    return (
        _SIGNING_KEY_PREFIX + base64.b64encode(seed).decode("ascii"),
        _PUBLIC_KEY_PREFIX + base64.b64encode(_raw(private.public_key())).decode("ascii"),
    )


def _signed_content(body: bytes, msg_id: str, timestamp: int) -> bytes:
    return f"{msg_id}.{timestamp}.".encode() + body


def _raw(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(Encoding.Raw, PublicFormat.Raw)


def _signing_secret(secret: str) -> bytes:
    try:
        return _b64_secret(secret.removeprefix(_SYMMETRIC_PREFIX), "secret")
    except SchemeConfigError as exc:
        raise SigningError(str(exc)) from None


def _b64_secret(value: str, option: str) -> bytes:
    # Like the reference library, accept the key with or without its base64 padding.
    try:
        raw = base64.b64decode(value + "=" * (-len(value) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise SchemeConfigError(f"{option}: not valid base64") from None
    if not raw:
        raise SchemeConfigError(f"{option}: decodes to an empty key")
    return raw


def _parse_signatures(value: str) -> tuple[list[bytes], list[bytes]]:
    symmetric: list[str] = []
    asymmetric: list[str] = []
    versions = 0
    others: list[str] = []
    for entry in value.split():
        version, sep, signature = entry.partition(",")
        if not sep:
            raise SignatureMalformed("webhook-signature: expected space-separated <version>,<base64> entries")
        versions += 1
        if version == "v1":
            symmetric.append(signature)
        elif version == "v1a":
            asymmetric.append(signature)
        else:
            others.append(version)
    if not versions:
        raise SignatureMalformed("webhook-signature: no signature present")
    if not symmetric and not asymmetric:
        raise UnsupportedSignatureVersion(
            f"webhook-signature: no v1 or v1a signature, only {describe_labels(others)}"
        )
    decoded_symmetric = [d for s in symmetric if (d := decode_digest(s, "base64", 32)) is not None]
    decoded_asymmetric = [d for s in asymmetric if (d := decode_digest(s, "base64", 64)) is not None]
    if not decoded_symmetric and not decoded_asymmetric:
        raise SignatureMalformed("webhook-signature: no well-formed v1 or v1a signature found")
    return decoded_symmetric, decoded_asymmetric

"""PayPal: RSA-SHA256 over ``"<transmission id>|<time>|<webhook id>|<crc32 of the body>"``.

See https://developer.paypal.com/api/rest/webhooks/rest/#link-verifysignature. The signature
(``PAYPAL-TRANSMISSION-SIG``, base64) is made with the private key of a certificate PayPal publishes at
``PAYPAL-CERT-URL``; ``paypal_certs`` decides which URLs may be fetched and which certificates trusted.

**The signature does not bind the body cryptographically.** It covers the body only through its CRC32,
and anyone can give any body the CRC of a captured one by choosing a few bytes in a string field. So a
captured delivery, within its time window, could carry a forged body under the captured signature. What
stops that, in layers:

1. The transmission time is signed and held to ``tolerance`` (300 s by default, like every other scheme),
   so a captured signature is only usable for minutes.
2. The transmission id is signed too, and ``confirm`` remembers in the ledger (shared by every replica)
   which body — by SHA-256 — each id came with, for as long as its time can pass the window. The same id
   with another body is refused (``transmission_reused``); with the same body it is a normal delivery,
   which the ledger then answers as a duplicate.
3. By default (``confirm = "fetch_event"``, or ``"verify_api"``), ``confirm`` asks PayPal's API about
   the event before anything is claimed (``paypal_api``). This also covers a forged body that arrives
   before the genuine one, which layers 1 and 2 cannot; ``confirm = "off"`` gives it up and must be
   chosen explicitly.

Why a ``prepare`` step. Verifying needs the certificate, and fetching it is network I/O; ``verify`` is
synchronous and runs on the event loop. The gateway awaits ``prepare`` first: it checks the headers that
cost nothing to check (present, well-formed, in time, an allowed URL), then fetches and validates the
certificate once per URL (``fetcher`` is injectable, so tests serve certificates from memory or
loopback), charging each fetch it starts to the request's client and to all clients (``_fetch_budget``:
the sender is not authenticated yet). ``verify`` stays pure and cheap, reading only the cache. ``confirm`` runs only after a valid
signature, so an unauthenticated sender cannot make the gateway touch the ledger or PayPal's API.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import math
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import ClassVar

import certifi
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding

from ._common import (
    Headers,
    SchemeBase,
    SigningRequest,
    check_timestamp,
    describe_labels,
    event_from_json,
    lower_headers,
    option_str,
    require_header,
    resolve_tolerance,
    secret_strings,
)
from ._matching import require_match
from .base import (
    CertificateUntrusted,
    Covers,
    ReplayMemory,
    SchemeConfigError,
    SignatureError,
    SignatureMalformed,
    SigningError,
    TransmissionReused,
    UnsupportedSignatureVersion,
    Verified,
)
from .paypal_api import CONFIRM_MODES, DEFAULT_API_BASE, PayPalApi, Transmission
from .paypal_certs import (
    DEFAULT_CERT_URL_BASES,
    DEFAULT_FETCH_TIMEOUT,
    FAILURE_TTL,
    MAX_INFLIGHT_FETCHES,
    CertificateStore,
    Fetcher,
    https_fetcher,
    read_pem_bundle,
)

__all__ = [
    "DEFAULT_CERT_URL_BASES",
    "FAILURE_TTL",
    "MAX_INFLIGHT_FETCHES",
    "Fetcher",
    "PayPalScheme",
    "https_fetcher",
]

_ALGORITHM = "SHA256withRSA"
_ID = "PAYPAL-TRANSMISSION-ID"
_TIME = "PAYPAL-TRANSMISSION-TIME"
_SIGNATURE = "PAYPAL-TRANSMISSION-SIG"
_CERT_URL = "PAYPAL-CERT-URL"
_AUTH_ALGO = "PAYPAL-AUTH-ALGO"
# RSA signatures are as long as the modulus: 2048 to 8192 bits.
_SIGNATURE_SIZES = range(256, 1025)
_MAX_TIME_CHARS = 40


class PayPalScheme(SchemeBase):
    """Verifies PayPal webhooks. The configured secrets are the webhook IDs PayPal assigned to this
    endpoint (several while moving to a new webhook; they are not secret in the cryptographic sense,
    but they bind a signature to this endpoint and live beside real secrets in the environment).

    Options: ``tolerance``, the largest accepted age (or lead) of ``PAYPAL-TRANSMISSION-TIME`` in seconds
    (default 300); ``cert_url_bases``, the URL prefixes ``PAYPAL-CERT-URL`` may name, each followed by one
    plain path segment (default: PayPal's documented ``https://api.paypal.com/v1/notifications/certs/``,
    its sandbox twin and the same paths on the ``api-m`` hosts); ``ca_bundle``, a PEM file of the
    authorities the certificate must chain to (default: certifi's public roots); ``cert_name``, the DNS
    name or common name the certificate must carry (default ``messageverificationcerts.paypal.com``);
    ``fetch_ca_bundle``, the PEM file trusted for HTTPS to PayPal (certificate fetches and API calls;
    default: certifi's); ``fetch_timeout`` in seconds (default 5, for API calls too); ``cert_cache_size``
    (default 16 URLs); ``confirm``, ``"fetch_event"`` (default), ``"verify_api"`` or ``"off"``, with
    ``api_base`` (default ``https://api-m.paypal.com``), ``client_id`` and ``client_secret`` (the
    configuration file names environment variables for the last two); without the credentials
    ``confirm = "off"`` must be said explicitly. ``fetcher`` replaces the HTTPS
    client for certificates and ``clock`` the wall clock (``time.time``) where no ``now`` is given (tests;
    neither can be set from a file). The event id is the body's ``id`` and the type its ``event_type``."""

    name: ClassVar[str] = "paypal"
    covers = Covers(body=False, timestamp=True, id=True, type=True)

    def __init__(
        self,
        secrets: Sequence[str],
        *,
        tolerance: int | None = None,
        cert_url_bases: Sequence[str] | None = None,
        ca_bundle: str | None = None,
        cert_name: str | None = None,
        fetch_ca_bundle: str | None = None,
        fetch_timeout: float | None = None,
        cert_cache_size: int | None = None,
        confirm: str | None = None,
        api_base: str | None = None,
        client_id: str | None = None,
        client_secret: str | None = None,
        fetcher: Fetcher | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._webhook_ids = secret_strings(secrets)
        self._tolerance = resolve_tolerance(tolerance)
        timeout = _positive_number("fetch_timeout", fetch_timeout, DEFAULT_FETCH_TIMEOUT)
        if fetcher is not None and not callable(fetcher):
            raise SchemeConfigError("fetcher: expected an async callable (it cannot be set from a file)")
        if clock is not None and not callable(clock):
            raise SchemeConfigError("clock: expected a callable (it cannot be set from a file)")
        self._clock = clock or time.time
        if fetch_ca_bundle is not None:
            read_pem_bundle("fetch_ca_bundle", fetch_ca_bundle)
        self._certs = CertificateStore(
            bases=cert_url_bases,
            ca_bundle=ca_bundle or certifi.where(),
            cert_name=cert_name,
            timeout=timeout,
            cache_size=cert_cache_size,
            fetcher=fetcher or https_fetcher(ca_bundle=fetch_ca_bundle, timeout=timeout),
        )
        self._api = _api(confirm, api_base, client_id, client_secret, fetch_ca_bundle, timeout)

    async def prepare(
        self, body: bytes, headers: Mapping[str, str], *, now: float | None = None, client: str | None = None
    ) -> None:
        """Fetch, validate and cache the certificate ``PAYPAL-CERT-URL`` names, unless it is cached.

        Only for a request whose cheap headers pass (all present, a supported algorithm, a signature of
        an RSA size, a transmission time in the window, an allowed URL): anything else costs no fetch.
        A fetch it starts is charged to ``client`` and to all clients; past either budget, none is started.
        Never raises for a bad request; ``verify`` reports what is wrong, a failed or refused fetch included.
        """
        clock = self._clock() if now is None else now
        if not math.isfinite(clock):
            return
        lowered = lower_headers(headers)
        try:
            url = self._check_headers(lowered, clock)
        except SignatureError:
            return
        await self._certs.load(url, clock, client)

    def verify(self, body: bytes, headers: Mapping[str, str], *, now: float | None = None) -> Verified:
        """Authenticate one delivery and extract its events; see ``Scheme.verify``."""
        return super().verify(body, headers, now=self._clock() if now is None else now)

    def _sign(self, request: SigningRequest) -> tuple[bytes, Headers]:
        raise SigningError(
            "PayPal cannot be signed locally: PayPal signs each delivery with the private key of its own "
            "certificate, which only PayPal holds. Send a test event from PayPal's developer dashboard "
            "(Webhooks simulator) to the gateway's public URL instead."
        )

    def _check_headers(self, headers: Headers, now: float) -> str:
        """Everything checkable without the certificate, cheapest first; the certificate's URL."""
        require_header(headers, _ID)
        transmission_time = require_header(headers, _TIME)
        _decode_signature(require_header(headers, _SIGNATURE))
        url = require_header(headers, _CERT_URL)
        algorithm = require_header(headers, _AUTH_ALGO)
        if algorithm != _ALGORITHM:
            raise UnsupportedSignatureVersion(
                f"{_AUTH_ALGO}: {describe_labels([algorithm])}; only {_ALGORITHM!r} is supported"
            )
        check_timestamp(_parse_time(transmission_time), now, self._tolerance)
        self._certs.check_url(url)
        return url

    def _verify(self, body: bytes, headers: Headers, now: float) -> Verified:
        if not math.isfinite(now):
            # A NaN clock compares false with every validity bound: fail closed.
            raise CertificateUntrusted("server clock reading is not a finite number")
        url = self._check_headers(headers, now)
        transmission_id = headers[_ID.lower()]
        transmission_time = headers[_TIME.lower()]
        signature = _decode_signature(headers[_SIGNATURE.lower()])
        key = self._certs.key(url, now)
        try:
            prefix = f"{transmission_id}|{transmission_time}|".encode()
        except UnicodeEncodeError:
            raise SignatureMalformed(f"{_ID} or {_TIME} is not encodable text") from None
        messages = [prefix + webhook_id.encode() + b"|" for webhook_id in self._webhook_ids]

        def match(candidate: bytes) -> int | None:
            crc = str(zlib.crc32(candidate)).encode("ascii")
            for index, message in enumerate(messages):
                try:
                    key.verify(signature, message + crc, padding.PKCS1v15(), hashes.SHA256())
                except InvalidSignature:
                    continue
                return index
            return None

        index = require_match(body, match, secrets=len(messages), signatures=1)
        return Verified(events=(event_from_json(body, type_path="event_type"),), secret_index=index)

    async def confirm(
        self,
        verified: Verified,
        body: bytes,
        headers: Mapping[str, str],
        *,
        source: str,
        memory: ReplayMemory,
        now: float | None = None,
    ) -> None:
        """Ask PayPal about the event when ``confirm`` is set, then refuse a signed transmission id seen
        before with another body. Called only after ``verify`` accepted the same request."""
        lowered = lower_headers(headers)
        transmission_id = lowered[_ID.lower()]
        transmission_time = lowered[_TIME.lower()]
        if self._api is not None:
            # Before the memory: a forged body that arrives first must not be remembered as the id's
            # body, or the genuine delivery would then be refused as the reuse.
            (event,) = verified.events
            transmission = Transmission(
                transmission_id=transmission_id,
                transmission_time=transmission_time,
                transmission_sig=lowered[_SIGNATURE.lower()],
                cert_url=lowered[_CERT_URL.lower()],
                auth_algo=lowered[_AUTH_ALGO.lower()],
            )
            webhook_id = self._webhook_ids[verified.secret_index]
            await self._api.confirm(event.payload, body, transmission, webhook_id)
        digest = hashlib.sha256(body).hexdigest()
        # The id is signed with its time, so no delivery naming it passes verify after time + tolerance:
        # remembering it until then is remembering it for as long as it matters.
        first = await memory.remember_first(
            source=source,
            transmission_id=transmission_id,
            body_sha256=digest,
            expires_at=float(_parse_time(transmission_time) + self._tolerance),
        )
        if first != digest:
            raise TransmissionReused(
                f"{_ID} was delivered before with another body: PayPal's signature covers the body only "
                "by its CRC32, so this body is not the one PayPal signed"
            )


# --- construction helpers -----------------------------------------------------------------------


def _api(
    mode: object,
    base: str | None,
    client_id: str | None,
    client_secret: str | None,
    ca_bundle: str | None,
    timeout: float,
) -> PayPalApi | None:
    if mode is None:
        if client_id is None and client_secret is None:
            # The safe mode is the default, so a source without credentials must choose "off" in words.
            raise SchemeConfigError(
                'confirm: defaults to "fetch_event", which needs PayPal API credentials: set client_id_env '
                'and client_secret_env in the source\'s options (recommended), or set confirm = "off" '
                "and accept that a forged body sent under a genuine delivery's headers before the genuine "
                "delivery arrives (headers seen in a proxy or APM log) is accepted and becomes an effect"
            )
        mode = "fetch_event"
    if mode == "off":
        if client_id is not None or client_secret is not None or base is not None:
            raise SchemeConfigError(
                "confirm: api_base, client_id and client_secret are only used with confirm = "
                '"fetch_event" or "verify_api"; set confirm or remove them'
            )
        return None
    if mode not in CONFIRM_MODES:
        raise SchemeConfigError(f"confirm: expected one of {', '.join(CONFIRM_MODES)}, got {mode!r}")
    identity = option_str("client_id", client_id)
    secret = option_str("client_secret", client_secret)
    if identity is None or secret is None:
        missing = "client_id" if identity is None else "client_secret"
        raise SchemeConfigError(f"{missing}: required with confirm = {mode!r} (PayPal's API needs OAuth)")
    return PayPalApi(
        mode=str(mode),
        base_url=base if base is not None else DEFAULT_API_BASE,
        client_id=identity,
        client_secret=secret,
        ca_bundle=ca_bundle,
        timeout=timeout,
    )


def _positive_number(option: str, value: object, default: float) -> float:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise SchemeConfigError(f"{option}: expected a positive number of seconds, got {value!r}")
    return float(value)


# --- reading a request --------------------------------------------------------------------------


def _decode_signature(value: str) -> bytes:
    if value.isascii():
        try:
            signature = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            pass
        else:
            if len(signature) in _SIGNATURE_SIZES:
                return signature
    raise SignatureMalformed(f"{_SIGNATURE}: not a base64 RSA signature (2048 to 8192 bits)")


def _parse_time(value: str) -> int:
    try:
        if len(value) > _MAX_TIME_CHARS:
            raise ValueError
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise SignatureMalformed(f"{_TIME}: not an ISO 8601 time") from None
    if parsed.tzinfo is None:
        raise SignatureMalformed(f"{_TIME}: has no time zone")
    return int(parsed.timestamp())

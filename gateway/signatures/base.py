"""The interface every signature scheme implements, and the errors `verify` may raise.

A scheme checks the raw request bytes and headers of one delivery against the secrets it was
configured with and returns the events the delivery carries. Everything it can say about a bad
request it says with one of these exceptions; nothing else escapes ``verify``::

    VerificationError                     .code                           HTTP
    ├── SignatureError                                                    401
    │   ├── SignatureMissing              signature_missing
    │   ├── SignatureMalformed            signature_malformed
    │   ├── SignatureInvalid              signature_invalid
    │   ├── TimestampOutOfTolerance       timestamp_out_of_tolerance
    │   ├── UnsupportedSignatureVersion   signature_version_unsupported
    │   ├── CertificateUntrusted          certificate_untrusted
    │   │   └── CertificateFetchLimited   certificate_fetch_limited
    │   ├── TransmissionReused            transmission_reused
    │   └── ConfirmationFailed            confirmation_failed
    ├── PayloadError                      malformed_payload               400
    └── ConfirmationUnavailable           confirmation_unavailable        503

    SchemeConfigError (a ValueError)      bad configuration; raised at construction, never by verify
    SigningError (a ValueError)           a delivery cannot be signed locally; raised by sign only

The last two come from ``confirm``, the step after a valid signature (PayPal's): a transmission id
seen before with another body, the provider's own API disowning the event, or that API unreachable.

Every scheme that can be signed without the provider's own key also has a ``sign`` method (the
``Signer`` protocol): the other half of ``verify``, used by ``effectgate send`` and tested against it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class Covers:
    """What a provider's signature covers, as data the gateway acts on (docs/providers.md tabulates it).

    ``body``: the raw body bytes, by a cryptographic hash (not so for PayPal, whose CRC32 is forgeable,
    nor Adyen, which signs named fields of each item). ``timestamp``: a send time, so a tolerance can
    refuse an old replay. ``id`` / ``type``: the provider's event (or delivery) id and the event type.
    ``url``: the public URL the provider called.

    Where ``id`` is false (GitHub's ``X-GitHub-Delivery``, Shopify's webhook id, Twilio's idempotency
    token, a generic ``hmac`` ``id_header``), the event id handlers and keys see is ``body_event_id`` of
    the signed body and the header travels as ``Event.delivery_id``; so every ``Event.id`` is signed.
    Where ``type`` is false, the event type is a routing hint a replayer can change: effects that must
    not run on the wrong type check signed content with ``require``.
    """

    body: bool
    timestamp: bool
    id: bool
    type: bool
    url: bool = False


@dataclass(frozen=True, slots=True)
class Event:
    """One provider event carried by a verified delivery: its id, its type (the name handlers are matched
    on) and the parsed body.

    ``id`` always comes from signed material: the provider's event id where the signature covers it,
    otherwise ``body_event_id`` of the signed body. ``delivery_id`` is the provider's id header when it is
    unsigned (GitHub's ``X-GitHub-Delivery``): for logs and reports, never for identity. ``type_signed``
    is false when the type travels in an unsigned header, so routing on it proves nothing.
    """

    id: str
    type: str
    payload: Any
    type_signed: bool = True
    delivery_id: str | None = None


BODY_ID_PREFIX = "sha256:"


def body_event_id(body: bytes) -> str:
    """The event id of a delivery whose provider signs its body but not its id header: ``sha256:`` and the
    hex SHA-256 of the raw signed body. The provider's own retries resend the same bytes (same id, so a
    duplicate); a replay of captured bytes under a rewritten id header is the same id too."""
    return BODY_ID_PREFIX + hashlib.sha256(body).hexdigest()


@dataclass(frozen=True, slots=True)
class Verified:
    """The outcome of a successful verification: the events the delivery carries (usually one), the
    position of the configured secret that matched (never its value, so it can be logged to watch a
    rotation), and, for a provider handshake such as Slack's ``url_verification``, the JSON the gateway
    must answer with 200 instead of claiming anything. ``acknowledgement``, when set, is the exact body
    the provider expects in a 2xx answer once the events are claimed (Adyen's ``[accepted]``); the
    gateway then sends it as ``text/plain`` instead of its own JSON summary."""

    events: tuple[Event, ...]
    secret_index: int
    challenge: dict[str, Any] | None = None
    acknowledgement: bytes | None = None


class VerificationError(Exception):
    """The delivery could not be verified.

    Root of every error ``verify`` raises. ``code`` is machine-readable and stable; ``detail`` is for a
    human and never contains a secret or a full signature, so both may be logged and returned to the
    sender. The first line of each class docstring is its default detail.
    """

    code: ClassVar[str] = "verification_failed"

    def __init__(self, detail: str | None = None) -> None:
        self.detail = detail if detail else (type(self).__doc__ or self.code).strip().splitlines()[0]
        super().__init__(self.detail)


class SignatureError(VerificationError):
    """The delivery is not authenticated.

    Every subclass means the body must not be trusted or claimed; the gateway answers 401.

    ``diagnose``, when set, is a deferred explanation too costly to compute while answering (it may parse
    and re-serialise the body): called with no arguments, it returns a hint for the operator or None, and
    never raises. The gateway runs it sampled and off the event loop; the sender never waits for it.
    """

    code: ClassVar[str] = "signature_failed"
    diagnose: Callable[[], str | None] | None = None


class SignatureMissing(SignatureError):
    """A header the scheme needs to authenticate the delivery is absent or empty."""

    code: ClassVar[str] = "signature_missing"


class SignatureMalformed(SignatureError):
    """A signature or timestamp header is present but cannot be parsed."""

    code: ClassVar[str] = "signature_malformed"


class SignatureInvalid(SignatureError):
    """No presented signature matches any configured secret.

    The detail says how many signatures and secrets were tried. Whether a re-serialised form of the JSON
    body would have matched (a proxy re-encoded it in transit) is left to ``diagnose``: finding out costs
    a parse and several re-serialisations, which a failed request must not pay.
    """

    code: ClassVar[str] = "signature_invalid"


class TimestampOutOfTolerance(SignatureError):
    """The signed timestamp is too far from the server clock, so the delivery may be a replay.

    The detail gives the skew in seconds and whether the timestamp lies in the past or the future.
    """

    code: ClassVar[str] = "timestamp_out_of_tolerance"


class UnsupportedSignatureVersion(SignatureError):
    """Signatures are present, but none in a version or algorithm this scheme accepts."""

    code: ClassVar[str] = "signature_version_unsupported"


class CertificateUntrusted(SignatureError):
    """The certificate that should vouch for the signature cannot be trusted.

    Its URL is not https or not on the allowed hosts, it could not be fetched, it does not chain to a
    configured certificate authority, it is expired or not yet valid, or it names another subject.
    """

    code: ClassVar[str] = "certificate_untrusted"


class CertificateFetchLimited(CertificateUntrusted):
    """The certificate was not fetched: too many fetches for unauthenticated requests; try again later.

    The request named a certificate the gateway has not cached, and its client (or all clients together)
    caused as many certificate fetches as the gateway allows for a while, or as many are in flight.
    """

    code: ClassVar[str] = "certificate_fetch_limited"


class TransmissionReused(SignatureError):
    """The signed transmission id was already delivered with another body.

    The signature covers the body only by a checksum (PayPal's CRC32), so a body forged to the same
    checksum would pass it; the remembered body hash does not.
    """

    code: ClassVar[str] = "transmission_reused"


class ConfirmationFailed(SignatureError):
    """The provider's own API does not confirm this delivery.

    It answered that the signature is not its own, that it has no event with this id, or that its event
    differs from the body.
    """

    code: ClassVar[str] = "confirmation_failed"


class ConfirmationUnavailable(VerificationError):
    """The delivery could not be confirmed now; nothing was claimed, so the provider's retry is safe.

    The provider's API or the ledger did not answer as expected; the gateway answers 503 and the log
    says why.
    """

    code: ClassVar[str] = "confirmation_unavailable"


class PayloadError(VerificationError):
    """The body is authentic but unusable: not parseable, or lacking the event id or type.

    The gateway answers 400; the provider's retry of the same body would fail the same way.
    """

    code: ClassVar[str] = "malformed_payload"


class SchemeConfigError(ValueError):
    """A scheme was configured wrongly (empty secret, undecodable key, unknown or invalid option).

    Raised at construction only, so a bad source fails at start-up rather than on its first delivery.
    The message names the offending option and never contains a secret.
    """


class SigningError(ValueError):
    """This delivery cannot be signed locally.

    The scheme signs with a key only the provider holds (PayPal), or an input the scheme needs is
    missing or wrong; the message says which, names the input (``event_type``, ``signing_key``, a body
    field) and never contains a secret.
    """


@dataclass(frozen=True, slots=True)
class Signed:
    """A delivery as its provider would send it: the body (changed only by schemes that sign inside it,
    such as Adyen) and the headers that carry the signature, the event id or type, and the content type."""

    body: bytes
    headers: dict[str, str]


JSON_CONTENT_TYPE = "application/json"
FORM_CONTENT_TYPE = "application/x-www-form-urlencoded"


@runtime_checkable
class Signer(Protocol):
    """The signing half of a scheme, for local testing: what the provider would send for ``body``.

    It signs with the first configured secret (the one a rotation makes current) and the clock ``now``
    (Unix seconds; ``None`` means the current time). ``event_id`` and ``event_type`` are used by schemes
    that carry them in headers (GitHub, Shopify, Standard Webhooks, Twilio, a generic ``hmac`` with
    ``id_header``/``type_header``); a ``None`` id there becomes a fresh one, as a provider's new delivery
    would carry. Schemes that read them from the body take the body as it is. ``content_type`` is sent as
    ``Content-Type`` and, for Twilio, chooses form or JSON signing. ``signing_key`` is a private key for
    schemes configured with only the public half (a Standard Webhooks ``whpk_`` key); the others refuse it.
    Raises ``SigningError`` and nothing else for a delivery it cannot sign.
    """

    def sign(
        self,
        body: bytes,
        *,
        event_id: str | None = None,
        event_type: str | None = None,
        content_type: str = JSON_CONTENT_TYPE,
        signing_key: str | None = None,
        now: float | None = None,
    ) -> Signed:
        """Sign ``body`` as the provider would; see the class docstring."""
        ...


class ReplayMemory(Protocol):
    """What the gateway lends a scheme's ``confirm`` step: a memory shared by every gateway replica.

    ``remember_first`` records ``body_sha256`` (hex) under (``source``, ``transmission_id``) until
    ``expires_at`` (Unix seconds) unless something is recorded already, and returns the hash recorded
    first, so a caller that gets back another hash than its own knows the id came with another body.
    It raises ``ConfirmationUnavailable`` when the memory cannot be reached.
    """

    async def remember_first(
        self, *, source: str, transmission_id: str, body_sha256: str, expires_at: float
    ) -> str:
        """Record unless recorded; the hash recorded first."""
        ...


class Scheme(Protocol):
    """What the gateway calls: one verifier per configured source, built by ``build_scheme``.

    ``verify`` checks the raw ``body`` bytes, before any parsing, against ``headers`` (any mapping; names
    are matched case-insensitively) and the clock ``now`` (Unix seconds; ``None`` means the current time).
    It returns ``Verified`` or raises a ``VerificationError`` subclass, and nothing else, whatever the input.

    ``prepare`` is awaited by the gateway before ``verify`` with the same request. It is where a scheme
    does I/O that verification depends on (PayPal fetches and validates its signing certificate), so
    ``verify`` itself stays synchronous, pure and cheap. It never raises for a bad request: whatever it
    could not do, ``verify`` reports as a typed error. ``client`` is the address the request came from, as
    the edge limits count it (None when the server gave none): what a scheme's fetches on behalf of
    unauthenticated requests are charged to. For most schemes it does nothing.

    ``confirm`` is awaited by the gateway after ``verify`` succeeded, with what it returned; so only an
    authenticated delivery can cause its I/O. It raises a ``SignatureError`` (401) when the delivery
    must not be claimed after all, ``ConfirmationUnavailable`` (503) when it cannot tell now. ``source``
    names the configured source and ``memory`` is the gateway's ``ReplayMemory``. For most schemes it
    does nothing.
    """

    name: ClassVar[str]
    covers: Covers

    async def prepare(
        self, body: bytes, headers: Mapping[str, str], *, now: float | None = None, client: str | None = None
    ) -> None:
        """Do the I/O ``verify`` will need for this request, if any; never raises for a bad request."""
        ...

    def verify(self, body: bytes, headers: Mapping[str, str], *, now: float | None = None) -> Verified:
        """Authenticate one delivery and extract its events."""
        ...

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
        """Check what needs I/O once the signature is known good; raise to refuse the delivery."""
        ...

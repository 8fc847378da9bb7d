"""PayPal: RSA-SHA256 over ``"<transmission id>|<time>|<webhook id>|<crc32 of the body>"``.

See https://developer.paypal.com/api/rest/webhooks/rest/#link-verifysignature. The signature
(``PAYPAL-TRANSMISSION-SIG``, base64) is made with the private key of a certificate PayPal publishes at
``PAYPAL-CERT-URL``. The request names that URL, so it is trusted only if it is https on an allowed host
*and* the certificate it serves chains to a configured certificate authority and names PayPal's
message-signing subject: a URL alone proves nothing.

Why a ``prepare`` step. Verifying needs the certificate, and fetching it is network I/O; ``verify`` is
synchronous and runs on the event loop, so fetching there would stall every other request for up to
the fetch timeout. Instead the gateway awaits ``prepare`` first: it fetches the certificate (through
an injectable async ``fetcher``, so tests serve certificates from memory or loopback and never reach
PayPal), validates the chain once, and caches the public key by URL until the chain expires.
``verify`` then stays pure and cheap, reading only the cache, and reports whatever ``prepare`` could
not do as ``CertificateUntrusted``. PayPal signs with a handful of long-lived certificates, so after
the first delivery ``prepare`` is a dictionary lookup. Fetches are serialised per source and failed
URLs are remembered for a short while, so a flood of requests naming fresh URLs costs at most one
outbound fetch at a time.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import math
import re
import ssl
import time
import warnings
import zlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import ClassVar, TypeVar
from urllib.parse import urlsplit

import certifi
import httpx
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding
from cryptography.hazmat.primitives.asymmetric.rsa import RSAPublicKey
from cryptography.utils import CryptographyDeprecationWarning
from cryptography.x509.oid import NameOID
from cryptography.x509.verification import ExtensionPolicy, PolicyBuilder, Store
from cryptography.x509.verification import VerificationError as ChainError

from ._common import (
    Headers,
    SchemeBase,
    SigningRequest,
    check_timestamp,
    describe_labels,
    event_from_json,
    first_header,
    lower_headers,
    require_header,
    require_match,
    secret_strings,
)
from .base import (
    CertificateUntrusted,
    Covers,
    SchemeConfigError,
    SignatureMalformed,
    SigningError,
    UnsupportedSignatureVersion,
    Verified,
)

_T = TypeVar("_T")

Fetcher = Callable[[str], Awaitable[bytes]]
"""Given a certificate URL, its body (PEM: the signing certificate, then any intermediates)."""

DEFAULT_CERT_HOSTS = ("api.paypal.com", "api.sandbox.paypal.com", "*.paypal.com")
DEFAULT_CERT_NAME = "messageverificationcerts.paypal.com"
DEFAULT_FETCH_TIMEOUT = 5.0
DEFAULT_CERT_CACHE_SIZE = 16
# A failed URL is not fetched again for this long: PayPal's own retry comes minutes later anyway.
FAILURE_TTL = 30.0
# A PEM chain of three RSA certificates is about 6 KB; anything far larger is not a certificate.
MAX_CERT_BYTES = 64 * 1024

_ALGORITHM = "SHA256withRSA"
_ID = "PAYPAL-TRANSMISSION-ID"
_TIME = "PAYPAL-TRANSMISSION-TIME"
_SIGNATURE = "PAYPAL-TRANSMISSION-SIG"
_CERT_URL = "PAYPAL-CERT-URL"
_AUTH_ALGO = "PAYPAL-AUTH-ALGO"
# RSA signatures are as long as the modulus: 2048 to 8192 bits.
_SIGNATURE_SIZES = range(256, 1025)
_MAX_TIME_CHARS = 40
_PEM_BLOCK = re.compile(rb"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.DOTALL)


@dataclass(frozen=True, slots=True)
class _Trusted:
    key: RSAPublicKey
    not_before: float
    not_after: float


@dataclass(frozen=True, slots=True)
class _Failed:
    detail: str
    retry_at: float


class PayPalScheme(SchemeBase):
    """Verifies PayPal webhooks. The configured secrets are the webhook IDs PayPal assigned to this
    endpoint (several while moving to a new webhook; they are not secret in the cryptographic sense,
    but they bind a signature to this endpoint and live beside real secrets in the environment).

    Options: ``cert_hosts``, the hosts ``PAYPAL-CERT-URL`` may name (default ``api.paypal.com``,
    ``api.sandbox.paypal.com``, ``*.paypal.com``; ``*.`` matches any subdomain); ``ca_bundle``, a PEM file
    of the authorities the certificate must chain to (default: certifi's public roots);
    ``cert_name``, the DNS name or common name the certificate must carry (default
    ``messageverificationcerts.paypal.com``); ``fetch_ca_bundle``, the PEM file trusted for the HTTPS
    fetch itself (default: certifi's); ``fetch_timeout`` in seconds (default 5); ``cert_cache_size``
    (default 16 URLs); ``tolerance``, off by default because PayPal documents no replay window, else the
    largest accepted age of ``PAYPAL-TRANSMISSION-TIME`` in seconds. ``fetcher`` replaces the HTTPS
    client (tests). The event id is the body's ``id`` and the type its ``event_type``."""

    name: ClassVar[str] = "paypal"
    covers = Covers(body=False, timestamp=True, id=True, type=True)

    def __init__(
        self,
        secrets: Sequence[str],
        *,
        tolerance: int | None = None,
        cert_hosts: Sequence[str] | None = None,
        ca_bundle: str | None = None,
        cert_name: str | None = None,
        fetch_ca_bundle: str | None = None,
        fetch_timeout: float | None = None,
        cert_cache_size: int | None = None,
        fetcher: Fetcher | None = None,
    ) -> None:
        self._webhook_ids = secret_strings(secrets)
        if tolerance is not None and (
            isinstance(tolerance, bool) or not isinstance(tolerance, int) or tolerance <= 0
        ):
            raise SchemeConfigError(f"tolerance: expected a positive number of seconds, got {tolerance!r}")
        self._tolerance = tolerance
        self._hosts = _host_patterns(DEFAULT_CERT_HOSTS if cert_hosts is None else cert_hosts)
        self._store = Store(_read_pem_bundle("ca_bundle", ca_bundle or certifi.where()))
        if cert_name is not None and (not isinstance(cert_name, str) or not cert_name):
            raise SchemeConfigError(f"cert_name: expected a non-empty string, got {cert_name!r}")
        self._cert_name = (cert_name or DEFAULT_CERT_NAME).lower()
        self._timeout = _positive_number("fetch_timeout", fetch_timeout, DEFAULT_FETCH_TIMEOUT)
        size = DEFAULT_CERT_CACHE_SIZE if cert_cache_size is None else cert_cache_size
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise SchemeConfigError(f"cert_cache_size: expected a positive integer, got {cert_cache_size!r}")
        self._cache_size = size
        if fetcher is not None and not callable(fetcher):
            raise SchemeConfigError("fetcher: expected an async callable (it cannot be set from a file)")
        if fetch_ca_bundle is not None:
            _read_pem_bundle("fetch_ca_bundle", fetch_ca_bundle)
        self._fetch = fetcher or https_fetcher(ca_bundle=fetch_ca_bundle, timeout=self._timeout)
        self._trusted: OrderedDict[str, _Trusted] = OrderedDict()
        self._failed: OrderedDict[str, _Failed] = OrderedDict()
        self._fetching = asyncio.Lock()

    async def prepare(self, body: bytes, headers: Mapping[str, str], *, now: float | None = None) -> None:
        """Fetch, validate and cache the certificate ``PAYPAL-CERT-URL`` names, unless it is cached.

        Never raises for a bad request: a missing or disallowed URL is left for ``verify`` to report,
        and a failed fetch or validation is remembered for ``verify`` to report as its detail.
        """
        url = first_header(lower_headers(headers), _CERT_URL)
        clock = time.time() if now is None else now
        if url is None or not math.isfinite(clock):
            return
        try:
            self._check_url(url)
        except CertificateUntrusted:
            return
        if self._cached(url, clock):
            return
        async with self._fetching:
            if self._cached(url, clock):
                return
            outcome = await self._load(url, clock)
        # Two bounded caches, so a flood of failing URLs can never evict a trusted certificate.
        if isinstance(outcome, _Trusted):
            self._failed.pop(url, None)
            _remember(self._trusted, url, outcome, self._cache_size)
        else:
            _remember(self._failed, url, outcome, self._cache_size)

    def _sign(self, request: SigningRequest) -> tuple[bytes, Headers]:
        raise SigningError(
            "PayPal cannot be signed locally: PayPal signs each delivery with the private key of its own "
            "certificate, which only PayPal holds. Send a test event from PayPal's developer dashboard "
            "(Webhooks simulator) to the gateway's public URL instead."
        )

    def _verify(self, body: bytes, headers: Headers, now: float) -> Verified:
        transmission_id = require_header(headers, _ID)
        transmission_time = require_header(headers, _TIME)
        signature = _decode_signature(require_header(headers, _SIGNATURE))
        url = require_header(headers, _CERT_URL)
        algorithm = require_header(headers, _AUTH_ALGO)
        if algorithm != _ALGORITHM:
            raise UnsupportedSignatureVersion(
                f"{_AUTH_ALGO}: {describe_labels([algorithm])}; only {_ALGORITHM!r} is supported"
            )
        timestamp = _parse_time(transmission_time) if self._tolerance is not None else None
        self._check_url(url)
        key = self._key(url, now)
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
        if timestamp is not None and self._tolerance is not None:
            check_timestamp(timestamp, now, self._tolerance)
        return Verified(events=(event_from_json(body, type_path="event_type"),), secret_index=index)

    # --- the certificate ------------------------------------------------------------------------

    def _check_url(self, url: str) -> None:
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 - raises ValueError for a port that is not a number
        except ValueError:
            raise CertificateUntrusted(f"{_CERT_URL} is not a valid URL") from None
        if parts.scheme != "https":
            raise CertificateUntrusted(f"{_CERT_URL} must be https")
        host = parts.hostname or ""
        if parts.username is not None or parts.password is not None or not host.isascii():
            raise CertificateUntrusted(f"{_CERT_URL} has credentials or a non-ASCII host")
        if not any(_host_matches(host, pattern) for pattern in self._hosts):
            shown = host[:64] if _printable(host) else "(unprintable)"
            raise CertificateUntrusted(
                f"{_CERT_URL} host {shown!r} is not among the allowed cert_hosts ({', '.join(self._hosts)})"
            )

    def _cached(self, url: str, clock: float) -> bool:
        trusted = self._trusted.get(url)
        if trusted is not None and trusted.not_before <= clock < trusted.not_after:
            self._trusted.move_to_end(url)
            return True
        failed = self._failed.get(url)
        return failed is not None and clock < failed.retry_at

    def _key(self, url: str, now: float) -> RSAPublicKey:
        if not math.isfinite(now):
            # A NaN clock compares false with every validity bound: fail closed.
            raise CertificateUntrusted("server clock reading is not a finite number")
        trusted = self._trusted.get(url)
        if trusted is not None and trusted.not_before <= now < trusted.not_after:
            return trusted.key
        failed = self._failed.get(url)
        if failed is not None:
            # prepare tried (again) and failed: its reason is more telling than a stale cache entry's.
            raise CertificateUntrusted(failed.detail)
        if trusted is not None:
            state = "has expired" if now >= trusted.not_after else "is not valid yet"
            raise CertificateUntrusted(f"the signing certificate (or its chain) {state}")
        raise CertificateUntrusted(
            "the signing certificate has not been fetched; the gateway fetches it in prepare() before verify()"
        )

    async def _load(self, url: str, clock: float) -> _Trusted | _Failed:
        def failed(detail: str) -> _Failed:
            return _Failed(detail, clock + FAILURE_TTL)

        try:
            async with asyncio.timeout(self._timeout):
                pem = await self._fetch(url)
        except Exception as exc:
            # Whatever the fetcher raised (connection, TLS, timeout, status): the request is not trusted.
            return failed(f"could not fetch the signing certificate: {type(exc).__name__}: {str(exc)[:200]}")
        if not isinstance(pem, bytes) or len(pem) > MAX_CERT_BYTES:
            return failed("the certificate URL did not return a PEM certificate chain of sensible size")
        try:
            leaf, *intermediates = x509.load_pem_x509_certificates(pem)
        except ValueError:
            return failed("the certificate URL did not return a PEM certificate chain")
        verifier = (
            PolicyBuilder()
            .store(self._store)
            .time(datetime.fromtimestamp(clock, UTC))
            # The chain is held to the web PKI's rules; the leaf is a signing certificate, not a TLS
            # server's, so its own extensions (EKU, SAN) are not required — its name is checked below.
            .extension_policies(
                ca_policy=ExtensionPolicy.webpki_defaults_ca(), ee_policy=ExtensionPolicy.permit_all()
            )
            .build_client_verifier()
        )
        try:
            chain = verifier.verify(leaf, intermediates).chain
        except ChainError as exc:
            return failed(f"the signing certificate does not chain to a trusted authority: {str(exc)[:200]}")
        try:
            names = _names(leaf)
            key = leaf.public_key()
        except Exception as exc:
            # Extensions and keys are parsed lazily; an odd certificate may only fail here.
            return failed(f"the signing certificate cannot be read: {type(exc).__name__}")
        if self._cert_name not in names:
            return failed(f"the signing certificate is not issued to {self._cert_name!r}")
        if not isinstance(key, RSAPublicKey):
            return failed(f"the signing certificate's key is not RSA, as {_ALGORITHM} needs")
        return _Trusted(
            key=key,
            not_before=max(cert.not_valid_before_utc.timestamp() for cert in chain),
            not_after=min(cert.not_valid_after_utc.timestamp() for cert in chain),
        )


def https_fetcher(*, ca_bundle: str | None = None, timeout: float = DEFAULT_FETCH_TIMEOUT) -> Fetcher:
    """The default fetcher: one GET over verified HTTPS, no redirects, 200 only, at most 64 KiB."""
    verify: ssl.SSLContext | bool = (
        True if ca_bundle is None else ssl.create_default_context(cafile=ca_bundle)
    )

    async def fetch(url: str) -> bytes:
        # One client per fetch: certificates are fetched a few times a day, not per request.
        async with (
            httpx.AsyncClient(verify=verify, timeout=timeout, follow_redirects=False) as client,
            client.stream("GET", url) as response,
        ):
            if response.status_code != 200:
                raise OSError(f"HTTP {response.status_code}")
            chunks: list[bytes] = []
            size = 0
            async for chunk in response.aiter_bytes():
                size += len(chunk)
                if size > MAX_CERT_BYTES:
                    raise OSError(f"response larger than {MAX_CERT_BYTES} bytes")
                chunks.append(chunk)
            return b"".join(chunks)

    return fetch


# --- construction helpers -----------------------------------------------------------------------


def _host_patterns(hosts: object) -> tuple[str, ...]:
    if isinstance(hosts, str | bytes) or not isinstance(hosts, Sequence) or not hosts:
        raise SchemeConfigError("cert_hosts: expected a non-empty list of host names")
    patterns = []
    for index, host in enumerate(hosts):
        if not isinstance(host, str) or not host.isascii():
            raise SchemeConfigError(f"cert_hosts[{index}]: expected an ASCII host name, got {host!r}")
        bare = host.removeprefix("*.")
        if not bare or any(c in bare for c in "*/:@ ") or ("." not in bare and bare != "localhost"):
            raise SchemeConfigError(
                f"cert_hosts[{index}]: expected a host name or *.domain (no port, scheme or path), got {host!r}"
            )
        patterns.append(host.lower())
    return tuple(patterns)


def _read_pem_bundle(option: str, path: str) -> list[x509.Certificate]:
    if not isinstance(path, str) or not path:
        raise SchemeConfigError(f"{option}: expected a path to a PEM file, got {path!r}")
    try:
        text = Path(path).read_bytes()
    except OSError as exc:
        raise SchemeConfigError(f"{option}: cannot read {path}: {exc.strerror or exc}") from None
    certificates = []
    for block in _PEM_BLOCK.findall(text):
        # One by one: public bundles carry a few roots that newer cryptography releases warn about or
        # refuse (a zero serial number); one such root must not make the whole bundle unusable.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CryptographyDeprecationWarning)
            try:
                certificates.append(x509.load_pem_x509_certificate(block))
            except ValueError:
                continue
    if not certificates:
        raise SchemeConfigError(f"{option}: {path} holds no PEM certificate")
    return certificates


def _positive_number(option: str, value: object, default: float) -> float:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise SchemeConfigError(f"{option}: expected a positive number of seconds, got {value!r}")
    return float(value)


# --- reading a request --------------------------------------------------------------------------


def _remember(cache: OrderedDict[str, _T], url: str, entry: _T, size: int) -> None:
    cache[url] = entry
    cache.move_to_end(url)
    while len(cache) > size:
        cache.popitem(last=False)


def _host_matches(host: str, pattern: str) -> bool:
    if pattern.startswith("*."):
        return host.endswith(pattern[1:]) and len(host) > len(pattern) - 1
    return host == pattern


def _printable(text: str) -> bool:
    return text.isprintable() and text.isascii()


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


def _names(certificate: x509.Certificate) -> set[str]:
    names = {
        str(attribute.value).lower()
        for attribute in certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    }
    try:
        san = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return names
    return names | {name.lower() for name in san.value.get_values_for_type(x509.DNSName)}

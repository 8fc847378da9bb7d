"""PayPal's signing certificates: which URLs may be fetched, the fetch, the chain check and the cache.

A delivery names its certificate in ``PAYPAL-CERT-URL``, so the URL is attacker-chosen until the
signature is checked, and the signature cannot be checked before the certificate is fetched. Hence:

- Only URLs under a configured base are fetched: by default PayPal's documented
  ``https://api.paypal.com/v1/notifications/certs/`` and its sandbox twin (and the ``api-m`` hosts PayPal's
  API now lives on), followed by one plain path segment — no query, no other path, no port.
- What a URL serves is trusted only if it chains to a configured authority and names PayPal's
  message-signing subject: a URL alone proves nothing.
- One fetch per URL at a time: concurrent deliveries naming one URL share its in-flight fetch (never one
  lock for all URLs, so a slow URL delays nobody else), at most ``MAX_INFLIGHT_FETCHES`` URLs are fetched
  at once, and a failed URL is not fetched again for ``FAILURE_TTL`` seconds (the last ``MAX_FAILED_URLS``
  failures are kept, apart from the certificates, so a flood of failing URLs evicts neither).
- Every fetch a request starts is paid from its client's budget and from all clients' (``_fetch_budget``):
  past either, the request is refused ``certificate_fetch_limited`` without a fetch, as it is past
  ``MAX_INFLIGHT_FETCHES``.
- A failure's detail for the sender is a fixed sentence; what went wrong (the exception, the chain
  error) goes to the log, never into an answer.
"""

from __future__ import annotations

import asyncio
import logging
import re
import ssl
import warnings
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

import httpx
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric.rsa import RSAPublicKey
from cryptography.utils import CryptographyDeprecationWarning
from cryptography.x509.oid import NameOID
from cryptography.x509.verification import ExtensionPolicy, PolicyBuilder, Store
from cryptography.x509.verification import VerificationError as ChainError

from ._common import https_url_parts
from ._fetch_budget import FetchBudget, Refusal
from .base import CertificateFetchLimited, CertificateUntrusted, SchemeConfigError

log = logging.getLogger("effectgate.gateway.paypal")

_T = TypeVar("_T")

Fetcher = Callable[[str], Awaitable[bytes]]
"""Given a certificate URL, its body (PEM: the signing certificate, then any intermediates)."""

# PayPal documents its certificate URLs as https://api.paypal.com/v1/notifications/certs/CERT-… (live) and
# https://api.sandbox.paypal.com/v1/notifications/certs/CERT-… (sandbox); api-m is the host PayPal's REST
# API moved to, with the same path.
DEFAULT_CERT_URL_BASES = (
    "https://api.paypal.com/v1/notifications/certs/",
    "https://api.sandbox.paypal.com/v1/notifications/certs/",
    "https://api-m.paypal.com/v1/notifications/certs/",
    "https://api-m.sandbox.paypal.com/v1/notifications/certs/",
)
DEFAULT_CERT_NAME = "messageverificationcerts.paypal.com"
DEFAULT_FETCH_TIMEOUT = 5.0
DEFAULT_CERT_CACHE_SIZE = 16
# A failed URL is not fetched again for this long: PayPal's own retry comes minutes later anyway.
FAILURE_TTL = 30.0
# Distinct URLs fetched at once. PayPal signs with a handful of long-lived certificates, so more than a few
# fresh URLs at once means someone names URLs of their own; past this, no fetch is started (the delivery
# is answered certificate_fetch_limited and PayPal's retry finds the certificate cached or fetchable).
MAX_INFLIGHT_FETCHES = 4
# Failed URLs remembered (a few hundred bytes each). The fetch budget lets at most about 30 a minute fail
# per source, so within FAILURE_TTL this is never reached, and a failure is forgotten only when it expires.
MAX_FAILED_URLS = 1_024
# A PEM chain of three RSA certificates is about 6 KB; anything far larger is not a certificate.
MAX_CERT_BYTES = 64 * 1024

_CERT_URL = "PAYPAL-CERT-URL"
_ALGORITHM = "SHA256withRSA"
# PayPal's certificate names look like CERT-360caa42-fca2a594-a5cafa77: one plain segment.
_CERT_FILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_PEM_BLOCK = re.compile(rb"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.DOTALL)

# What a sender is told; the log gets the reason.
FETCH_FAILED = "could not fetch the signing certificate (the gateway log has the reason)"
NOT_PEM = "the certificate URL did not return a PEM certificate chain of sensible size"
UNTRUSTED_CHAIN = (
    "the signing certificate does not chain to a trusted authority, or is expired or not yet valid "
    "(the gateway log has the reason)"
)
LIMITED = {
    "client": "the signing certificate was not fetched: this client caused too many certificate fetches "
    "for unverified requests; try again later",
    "all": "the signing certificate was not fetched: too many certificate fetches for unverified requests "
    "from all clients; try again later",
    "in_flight": "the signing certificate was not fetched: too many certificate fetches in flight; "
    "try again later",
}


@dataclass(frozen=True, slots=True)
class _Trusted:
    key: RSAPublicKey
    not_before: float
    not_after: float


@dataclass(frozen=True, slots=True)
class _Failed:
    detail: str
    retry_at: float


class CertificateStore:
    """The certificates one PayPal source trusts, by URL: fetched in ``load`` (async, never raises for a
    bad request), read in ``key`` (synchronous, raises ``CertificateUntrusted``)."""

    def __init__(
        self,
        *,
        bases: Sequence[str] | None,
        ca_bundle: str,
        cert_name: str | None,
        timeout: float,
        cache_size: int | None,
        fetcher: Fetcher,
        budget: FetchBudget | None = None,
    ) -> None:
        self._bases = url_bases("cert_url_bases", DEFAULT_CERT_URL_BASES if bases is None else bases)
        self._store = Store(read_pem_bundle("ca_bundle", ca_bundle))
        if cert_name is not None and (not isinstance(cert_name, str) or not cert_name):
            raise SchemeConfigError(f"cert_name: expected a non-empty string, got {cert_name!r}")
        self._cert_name = (cert_name or DEFAULT_CERT_NAME).lower()
        size = DEFAULT_CERT_CACHE_SIZE if cache_size is None else cache_size
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise SchemeConfigError(f"cert_cache_size: expected a positive integer, got {cache_size!r}")
        self._cache_size = size
        self._timeout = timeout
        self._fetch = fetcher
        self._trusted: OrderedDict[str, _Trusted] = OrderedDict()
        self._failed: OrderedDict[str, _Failed] = OrderedDict()
        self._inflight: dict[str, asyncio.Future[None]] = {}
        self._budget = budget if budget is not None else FetchBudget()
        # URL -> why the last request naming it started no fetch; read by key() right after load() returned.
        self._limited: OrderedDict[str, str] = OrderedDict()

    def check_url(self, url: str) -> None:
        """Refuse a URL that is not a certificate under one of the configured bases."""
        try:
            parts = urlsplit(url)
        except ValueError:
            raise CertificateUntrusted(f"{_CERT_URL} is not a valid URL") from None
        if parts.scheme != "https":
            raise CertificateUntrusted(f"{_CERT_URL} must be https")
        for base in self._bases:
            if url.startswith(base) and _CERT_FILE.fullmatch(url[len(base) :]):
                return
        # The allowed bases are configuration, and the URL is the sender's own: neither is echoed.
        raise CertificateUntrusted(
            f"{_CERT_URL} is not a certificate URL of PayPal's (host and path must be one of cert_url_bases)"
        )

    async def load(self, url: str, clock: float, client: str | None = None) -> None:
        """Fetch, check and cache the certificate at ``url`` unless cached; share a fetch in flight.
        A fetch started is charged to ``client``'s budget and everyone's; past either, none is started."""
        if self._cached(url, clock):
            return
        inflight = self._inflight.get(url)
        if inflight is None:
            # Decided without an await, so the key() that follows this load() reads this decision.
            limited = self._limit(client or "", clock)
            if limited is not None:
                _remember(self._limited, url, limited, MAX_FAILED_URLS)
                return
            self._limited.pop(url, None)
            inflight = asyncio.ensure_future(self._load(url, clock))
            self._inflight[url] = inflight
            inflight.add_done_callback(lambda done: self._forget(url, done))
        # Shielded: a delivery whose client went away must not cancel the fetch others are waiting on.
        await asyncio.shield(inflight)

    def key(self, url: str, now: float) -> RSAPublicKey:
        """The public key of the certificate at ``url`` valid at ``now``; CertificateUntrusted otherwise."""
        trusted = self._trusted.get(url)
        if trusted is not None and trusted.not_before <= now < trusted.not_after:
            return trusted.key
        limited = self._limited.get(url)
        if limited is not None:
            # No fetch started since this was decided (starting one forgets it): the current answer.
            raise CertificateFetchLimited(limited)
        failed = self._failed.get(url)
        if failed is not None:
            # load tried (again) and failed: its reason is more telling than a stale cache entry's.
            raise CertificateUntrusted(failed.detail)
        if trusted is not None:
            state = "has expired" if now >= trusted.not_after else "is not valid yet"
            raise CertificateUntrusted(f"the signing certificate (or its chain) {state}")
        raise CertificateUntrusted("the signing certificate has not been fetched (prepare() did not run)")

    def _limit(self, client: str, clock: float) -> str | None:
        if len(self._inflight) >= MAX_INFLIGHT_FETCHES:
            # Not charged: nothing is started, and the fetches in flight end within the fetch timeout.
            return LIMITED["in_flight"]
        refusal: Refusal | None = self._budget.take(client, clock)
        if refusal is None:
            return None
        if refusal.first:
            # Once per episode: the budget stays empty while the flood lasts, and each refusal is counted
            # anyway (effectgate_verification_failures_total, reason certificate_fetch_limited).
            log.warning(
                "paypal.certificate_fetches_limited",
                extra={"client": client[:100], "budget": refusal.budget},
            )
        return LIMITED[refusal.budget]

    def _forget(self, url: str, done: asyncio.Future[None]) -> None:
        if self._inflight.get(url) is done:
            del self._inflight[url]

    def _cached(self, url: str, clock: float) -> bool:
        trusted = self._trusted.get(url)
        if trusted is not None and trusted.not_before <= clock < trusted.not_after:
            self._trusted.move_to_end(url)
            return True
        failed = self._failed.get(url)
        return failed is not None and clock < failed.retry_at

    async def _load(self, url: str, clock: float) -> None:
        try:
            outcome = await self._fetch_and_check(url, clock)
        except Exception as exc:
            # A certificate odd enough to break the chain builder itself: untrusted, like any other failure,
            # and never an exception in the waiting requests.
            log.warning("paypal.certificate_untrusted", extra={"url": url[:300], "reason": repr(exc)[:500]})
            outcome = _Failed(UNTRUSTED_CHAIN, clock + FAILURE_TTL)
        # Two bounded caches, so a flood of failing URLs can never evict a trusted certificate.
        if isinstance(outcome, _Trusted):
            self._failed.pop(url, None)
            _remember(self._trusted, url, outcome, self._cache_size)
        else:
            _remember(self._failed, url, outcome, MAX_FAILED_URLS)

    async def _fetch_and_check(self, url: str, clock: float) -> _Trusted | _Failed:
        def failed(public: str, reason: str) -> _Failed:
            # Once per URL per FAILURE_TTL at most: failures are cached, and fetches are bounded.
            log.warning("paypal.certificate_untrusted", extra={"url": url[:300], "reason": reason[:500]})
            return _Failed(public, clock + FAILURE_TTL)

        try:
            async with asyncio.timeout(self._timeout):
                pem = await self._fetch(url)
        except Exception as exc:
            # Whatever the fetcher raised (connection, TLS, timeout, status): the request is not trusted.
            return failed(FETCH_FAILED, f"{type(exc).__name__}: {exc}")
        if not isinstance(pem, bytes) or len(pem) > MAX_CERT_BYTES:
            return failed(NOT_PEM, f"response of type {type(pem).__name__}, size {len(pem)}")
        try:
            leaf, *intermediates = x509.load_pem_x509_certificates(pem)
        except ValueError as exc:
            return failed(NOT_PEM, str(exc))
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
            return failed(UNTRUSTED_CHAIN, str(exc))
        try:
            names = _names(leaf)
            key = leaf.public_key()
        except Exception as exc:
            # Extensions and keys are parsed lazily; an odd certificate may only fail here.
            return failed(f"the signing certificate cannot be read ({type(exc).__name__})", str(exc))
        if self._cert_name not in names:
            return failed(f"the signing certificate is not issued to {self._cert_name!r}", repr(names))
        if not isinstance(key, RSAPublicKey):
            return failed(
                f"the signing certificate's key is not RSA, as {_ALGORITHM} needs", type(key).__name__
            )
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


def url_bases(option: str, bases: object) -> tuple[str, ...]:
    """Check a list of https URL prefixes ending in ``/``: scheme, host (and port) and path, nothing else."""
    if isinstance(bases, str | bytes) or not isinstance(bases, Sequence) or not bases:
        raise SchemeConfigError(f"{option}: expected a non-empty list of https URL prefixes")
    checked = []
    for index, base in enumerate(bases):
        parts = https_url_parts(base)
        if parts is None or not str(base).isascii() or not parts.path.endswith("/") or "//" in parts.path:
            raise SchemeConfigError(
                f"{option}[{index}]: expected an https URL prefix ending in '/' with no query, such as "
                f"'{DEFAULT_CERT_URL_BASES[0]}', got {base!r}"
            )
        checked.append(base)
    return tuple(checked)


def read_pem_bundle(option: str, path: str) -> list[x509.Certificate]:
    """The certificates of a PEM file; SchemeConfigError naming ``option`` when there are none."""
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


def _remember(cache: OrderedDict[str, _T], url: str, entry: _T, size: int) -> None:
    cache[url] = entry
    cache.move_to_end(url)
    while len(cache) > size:
        cache.popitem(last=False)


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

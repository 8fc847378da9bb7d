"""PayPal: RSA-SHA256 with a certificate fetched once, validated against a CA, cached by URL.

Every certificate here comes from the tests' own CA (``paypal_pki``) through an in-memory fetcher, so
the scheme never reaches the network; the loopback HTTPS fetch is exercised by the e2e test.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from hypothesis import given, settings
from hypothesis import strategies as st

from effectgate.gateway.signatures import (
    CertificateUntrusted,
    PayloadError,
    Scheme,
    SchemeConfigError,
    SignatureInvalid,
    SignatureMalformed,
    SignatureMissing,
    TimestampOutOfTolerance,
    UnsupportedSignatureVersion,
    VerificationError,
    Verified,
    build_scheme,
)
from effectgate.gateway.signatures.paypal import FAILURE_TTL
from tests.unit.gateway.signatures.paypal_pki import CERT_URL, MemoryFetcher, Pki, iso, issue, pem
from tests.unit.gateway.signatures.paypal_scheme import BODY, make, signed
from tests.unit.gateway.signatures.signing import NOW, PAYPAL_CA_FILE, PAYPAL_PKI, PAYPAL_WEBHOOK_ID

OTHER_URL = "https://api.sandbox.paypal.com/v1/notifications/certs/CERT-other"


def deliver(scheme: Scheme, body: bytes, headers: dict[str, str], now: float = NOW) -> Verified:
    """What the gateway does: await prepare, then verify."""
    asyncio.run(scheme.prepare(body, headers, now=now))
    return scheme.verify(body, headers, now=now)


def test_a_signed_delivery_is_verified_and_the_certificate_fetched_once() -> None:
    scheme, fetcher = make()
    verified = deliver(scheme, BODY, signed())
    (event,) = verified.events
    assert (event.id, event.type) == ("WH-2WR32451HC0233532-67976317FL4543714", "PAYMENT.CAPTURE.COMPLETED")
    assert event.payload == json.loads(BODY)
    assert verified.secret_index == 0
    assert verified.acknowledgement is None
    other = BODY.replace(b"7.47", b"9.99")
    deliver(scheme, other, signed(other, transmission_id="another"))
    assert fetcher.calls == [CERT_URL]


def test_the_matching_webhook_id_is_reported_by_position() -> None:
    scheme, _ = make(secrets=("OLDWEBHOOKID000", PAYPAL_WEBHOOK_ID))
    assert deliver(scheme, BODY, signed()).secret_index == 1


@pytest.mark.parametrize(
    ("body", "headers"),
    [
        (BODY.replace(b"7.47", b"0.01"), signed()),
        (BODY, signed(webhook_id="SOMEONEELSESID0")),
        (BODY, {**signed(), "PAYPAL-TRANSMISSION-ID": "replayed-under-a-new-id"}),
        (BODY, {**signed(), "PAYPAL-TRANSMISSION-TIME": iso(NOW + 1)}),
        (BODY, signed(pki=Pki.around(NOW))),  # signed by a key other than the certificate's
    ],
    ids=["tampered-body", "other-webhook", "other-transmission-id", "other-time", "other-key"],
)
def test_anything_changed_is_invalid(body: bytes, headers: dict[str, str]) -> None:
    scheme, _ = make()
    with pytest.raises(SignatureInvalid, match="1 configured secret"):
        deliver(scheme, body, headers)


def test_a_re_encoded_body_gets_the_hint() -> None:
    compact = json.dumps(json.loads(BODY), separators=(",", ":")).encode()
    scheme, _ = make()
    with pytest.raises(SignatureInvalid) as caught:
        deliver(scheme, BODY, signed(compact))
    assert caught.value.diagnose is not None
    diagnosis = caught.value.diagnose()
    assert diagnosis is not None and "re-encoded in transit" in diagnosis


@pytest.mark.parametrize(
    "name",
    [
        "PAYPAL-TRANSMISSION-ID",
        "PAYPAL-TRANSMISSION-TIME",
        "PAYPAL-TRANSMISSION-SIG",
        "PAYPAL-CERT-URL",
        "PAYPAL-AUTH-ALGO",
    ],
)
def test_each_header_is_required(name: str) -> None:
    scheme, fetcher = make()
    headers = {k: v for k, v in signed().items() if k != name}
    with pytest.raises(SignatureMissing, match=name):
        deliver(scheme, BODY, headers)
    if name == "PAYPAL-CERT-URL":
        assert fetcher.calls == []


def test_another_algorithm_is_unsupported_and_named() -> None:
    scheme, _ = make()
    with pytest.raises(UnsupportedSignatureVersion, match="'SHA512withRSA'; only 'SHA256withRSA'"):
        deliver(scheme, BODY, {**signed(), "PAYPAL-AUTH-ALGO": "SHA512withRSA"})


@pytest.mark.parametrize("value", ["not base64!", "YWJj", "é", signed()["PAYPAL-TRANSMISSION-SIG"][:-4]])
def test_a_malformed_signature(value: str) -> None:
    scheme, _ = make()
    with pytest.raises(SignatureMalformed, match="PAYPAL-TRANSMISSION-SIG"):
        deliver(scheme, BODY, {**signed(), "PAYPAL-TRANSMISSION-SIG": value})


NOT_PAYPALS = "is not a certificate URL of PayPal's"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://api.paypal.com/v1/notifications/certs/CERT-1", "must be https"),
        ("https://evil.example/v1/notifications/certs/CERT-1", NOT_PAYPALS),
        ("https://api.paypal.com.evil.example/v1/notifications/certs/CERT-1", NOT_PAYPALS),
        ("https://evil.example/api.paypal.com/v1/notifications/certs/CERT-1", NOT_PAYPALS),
        ("https://api.paypal.com@evil.example/v1/notifications/certs/CERT-1", NOT_PAYPALS),
        ("https://paypal.com/v1/notifications/certs/CERT-1", NOT_PAYPALS),
        ("https://www.paypal.com/v1/notifications/certs/CERT-1", NOT_PAYPALS),
        ("https://api.paypal.com:notaport/v1/notifications/certs/CERT-1", NOT_PAYPALS),
        ("https://api.paypal.com:8443/v1/notifications/certs/CERT-1", NOT_PAYPALS),
        ("https://api.paypal.com/v1/oauth2/token", NOT_PAYPALS),
        ("https://api.paypal.com/v1/notifications/certs/", NOT_PAYPALS),
        ("https://api.paypal.com/v1/notifications/certs/CERT-1?redirect=evil", NOT_PAYPALS),
        ("https://api.paypal.com/v1/notifications/certs/CERT-1#x", NOT_PAYPALS),
        ("https://api.paypal.com/v1/notifications/certs/../../v2/x", NOT_PAYPALS),
        ("https://api.paypal.com/v1/notifications/certs/a/b", NOT_PAYPALS),
        ("https://api.paypal.com/v1/notifications/certs/%2e%2e", NOT_PAYPALS),
        ("https://[::1/cert", "not a valid URL"),
        ("file:///etc/passwd", "must be https"),
    ],
)
def test_a_certificate_url_off_the_allow_list_is_untrusted_and_never_fetched(url: str, message: str) -> None:
    scheme, fetcher = make(MemoryFetcher({url: PAYPAL_PKI.chain_pem}))
    with pytest.raises(CertificateUntrusted, match=message) as caught:
        deliver(scheme, BODY, signed(url=url))
    assert caught.value.code == "certificate_untrusted"
    # The sender's own URL is not echoed back (it could be anything), nor the configured bases.
    assert "evil" not in caught.value.detail and "api.paypal.com/v1" not in caught.value.detail
    assert fetcher.calls == []


@pytest.mark.parametrize(
    "url",
    [
        CERT_URL,
        OTHER_URL,
        "https://api-m.paypal.com/v1/notifications/certs/CERT-1",
        "https://api-m.sandbox.paypal.com/v1/notifications/certs/CERT-1",
    ],
)
def test_paypals_documented_certificate_urls_are_allowed_by_default(url: str) -> None:
    scheme, fetcher = make(MemoryFetcher({url: PAYPAL_PKI.chain_pem}))
    deliver(scheme, BODY, signed(url=url))
    assert fetcher.calls == [url]


def test_the_allowed_bases_are_configurable() -> None:
    local = "https://127.0.0.1:8443/v1/notifications/certs/"
    scheme, fetcher = make(MemoryFetcher({local + "CERT-1": PAYPAL_PKI.chain_pem}), cert_url_bases=[local])
    deliver(scheme, BODY, signed(url=local + "CERT-1"))
    with pytest.raises(CertificateUntrusted, match=NOT_PAYPALS):
        deliver(scheme, BODY, signed())
    assert fetcher.calls == [local + "CERT-1"]


def test_verify_without_prepare_is_untrusted_not_a_network_call() -> None:
    scheme, fetcher = make()
    with pytest.raises(CertificateUntrusted, match="has not been fetched"):
        scheme.verify(BODY, signed(), now=NOW)
    assert fetcher.calls == []


def test_a_chain_from_an_unknown_authority_is_untrusted() -> None:
    stranger = Pki.around(NOW)
    scheme, _ = make(MemoryFetcher({CERT_URL: stranger.chain_pem}))
    with pytest.raises(CertificateUntrusted, match="does not chain to a trusted authority"):
        deliver(scheme, BODY, signed(pki=stranger))


def test_a_leaf_alone_without_its_intermediate_is_untrusted() -> None:
    scheme, _ = make(MemoryFetcher({CERT_URL: pem(PAYPAL_PKI.leaf)}))
    with pytest.raises(CertificateUntrusted, match="does not chain"):
        deliver(scheme, BODY, signed())


def test_a_certificate_for_another_name_is_untrusted(tmp_path: Path) -> None:
    impostor = Pki.around(NOW, leaf_name="shop.example")
    scheme, _ = make(MemoryFetcher({CERT_URL: impostor.chain_pem}), ca_bundle=impostor.write_root(tmp_path))
    with pytest.raises(CertificateUntrusted, match=r"not issued to 'messageverificationcerts\.paypal\.com'"):
        deliver(scheme, BODY, signed(pki=impostor))
    named, _ = make(
        MemoryFetcher({CERT_URL: impostor.chain_pem}),
        ca_bundle=impostor.write_root(tmp_path),
        cert_name="shop.example",
    )
    assert deliver(named, BODY, signed(pki=impostor)).secret_index == 0


def test_a_certificate_with_a_key_that_is_not_rsa_is_untrusted() -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = issue(
        "messageverificationcerts.paypal.com",
        key,
        issuer=(PAYPAL_PKI.intermediate, PAYPAL_PKI.intermediate_key),
        valid_from=PAYPAL_PKI.valid_from,
        valid_until=PAYPAL_PKI.valid_until,
    )
    scheme, _ = make(MemoryFetcher({CERT_URL: pem(leaf, PAYPAL_PKI.intermediate)}))
    with pytest.raises(CertificateUntrusted, match="not RSA"):
        deliver(scheme, BODY, signed())


@pytest.mark.parametrize(
    "served", [b"", b"<html>Not Found</html>", b"-----BEGIN CERTIFICATE-----\nAAAA\n", b"x" * 70_000]
)
def test_a_response_that_is_not_a_certificate_is_untrusted(served: bytes) -> None:
    scheme, _ = make(MemoryFetcher({CERT_URL: served}))
    with pytest.raises(CertificateUntrusted, match="PEM certificate chain"):
        deliver(scheme, BODY, signed())


def test_expiry_is_honoured_in_the_cache_and_on_fetch() -> None:
    scheme, fetcher = make()
    deliver(scheme, BODY, signed())
    later = PAYPAL_PKI.valid_until.timestamp() + 1
    in_time = signed(time=iso(later))
    with pytest.raises(CertificateUntrusted, match="expired"):
        scheme.verify(BODY, in_time, now=later)
    with pytest.raises(CertificateUntrusted, match="does not chain to a trusted authority, or is expired"):
        deliver(scheme, BODY, in_time, now=later)
    assert fetcher.calls == [CERT_URL, CERT_URL]


def test_a_failed_fetch_is_reported_remembered_briefly_then_retried(caplog: pytest.LogCaptureFixture) -> None:
    scheme, fetcher = make(MemoryFetcher({}))
    for _ in range(3):
        with pytest.raises(CertificateUntrusted, match="could not fetch the signing certificate") as caught:
            deliver(scheme, BODY, signed())
        # What went wrong on the way out is the operator's to read, not the sender's.
        assert "404" not in caught.value.detail and "OSError" not in caught.value.detail
    assert fetcher.calls == [CERT_URL]
    (record,) = [r for r in caplog.records if r.getMessage() == "paypal.certificate_untrusted"]
    assert record.__dict__["reason"] == "OSError: HTTP 404"
    fetcher.served[CERT_URL] = PAYPAL_PKI.chain_pem
    assert deliver(scheme, BODY, signed(), now=NOW + FAILURE_TTL).secret_index == 0
    assert fetcher.calls == [CERT_URL, CERT_URL]


def test_a_slow_fetch_times_out() -> None:
    async def slow(url: str) -> bytes:
        await asyncio.Event().wait()  # never answers: only the fetch timeout ends it
        return PAYPAL_PKI.chain_pem

    scheme = build_scheme(
        "paypal",
        [PAYPAL_WEBHOOK_ID],
        options={"ca_bundle": PAYPAL_CA_FILE, "fetcher": slow, "fetch_timeout": 0.05, "confirm": "off"},
    )
    with pytest.raises(CertificateUntrusted, match="could not fetch") as caught:
        deliver(scheme, BODY, signed())
    assert "Timeout" not in caught.value.detail


def test_a_fetcher_that_returns_nonsense_or_raises_anything_is_contained(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def weird(url: str) -> Any:
        if "sandbox" in url:
            raise RuntimeError("boom")
        return "a str, not bytes"

    scheme = build_scheme(
        "paypal",
        [PAYPAL_WEBHOOK_ID],
        options={"ca_bundle": PAYPAL_CA_FILE, "fetcher": weird, "confirm": "off"},
    )
    with pytest.raises(CertificateUntrusted, match="could not fetch") as caught:
        deliver(scheme, BODY, signed(url=OTHER_URL))
    assert "boom" not in caught.value.detail
    assert any(r.__dict__.get("reason") == "RuntimeError: boom" for r in caplog.records)
    with pytest.raises(CertificateUntrusted, match="PEM certificate chain"):
        deliver(scheme, BODY, signed())


def test_concurrent_deliveries_share_one_fetch() -> None:
    scheme, fetcher = make()

    async def burst() -> None:
        await asyncio.gather(*(scheme.prepare(BODY, signed(), now=NOW) for _ in range(20)))

    asyncio.run(burst())
    assert fetcher.calls == [CERT_URL]
    assert scheme.verify(BODY, signed(), now=NOW).secret_index == 0


def test_the_cache_is_bounded_by_url() -> None:
    urls = [f"https://api.paypal.com/v1/notifications/certs/CERT-{n}" for n in range(3)]
    scheme, fetcher = make(MemoryFetcher(dict.fromkeys(urls, PAYPAL_PKI.chain_pem)), cert_cache_size=2)
    for url in [*urls, urls[2], urls[0]]:
        deliver(scheme, BODY, signed(url=url))
    # urls[0] was evicted by urls[2] (the oldest of two), so it is fetched again; urls[2] was still held.
    assert fetcher.calls == [*urls, urls[0]]


def test_failures_never_evict_a_trusted_certificate() -> None:
    scheme, fetcher = make(cert_cache_size=1)
    deliver(scheme, BODY, signed())
    for n in range(3):
        with pytest.raises(CertificateUntrusted):
            deliver(scheme, BODY, signed(url=f"https://api.paypal.com/v1/notifications/certs/missing-{n}"))
    deliver(scheme, BODY, signed())
    assert fetcher.calls.count(CERT_URL) == 1


def test_prepare_never_raises_for_a_bad_request() -> None:
    scheme, fetcher = make()
    for headers in (
        {},
        {"PAYPAL-CERT-URL": "http://x"},
        {"PAYPAL-CERT-URL": "https://[::1"},
        {"paypal-cert-url": "\udc80"},
    ):
        asyncio.run(scheme.prepare(BODY, headers, now=NOW))
    asyncio.run(scheme.prepare(BODY, signed(), now=float("nan")))
    assert fetcher.calls == []


def test_a_nan_clock_fails_closed() -> None:
    scheme, _ = make()
    deliver(scheme, BODY, signed())
    with pytest.raises(CertificateUntrusted, match="not a finite number"):
        scheme.verify(BODY, signed(), now=float("nan"))


def test_a_300_s_tolerance_by_default_and_a_configured_one_is_enforced() -> None:
    strict, fetcher = make()
    # 20 days old, as in the measured forgery: refused by default, and nothing is fetched for it.
    with pytest.raises(TimestampOutOfTolerance, match="1728000 s in the past; tolerance is 300 s"):
        deliver(strict, BODY, signed(time=iso(NOW - 20 * 86_400)))
    with pytest.raises(TimestampOutOfTolerance, match="301 s in the future"):
        deliver(strict, BODY, signed(time=iso(NOW + 301)))
    assert fetcher.calls == []
    assert deliver(strict, BODY, signed(time=iso(NOW - 300))).secret_index == 0
    old = signed(time=iso(NOW - 86_400))
    lenient = build_scheme(
        "paypal",
        [PAYPAL_WEBHOOK_ID],
        tolerance=2 * 86_400,
        options={
            "ca_bundle": PAYPAL_CA_FILE,
            "fetcher": MemoryFetcher({CERT_URL: PAYPAL_PKI.chain_pem}),
            "confirm": "off",
        },
    )
    assert deliver(lenient, BODY, old).secret_index == 0
    with pytest.raises(SignatureMalformed, match="PAYPAL-TRANSMISSION-TIME: not an ISO 8601 time"):
        deliver(strict, BODY, signed(time="yesterday"))
    with pytest.raises(SignatureMalformed, match="no time zone"):
        deliver(strict, BODY, signed(time="2023-11-14T22:13:20"))
    assert deliver(strict, BODY, signed(time="2023-11-14T22:13:20.123+00:00")).secret_index == 0


def test_an_authentic_body_without_an_event_type_is_a_payload_error() -> None:
    body = json.dumps({"id": "WH-1"}).encode()
    scheme, _ = make()
    with pytest.raises(PayloadError, match="event_type"):
        deliver(scheme, body, signed(body))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"cert_url_bases": "https://api.paypal.com/"}, r"^cert_url_bases: expected a non-empty list"),
        ({"cert_url_bases": []}, r"^cert_url_bases: expected a non-empty list"),
        ({"cert_url_bases": ["api.paypal.com"]}, r"^cert_url_bases\[0\]: expected an https URL prefix"),
        ({"cert_url_bases": ["http://api.paypal.com/v1/"]}, r"^cert_url_bases\[0\]"),
        ({"cert_url_bases": ["https://api.paypal.com/v1/notifications/certs"]}, r"^cert_url_bases\[0\]"),
        ({"cert_url_bases": ["https://api.paypal.com/v1/?a=/"]}, r"^cert_url_bases\[0\]"),
        ({"cert_url_bases": ["https://u@api.paypal.com/v1/"]}, r"^cert_url_bases\[0\]"),
        ({"cert_url_bases": ["https://api.paypal.com:x/v1/"]}, r"^cert_url_bases\[0\]"),
        ({"cert_url_bases": [1]}, r"^cert_url_bases\[0\]"),
        ({"cert_hosts": ["api.paypal.com"]}, r"^cert_hosts: unknown option for scheme 'paypal'"),
        ({"confirm": "yes"}, r"^confirm: expected one of off, verify_api, fetch_event"),
        ({"confirm": "fetch_event"}, r"^client_id: required with confirm = 'fetch_event'"),
        ({"confirm": "verify_api", "client_id": "x"}, r"^client_secret: required"),
        (
            {"confirm": "off", "client_id": "x", "client_secret": "y"},
            r"^confirm: api_base, client_id and client_secret",
        ),
        (
            {"confirm": "fetch_event", "client_id": "x", "client_secret": "y", "api_base": "http://x"},
            r"^api_base: expected an https URL",
        ),
        (
            {"confirm": "fetch_event", "client_id": "x", "client_secret": "y", "api_base": "https://x/v1"},
            r"^api_base: expected an https URL with no path",
        ),
        ({"ca_bundle": "/nonexistent/ca.pem"}, r"^ca_bundle: cannot read /nonexistent/ca.pem"),
        ({"ca_bundle": __file__}, r"^ca_bundle: .* holds no PEM certificate"),
        ({"ca_bundle": 7}, r"^ca_bundle: expected a path"),
        ({"fetch_ca_bundle": "/nonexistent/ca.pem"}, r"^fetch_ca_bundle: cannot read"),
        ({"cert_name": ""}, r"^cert_name: expected a non-empty string"),
        ({"fetch_timeout": 0}, r"^fetch_timeout: expected a positive number"),
        ({"fetch_timeout": True}, r"^fetch_timeout: expected a positive number"),
        ({"fetch_timeout": float("inf")}, r"^fetch_timeout: expected a positive number"),
        ({"cert_cache_size": 0}, r"^cert_cache_size: expected a positive integer"),
        ({"cert_cache_size": 1.5}, r"^cert_cache_size: expected a positive integer"),
        ({"fetcher": "tests.fetch"}, r"^fetcher: expected an async callable"),
        ({"webhook_id": "X"}, r"^webhook_id: unknown option for scheme 'paypal'"),
    ],
)
def test_configuration_mistakes_are_refused_at_construction(options: dict[str, Any], message: str) -> None:
    with pytest.raises(SchemeConfigError, match=message):
        build_scheme("paypal", [PAYPAL_WEBHOOK_ID], options={"ca_bundle": PAYPAL_CA_FILE, **options})


@pytest.mark.parametrize("tolerance", [0, -5])
def test_tolerance_must_be_positive(tolerance: int) -> None:
    with pytest.raises(SchemeConfigError, match=r"^tolerance"):
        build_scheme(
            "paypal",
            [PAYPAL_WEBHOOK_ID],
            tolerance=tolerance,
            options={"ca_bundle": PAYPAL_CA_FILE, "confirm": "off"},
        )


def test_defaults_build_with_public_roots_and_no_network() -> None:
    # certifi's bundle and the real HTTPS fetcher; building must not fetch anything, nor ask for a token.
    scheme = build_scheme(
        "paypal", [PAYPAL_WEBHOOK_ID], options={"client_id": "client-id", "client_secret": "secret"}
    )
    assert repr(scheme) == "<PayPalScheme scheme='paypal'>"


def test_without_credentials_confirm_off_must_be_chosen_explicitly() -> None:
    # fetch_event is the default: without PayPal API credentials, "off" and its risk are named.
    with pytest.raises(SchemeConfigError, match=r'^confirm: defaults to "fetch_event".*confirm = "off"'):
        build_scheme("paypal", [PAYPAL_WEBHOOK_ID])
    assert build_scheme("paypal", [PAYPAL_WEBHOOK_ID], options={"confirm": "off"}) is not None


@settings(max_examples=100, deadline=None, database=None)
@given(
    served=st.one_of(
        st.binary(max_size=300),
        st.sampled_from([PAYPAL_PKI.chain_pem, PAYPAL_PKI.root_pem, pem(PAYPAL_PKI.intermediate)]).map(
            lambda good: good[: len(good) // 2]
        ),
        st.binary(max_size=40).map(lambda junk: PAYPAL_PKI.chain_pem.replace(b"MII", junk, 1)),
    ),
    url=st.one_of(st.just(CERT_URL), st.text(max_size=40)),
)
def test_whatever_the_certificate_url_serves_the_result_is_typed(served: bytes, url: str) -> None:
    scheme, _ = make(MemoryFetcher({CERT_URL: served}))
    try:
        deliver(scheme, BODY, {**signed(), "PAYPAL-CERT-URL": url})
    except VerificationError as exc:
        assert exc.code in ("certificate_untrusted", "signature_missing")

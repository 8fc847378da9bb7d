"""A certificate authority of the tests' own, standing in for the one behind PayPal's signing certificate.

A root and an intermediate (EC, quick to make) issue an RSA leaf named like PayPal's message-signing
certificate; ``Pki.sign`` signs a delivery the way PayPal documents it. Certificates are served to the
scheme from memory (``Pki.fetcher``) in unit tests and from a loopback HTTPS server in the e2e test, so
no test ever reaches PayPal.
"""

from __future__ import annotations

import base64
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from ipaddress import IPv4Address
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

PAYPAL_NAME = "messageverificationcerts.paypal.com"
CERT_URL = "https://api.paypal.com/v1/notifications/certs/CERT-360caa42-fca2a594-a5cafa77"

PrivateKey = rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def issue(
    subject: str,
    key: PrivateKey,
    *,
    issuer: tuple[x509.Certificate, PrivateKey] | None,
    valid_from: datetime,
    valid_until: datetime,
    ca: bool = False,
    san: list[x509.GeneralName] | None = None,
    server: bool = False,
) -> x509.Certificate:
    """One certificate for ``key``, self-signed when ``issuer`` is None."""
    issuer_name, issuer_key = (_name(subject), key) if issuer is None else (issuer[0].subject, issuer[1])
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid_from)
        .not_valid_after(valid_until)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(_key_usage(ca=ca), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), critical=False
        )
    )
    if san:
        builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
    if server:
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
    return builder.sign(issuer_key, hashes.SHA256())


def pem(*certificates: x509.Certificate) -> bytes:
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certificates)


@dataclass
class Pki:
    """A root, an intermediate and PayPal's signing certificate, valid between two instants."""

    valid_from: datetime
    valid_until: datetime
    leaf_name: str = PAYPAL_NAME
    root_key: ec.EllipticCurvePrivateKey = field(
        default_factory=lambda: ec.generate_private_key(ec.SECP256R1())
    )
    intermediate_key: ec.EllipticCurvePrivateKey = field(
        default_factory=lambda: ec.generate_private_key(ec.SECP256R1())
    )
    leaf_key: rsa.RSAPrivateKey = field(
        default_factory=lambda: rsa.generate_private_key(public_exponent=65537, key_size=2048)
    )

    def __post_init__(self) -> None:
        window = {"valid_from": self.valid_from, "valid_until": self.valid_until}
        self.root = issue("effectgate test root CA", self.root_key, issuer=None, ca=True, **window)
        self.intermediate = issue(
            "effectgate test intermediate CA",
            self.intermediate_key,
            issuer=(self.root, self.root_key),
            ca=True,
            **window,
        )
        self.leaf = issue(
            self.leaf_name,
            self.leaf_key,
            issuer=(self.intermediate, self.intermediate_key),
            san=[x509.DNSName(self.leaf_name)],
            **window,
        )

    @classmethod
    def around(cls, instant: float, *, days: float = 30, leaf_name: str = PAYPAL_NAME) -> Pki:
        middle = datetime.fromtimestamp(instant, UTC)
        return cls(middle - timedelta(days=days), middle + timedelta(days=days), leaf_name)

    @property
    def chain_pem(self) -> bytes:
        """What PayPal serves at the certificate URL: the signing certificate, then its issuer."""
        return pem(self.leaf, self.intermediate)

    @property
    def root_pem(self) -> bytes:
        return pem(self.root)

    def write_root(self, directory: Path) -> str:
        path = directory / "ca.pem"
        path.write_bytes(self.root_pem)
        return str(path)

    def tls_server(self, host: str = "localhost") -> tuple[bytes, bytes]:
        """A TLS server certificate chain and key (PEM) for ``host`` and 127.0.0.1, issued by this CA."""
        key = ec.generate_private_key(ec.SECP256R1())
        cert = issue(
            host,
            key,
            issuer=(self.intermediate, self.intermediate_key),
            valid_from=self.valid_from,
            valid_until=self.valid_until,
            san=[x509.DNSName(host), x509.IPAddress(IPv4Address("127.0.0.1"))],
            server=True,
        )
        key_pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        return pem(cert, self.intermediate), key_pem

    def sign(self, body: bytes, *, transmission_id: str, time: str, webhook_id: str) -> str:
        message = f"{transmission_id}|{time}|{webhook_id}|{zlib.crc32(body)}".encode()
        signature = self.leaf_key.sign(message, padding.PKCS1v15(), hashes.SHA256())
        return base64.b64encode(signature).decode()

    def headers(
        self,
        body: bytes,
        *,
        webhook_id: str,
        time: str,
        transmission_id: str = "69cd13f0-d67a-11e5-baa3-778b53f4ae55",
        url: str = CERT_URL,
    ) -> dict[str, str]:
        return {
            "PAYPAL-TRANSMISSION-ID": transmission_id,
            "PAYPAL-TRANSMISSION-TIME": time,
            "PAYPAL-TRANSMISSION-SIG": self.sign(
                body, transmission_id=transmission_id, time=time, webhook_id=webhook_id
            ),
            "PAYPAL-CERT-URL": url,
            "PAYPAL-AUTH-ALGO": "SHA256withRSA",
        }


class MemoryFetcher:
    """Serves certificate chains by URL from a dict and counts every fetch."""

    def __init__(self, served: dict[str, bytes]) -> None:
        self.served = served
        self.calls: list[str] = []

    async def __call__(self, url: str) -> bytes:
        self.calls.append(url)
        if url not in self.served:
            raise OSError("HTTP 404")
        return self.served[url]


Fetcher = Callable[[str], Awaitable[bytes]]


def iso(instant: float) -> str:
    """PayPal's ``PAYPAL-TRANSMISSION-TIME`` format."""
    return datetime.fromtimestamp(instant, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

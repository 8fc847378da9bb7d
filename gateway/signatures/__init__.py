"""Webhook signature schemes: one module per provider behind the ``Scheme`` interface.

Imports nothing else of the project. The gateway builds one scheme per configured source with
``build_scheme`` and calls ``verify`` on the raw bytes of every delivery; ``effectgate send`` calls
``sign``, the other half, which every scheme but PayPal's implements.
"""

from .base import (
    BODY_ID_PREFIX,
    CertificateFetchLimited,
    CertificateUntrusted,
    ConfirmationFailed,
    ConfirmationUnavailable,
    Covers,
    Event,
    PayloadError,
    ReplayMemory,
    Scheme,
    SchemeConfigError,
    SignatureError,
    SignatureInvalid,
    SignatureMalformed,
    SignatureMissing,
    Signed,
    Signer,
    SigningError,
    TimestampOutOfTolerance,
    TransmissionReused,
    UnsupportedSignatureVersion,
    VerificationError,
    Verified,
    body_event_id,
)
from .registry import SCHEMES, build_scheme, covers_of

__all__ = [
    "BODY_ID_PREFIX",
    "SCHEMES",
    "CertificateFetchLimited",
    "CertificateUntrusted",
    "ConfirmationFailed",
    "ConfirmationUnavailable",
    "Covers",
    "Event",
    "PayloadError",
    "ReplayMemory",
    "Scheme",
    "SchemeConfigError",
    "SignatureError",
    "SignatureInvalid",
    "SignatureMalformed",
    "SignatureMissing",
    "Signed",
    "Signer",
    "SigningError",
    "TimestampOutOfTolerance",
    "TransmissionReused",
    "UnsupportedSignatureVersion",
    "VerificationError",
    "Verified",
    "body_event_id",
    "build_scheme",
    "covers_of",
]

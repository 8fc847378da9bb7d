import effectgate.gateway.signatures as signatures

DOCUMENTED = [
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


def test_all_is_exactly_the_documented_names() -> None:
    assert signatures.__all__ == DOCUMENTED


def test_every_exported_name_exists_and_belongs_to_the_package() -> None:
    for name in signatures.__all__:
        member = getattr(signatures, name)
        module = getattr(member, "__module__", "effectgate.gateway.signatures")
        assert module.startswith("effectgate.gateway.signatures"), name


def test_scheme_registry_names_are_the_documented_schemes() -> None:
    assert set(signatures.SCHEMES) == {
        "adyen",
        "paypal",
        "stripe",
        "github",
        "standard-webhooks",
        "shopify",
        "slack",
        "hmac",
        "twilio",
    }
    for name, cls in signatures.SCHEMES.items():
        assert cls.name == name

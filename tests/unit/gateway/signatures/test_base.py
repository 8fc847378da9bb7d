import dataclasses

import pytest

from effectgate.gateway.signatures import (
    CertificateFetchLimited,
    CertificateUntrusted,
    Event,
    PayloadError,
    SchemeConfigError,
    SignatureError,
    SignatureInvalid,
    SignatureMalformed,
    SignatureMissing,
    TimestampOutOfTolerance,
    UnsupportedSignatureVersion,
    VerificationError,
    Verified,
)

CODES = {
    SignatureMissing: "signature_missing",
    SignatureMalformed: "signature_malformed",
    SignatureInvalid: "signature_invalid",
    TimestampOutOfTolerance: "timestamp_out_of_tolerance",
    UnsupportedSignatureVersion: "signature_version_unsupported",
    CertificateUntrusted: "certificate_untrusted",
    CertificateFetchLimited: "certificate_fetch_limited",
}


@pytest.mark.parametrize(("cls", "code"), CODES.items())
def test_signature_errors_are_401_class_with_their_code(cls: type[SignatureError], code: str) -> None:
    error = cls("something specific")
    assert isinstance(error, SignatureError)
    assert isinstance(error, VerificationError)
    assert error.code == cls.code == code
    assert error.detail == str(error) == "something specific"


def test_payload_error_is_not_a_signature_error() -> None:
    error = PayloadError("x")
    assert isinstance(error, VerificationError)
    assert not isinstance(error, SignatureError)
    assert error.code == "malformed_payload"


def test_default_detail_is_the_first_docstring_line() -> None:
    assert (
        SignatureMissing().detail
        == "A header the scheme needs to authenticate the delivery is absent or empty."
    )
    assert SignatureInvalid().detail == "No presented signature matches any configured secret."


def test_config_error_is_a_value_error_and_not_a_verification_error() -> None:
    assert issubclass(SchemeConfigError, ValueError)
    assert not issubclass(SchemeConfigError, VerificationError)


def test_results_are_frozen() -> None:
    event = Event(id="e", type="t", payload={})
    verified = Verified(events=(event,), secret_index=0)
    assert verified.challenge is None
    assert verified.acknowledgement is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.id = "other"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        verified.secret_index = 1  # type: ignore[misc]

from typing import Any

import pytest

from effectgate.gateway.signatures import SCHEMES, SchemeConfigError, build_scheme
from tests.unit.gateway.signatures.signing import CASE_IDS, CASES, EVENT_BODY, NOW, Case

SECRET = "do-not-print-me-123"


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_build_scheme_gives_a_working_scheme_of_that_name(case: Case) -> None:
    scheme = case.build()
    assert type(scheme) is SCHEMES[case.name]
    assert scheme.name == case.name
    assert scheme.verify(EVENT_BODY, case.sign(EVENT_BODY), now=NOW).secret_index == 0


def test_unknown_scheme_is_refused_naming_it() -> None:
    with pytest.raises(SchemeConfigError, match="unknown scheme 'paypl'"):
        build_scheme("paypl", ["s"])


def test_unknown_option_is_refused_naming_it() -> None:
    with pytest.raises(SchemeConfigError, match=r"^allow_sha2: unknown option for scheme 'github'"):
        build_scheme("github", ["s"], options={"allow_sha2": True})
    with pytest.raises(SchemeConfigError, match=r"^header: unknown option for scheme 'stripe'"):
        build_scheme("stripe", ["s"], options={"header": "x"})


def test_tolerance_cannot_be_smuggled_in_as_an_option() -> None:
    with pytest.raises(SchemeConfigError, match=r"^tolerance"):
        build_scheme("stripe", ["s"], options={"tolerance": 5})


@pytest.mark.parametrize("name", ["github", "shopify", "twilio"])
def test_schemes_without_a_signed_timestamp_refuse_a_tolerance(name: str) -> None:
    options = {"url": "https://example.test/"} if name == "twilio" else {}
    with pytest.raises(SchemeConfigError, match=r"^tolerance: .* signs no timestamp"):
        build_scheme(name, ["s"], tolerance=300, options=options)
    build_scheme(name, ["s"], tolerance=None, options=options)


@pytest.mark.parametrize("tolerance", [0, -1, True, 1.5, "300"])
def test_tolerance_must_be_a_positive_integer(tolerance: Any) -> None:
    with pytest.raises(SchemeConfigError, match=r"^tolerance"):
        build_scheme("stripe", ["s"], tolerance=tolerance)


def test_custom_tolerance_is_used() -> None:
    case = CASES[0]
    scheme = build_scheme("stripe", [case.secret], tolerance=10)
    scheme.verify(EVENT_BODY, case.sign(EVENT_BODY), now=NOW + 10)
    with pytest.raises(Exception, match="11 s in the past; tolerance is 10 s"):
        scheme.verify(EVENT_BODY, case.sign(EVENT_BODY), now=NOW + 11)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
@pytest.mark.parametrize(
    ("secrets", "message"),
    [
        ([], r"^secrets: at least one secret is required"),
        ([""], r"^secrets\[0\]: empty secret"),
        ([SECRET, ""], r"^secrets\[1\]: empty secret"),
        ([SECRET + "\n"], r"^secrets\[0\]: secret has leading or trailing whitespace"),
        (SECRET, r"^secrets: expected a list of strings"),
        ([SECRET.encode()], r"^secrets\[0\]: expected a string, got bytes"),
    ],
)
def test_bad_secrets_are_refused_at_construction(case: Case, secrets: Any, message: str) -> None:
    with pytest.raises(SchemeConfigError, match=message) as caught:
        build_scheme(case.name, secrets, options=case.options)
    assert SECRET not in str(caught.value)


def test_allow_sha1_must_be_a_real_boolean() -> None:
    with pytest.raises(SchemeConfigError, match=r"^allow_sha1: expected true or false"):
        build_scheme("github", ["s"], options={"allow_sha1": "false"})


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_repr_shows_no_secret(case: Case) -> None:
    scheme = case.build()
    assert repr(scheme) == f"<{type(scheme).__name__} scheme={case.name!r}>"
    assert case.secret not in repr(scheme)

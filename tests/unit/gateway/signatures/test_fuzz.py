"""Whatever arrives, ``verify`` returns ``Verified`` or raises a ``VerificationError``; nothing else."""

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from effectgate.gateway.signatures import SignatureError, VerificationError, Verified
from tests.unit.gateway.signatures.signing import CASE_IDS, CASES, NOW, Case

FUZZ = settings(max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
# The signed-request properties start past the header parsing, so fewer examples reach as far.
FUZZ_SIGNED = settings(FUZZ, max_examples=100)

# Any code point, lone surrogates included: a hand-built mapping may carry what Starlette never would.
ANY_TEXT = st.text(st.characters(exclude_categories=()), max_size=80)
# Pieces of real headers, so values get past the first split often enough to reach the deeper code.
FRAGMENTS = st.sampled_from(
    [
        "t=",
        "v1=",
        "v0=",
        "v1,",
        "v1a,",
        "v2,",
        "sha256=",
        "sha1=",
        "=",
        ",",
        " ",
        "\t",
        "1700000000",
        "0",
        "-1",
        "nan",
        "1e9",
        "9" * 30,
        "a" * 64,
        "A" * 40,
        "é",
        "g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
        "YWJj",
        "==",
        "%",
        "\x00",
        "\udc80",
        "application/json",
        "whsec_",
        "msg_1",
    ]
)
STRUCTURED = st.lists(FRAGMENTS, max_size=8).map("".join)
VALUES = st.one_of(ANY_TEXT, STRUCTURED)
JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=12,
)
BODIES = st.one_of(
    st.binary(max_size=300),
    JSONISH.map(lambda doc: json.dumps(doc).encode()),
    st.fixed_dictionaries(
        {},
        optional={
            "id": st.text(max_size=5) | st.integers(),
            "type": st.text(max_size=5) | st.none(),
            "event_id": st.text(max_size=5),
            "event": st.fixed_dictionaries({}, optional={"type": st.text(max_size=5)}),
            "challenge": st.text(max_size=5) | st.integers(),
            "action": st.text(max_size=5) | st.integers(),
        },
    ).map(lambda doc: json.dumps(doc).encode()),
)
CLOCKS = st.none() | st.just(float(NOW)) | st.floats(allow_nan=True, allow_infinity=True)


def headers_for(case: Case) -> st.SearchStrategy[dict[str, str]]:
    names = st.sampled_from([*case.headers, *(name.upper() for name in case.headers)]) | ANY_TEXT
    return st.dictionaries(names, VALUES, max_size=6)


def outcome(
    case: Case, body: bytes, headers: dict[str, Any], now: float | None
) -> VerificationError | Verified:
    try:
        return case.build().verify(body, headers, now=now)
    except VerificationError as exc:
        assert exc.code and isinstance(exc.detail, str)
        return exc


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_garbage_headers(case: Case) -> None:
    @FUZZ
    @given(body=BODIES, headers=headers_for(case), now=CLOCKS)
    def run(body: bytes, headers: dict[str, str], now: float | None) -> None:
        outcome(case, body, headers, now)

    run()


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_one_header_of_a_signed_request_spliced_with_garbage(case: Case) -> None:
    @FUZZ_SIGNED
    @given(body=BODIES, name=st.sampled_from(case.headers), garbage=VALUES, data=st.data())
    def run(body: bytes, name: str, garbage: str, data: st.DataObject) -> None:
        signed = case.sign(body)
        original = signed.get(name, "")
        # Splicing into the genuine value keeps most of its structure, reaching the timestamp and MAC.
        start = data.draw(st.integers(0, len(original)))
        end = data.draw(st.integers(start, len(original)))
        outcome(case, body, {**signed, name: original[:start] + garbage + original[end:]}, NOW)

    run()


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_a_correctly_signed_body_is_never_a_signature_error(case: Case) -> None:
    @FUZZ_SIGNED
    @given(body=BODIES, extra=st.dictionaries(ANY_TEXT, VALUES, max_size=3))
    def run(body: bytes, extra: dict[str, str]) -> None:
        signed = case.sign(body)
        taken = {name.lower() for name in signed}
        # An extra header that lowercases onto a signed one would legitimately shadow it.
        extra = {name: value for name, value in extra.items() if name.lower() not in taken}
        result = outcome(case, body, {**signed, **extra}, NOW)
        assert not isinstance(result, SignatureError), result

    run()

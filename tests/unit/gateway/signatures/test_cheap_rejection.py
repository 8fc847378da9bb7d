"""A failed verification costs what a verified one does, whatever the body: counted, never timed.

The attack: a 256 KiB JSON body under a wrong signature. Before the diagnosis was deferred, each such
request parsed the body and matched ten re-serialisations of it against every secret on the event loop.
"""

from __future__ import annotations

import hmac
import json
from typing import Any

import pytest

from effectgate.gateway.signatures import SignatureInvalid, _common, _matching
from tests.unit.gateway.signatures.signing import CASE_IDS, CASES, Case

NOW = 1_700_000_000


def big_json(size: int = 256 * 1024) -> bytes:
    """A JSON event of ``size`` bytes or just under it (by default the largest the old diagnosis parsed)."""
    document: dict[str, Any] = {
        "id": "evt_1",
        "type": "thing.happened",
        "event_id": "Ev1",
        "event": {"type": "message"},
        "event_type": "THING.HAPPENED",
        "items": [],
    }
    item = {"n": 1, "name": "Zoë", "tags": ["a", "b"]}
    step = len(json.dumps(item, ensure_ascii=False, separators=(",", ":")).encode()) + 1
    document["items"] = [item] * ((size - 300) // step)
    body = json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()
    assert size - 1024 < len(body) <= size
    return body


class Work:
    """Counts what verification does: HMACs computed, bytes they covered, bodies re-serialised."""

    def __init__(self) -> None:
        self.hmacs = 0
        self.hmac_bytes = 0
        self.reencodings = 0

    def digest(self, key: bytes, message: bytes, digest: str) -> bytes:
        self.hmacs += 1
        self.hmac_bytes += len(message)
        return hmac.digest(key, message, digest)

    compare_digest = staticmethod(hmac.compare_digest)


@pytest.fixture
def work(monkeypatch: pytest.MonkeyPatch) -> Work:
    counted = Work()
    monkeypatch.setattr(_common, "hmac", counted)
    monkeypatch.setattr(_matching, "hmac", counted)
    original = _matching.reencodings

    def reencodings(body: bytes) -> Any:
        counted.reencodings += 1
        return original(body)

    monkeypatch.setattr(_matching, "reencodings", reencodings)
    return counted


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_a_failed_256_kib_json_body_costs_one_matching_pass_like_random_bytes(case: Case, work: Work) -> None:
    body = big_json()
    noise = bytes(range(256)) * (len(body) // 256) + b"\xff" * (len(body) % 256)
    scheme = case.build()
    forged = case.sign(body.replace(b'"evt_1"', b'"evt_2"'))
    forged_noise = case.sign(noise.replace(b"\x00", b"\x01", 1))

    work.hmacs = work.hmac_bytes = 0
    with pytest.raises(SignatureInvalid) as caught:
        scheme.verify(body, forged, now=NOW)
    json_work = (work.hmacs, work.hmac_bytes, work.reencodings)

    work.hmacs = work.hmac_bytes = 0
    with pytest.raises(SignatureInvalid):
        scheme.verify(noise, forged_noise, now=NOW)
    # JSON buys an attacker nothing over random bytes of the same size, and nothing is re-serialised.
    assert json_work == (work.hmacs, work.hmac_bytes, 0)
    # One matching pass: the one secret against each message the scheme signs (Twilio signs its URL in up
    # to three spellings; every other HMAC scheme one message; PayPal none, it checks RSA over a CRC).
    assert work.hmacs <= 3

    # Past the diagnosis's size cap nothing is even offered for later.
    assert caught.value.diagnose is None


def test_the_deferred_diagnosis_is_bounded_in_variants_and_body_size(work: Work) -> None:
    case = CASES[0]
    body = big_json(_matching.DIAGNOSE_MAX_BYTES)
    with pytest.raises(SignatureInvalid) as caught:
        case.build("whsec_a", "whsec_b").verify(body, case.sign(b"{}"), now=NOW)
    assert caught.value.diagnose is not None
    work.hmacs = 0
    caught.value.diagnose()
    # At most ten re-serialised forms, each against each of the two secrets.
    assert work.hmacs <= 10 * 2

    oversized = body + b" " * (_matching.DIAGNOSE_MAX_BYTES - len(body) + 1)
    with pytest.raises(SignatureInvalid) as caught:
        case.build().verify(oversized, case.sign(b"{}"), now=NOW)
    assert caught.value.diagnose is None
    # Nor for what cannot be a JSON document: it would take a sample's place for nothing.
    with pytest.raises(SignatureInvalid) as caught:
        case.build().verify(b"not json", case.sign(b"{}"), now=NOW)
    assert caught.value.diagnose is None
    assert work.reencodings == 1

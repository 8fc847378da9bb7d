"""Matching, shared by every scheme: every configured secret against every presented signature (at most
``MAX_PRESENTED_SIGNATURES``), and, when nothing matched, the deferred diagnosis of a body a proxy
re-encoded, bounded and run off the event loop by whoever takes the failure.
"""

from __future__ import annotations

import functools
import hmac
import json
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from .base import SignatureInvalid, SignatureMalformed

# The re-encoding diagnosis costs a JSON parse and ten re-serialisations, each matched against every
# secret. It never runs while answering (see ``require_match``), but the worker thread that runs it shares
# the GIL with the event loop, and json's C encoder holds the GIL for a whole document: measured with
# tests.bench.reject_cost, diagnosing 250 KB bodies twice a minute raised genuine p99 4x over a random-bytes
# flood. Providers' events are a few KB; past this size the diagnosis is skipped.
DIAGNOSE_MAX_BYTES = 64 * 1024
REENCODED_HINT = (
    "the body appears re-encoded in transit: a re-serialised form of its JSON would have matched, so "
    "something between the provider and the gateway parses and rewrites JSON"
)
# Providers send one signature, or a few during a key rotation. Each presented signature costs a full
# verification (an Ed25519 check hashes the whole body), so an unauthenticated sender must not be able
# to present thousands of them and stall the event loop.
MAX_PRESENTED_SIGNATURES = 8
# What a JSON object or array starts with: the only bodies a re-encoding proxy rewrites.
_JSON_START = re.compile(rb"\s*[\[{]")
Matcher = Callable[[bytes], int | None]
"""Given a candidate body, the index of the configured secret that authenticates it, or None."""


def hmac_matcher(
    keys: Sequence[bytes | None],
    digest: str,
    presented: Sequence[bytes],
    message_for: Callable[[bytes], bytes],
) -> Matcher:
    """A matcher trying every key (None entries are not HMAC keys) against every presented digest."""

    def match(body: bytes) -> int | None:
        return hmac_index(keys, digest, presented, (message_for(body),))

    return match


def hmac_index(
    keys: Sequence[bytes | None], digest: str, presented: Sequence[bytes], messages: Sequence[bytes]
) -> int | None:
    """The index of the first key whose MAC of any of ``messages`` equals any presented digest."""
    for index, key in enumerate(keys):
        if key is None:
            continue
        for message in messages:
            expected = hmac.digest(key, message, digest)
            for candidate in presented:
                if hmac.compare_digest(expected, candidate):
                    return index
    return None


def require_match(body: bytes, match: Matcher, *, secrets: int, signatures: int) -> int:
    """The index of the secret that authenticates ``body``; SignatureInvalid when none does.

    More than ``MAX_PRESENTED_SIGNATURES`` signatures are refused before any is checked."""
    if signatures > MAX_PRESENTED_SIGNATURES:
        raise SignatureMalformed(
            f"{signatures} signatures presented; at most {MAX_PRESENTED_SIGNATURES} are accepted"
        )
    index = match(body)
    if index is not None:
        return index
    failure = SignatureInvalid(
        f"none of the {signatures} presented signature(s) matches any of the {secrets} configured secret(s)"
    )
    # A failed request costs what a verified one does: one match. Whether a re-encoded form would have
    # matched is for the operator, found later, sampled and off the event loop, by whoever calls this;
    # a body that cannot be a diagnosable JSON document is not offered, so it takes no sample's place.
    if len(body) <= DIAGNOSE_MAX_BYTES and _JSON_START.match(body):
        failure.diagnose = functools.partial(diagnose_reencoding, body, match)
    raise failure


def diagnose_reencoding(body: bytes, match: Matcher) -> str | None:
    """``REENCODED_HINT`` when a re-serialised form of the JSON ``body`` matches, else None; never raises.

    Bounded: bodies over ``DIAGNOSE_MAX_BYTES`` are not parsed, and at most ten forms are tried.
    """
    try:
        if any(match(candidate) is not None for candidate in reencodings(body)):
            return REENCODED_HINT
    except Exception:
        # A matcher is written for the bytes of a request; a re-serialised form must not make it a crash.
        return None
    return None


def reencodings(body: bytes) -> Iterator[bytes]:
    """Plausible originals of a JSON body that a proxy re-serialised: common ``json.dumps`` forms."""
    if len(body) > DIAGNOSE_MAX_BYTES:
        return
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):
        return
    seen = {body}
    forms: list[dict[str, Any]] = [
        {"separators": separators, "sort_keys": sort_keys}
        for separators in ((", ", ": "), (",", ":"))
        for sort_keys in (False, True)
    ]
    # Stripe and others send indented JSON, which a compacting proxy flattens.
    forms += [{"indent": 2, "separators": (",", ": ")}]
    for form in forms:
        for ensure_ascii in (True, False):
            try:
                candidate = json.dumps(document, ensure_ascii=ensure_ascii, **form).encode("utf-8")
            except (ValueError, RecursionError):
                continue
            if candidate not in seen:
                seen.add(candidate)
                yield candidate

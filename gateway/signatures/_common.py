"""The parts every scheme shares, so each provider module only says what is particular to it.

Construction: secrets, tolerance and option checking. Reading a request: header lookup, strict
timestamp and digest parsing. Events: JSON body to ``Event``. Matching (every configured secret
against every presented signature, and the deferred re-encoded-body diagnosis when nothing matched) is
``_matching.py``.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import math
import re
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar
from urllib.parse import SplitResult, urlsplit

from .base import (
    JSON_CONTENT_TYPE,
    Covers,
    Event,
    PayloadError,
    ReplayMemory,
    SchemeConfigError,
    SignatureMalformed,
    SignatureMissing,
    Signed,
    SigningError,
    TimestampOutOfTolerance,
    Verified,
)

DEFAULT_TOLERANCE = 300

# Seconds since 1970 fit in 11 digits for the next 1,000 years; the cap keeps int() away from
# arbitrarily long digit strings (which it refuses past 4,300 digits with a ValueError).
_MAX_TIMESTAMP_DIGITS = 18

_HEX = re.compile(r"[0-9a-fA-F]+")
# What a version or algorithm label looks like; anything else is not echoed into an error detail.
_LABEL = re.compile(r"[A-Za-z0-9_.-]{1,16}")
_MAX_LABELS = 5
_BASE64 = re.compile(r"[A-Za-z0-9+/]+={0,2}")

Headers = dict[str, str]


class SchemeBase:
    """Normalises headers and the clock once, so ``_verify`` sees lowercase names and a float ``now``."""

    name: ClassVar[str]
    # What the provider's signature covers; a class default, or set per instance where options decide it.
    covers: Covers

    def verify(self, body: bytes, headers: Mapping[str, str], *, now: float | None = None) -> Verified:
        """Authenticate one delivery and extract its events; see ``Scheme.verify``."""
        clock = time.time() if now is None else now
        return self._verify(body, lower_headers(headers), clock)

    async def prepare(
        self, body: bytes, headers: Mapping[str, str], *, now: float | None = None, client: str | None = None
    ) -> None:
        """Nothing to fetch: verification needs only the configured secrets. See ``Scheme.prepare``."""
        return None

    async def confirm(
        self,
        verified: Verified,
        body: bytes,
        headers: Mapping[str, str],
        *,
        source: str,
        memory: ReplayMemory,
        now: float | None = None,
    ) -> None:
        """Nothing to confirm: the signature covers the body cryptographically. See ``Scheme.confirm``."""
        return None

    def _verify(self, body: bytes, headers: Headers, now: float) -> Verified:
        raise NotImplementedError

    def sign(
        self,
        body: bytes,
        *,
        event_id: str | None = None,
        event_type: str | None = None,
        content_type: str = JSON_CONTENT_TYPE,
        signing_key: str | None = None,
        now: float | None = None,
    ) -> Signed:
        """Sign ``body`` as the provider would, with the first configured secret; see ``Signer``."""
        clock = time.time() if now is None else now
        if not math.isfinite(clock):
            raise SigningError("now: the clock reading is not a finite number")
        for name, value in (("event_id", event_id), ("event_type", event_type)):
            # Both may travel in a header, which carries printable ASCII only: refused here, not by HTTP.
            if value is not None and not (value and value.isascii() and value.isprintable()):
                raise SigningError(f"{name}: expected non-empty printable ASCII text")
        request = SigningRequest(body, event_id, event_type, content_type, signing_key, int(clock))
        if signing_key is not None and not self._takes_signing_key():
            raise SigningError(
                f"signing_key: scheme {self.name!r} signs with its configured secret; a separate signing "
                "key is only for a standard-webhooks source configured with a whpk_ public key"
            )
        body, headers = self._sign(request)
        return Signed(body=body, headers={**headers, "Content-Type": content_type})

    def _takes_signing_key(self) -> bool:
        return False

    def _sign(self, request: SigningRequest) -> tuple[bytes, Headers]:
        raise SigningError(f"scheme {self.name!r} cannot be signed locally")

    def __repr__(self) -> str:
        # The default repr would be harmless, but a subclass adding a dataclass-style repr would not be.
        return f"<{type(self).__name__} scheme={self.name!r}>"


@dataclass(frozen=True, slots=True)
class SigningRequest:
    """What ``SchemeBase.sign`` hands a scheme's ``_sign``: the inputs, with the clock read once."""

    body: bytes
    event_id: str | None
    event_type: str | None
    content_type: str
    signing_key: str | None
    timestamp: int

    def id_or_fresh(self, prefix: str = "") -> str:
        """The given event id, or a fresh one (as a provider's new delivery carries)."""
        return self.event_id if self.event_id is not None else f"{prefix}{uuid.uuid4()}"

    def require_type(self, header: str) -> str:
        """The given event type; SigningError when the scheme sends it in ``header`` and none was given."""
        if not self.event_type:
            raise SigningError(f"event_type: required, this scheme sends the event type in {header}")
        return self.event_type


def hex_hmac(key: bytes, message: bytes, digest: str = "sha256") -> str:
    """The hex HMAC of ``message``: what most providers put in a signature header."""
    return hmac.digest(key, message, digest).hex()


def b64_hmac(key: bytes, message: bytes, digest: str = "sha256") -> str:
    """The base64 HMAC of ``message``: Shopify's, Twilio's, Standard Webhooks' and Adyen's form."""
    return base64.b64encode(hmac.digest(key, message, digest)).decode("ascii")


def as_key(secret: str | bytes) -> bytes:
    """A secret used verbatim as an HMAC key: UTF-8 when given as text."""
    return secret.encode("utf-8") if isinstance(secret, str) else secret


# --- construction -------------------------------------------------------------------------------


def secret_strings(secrets: Sequence[str], *, option: str = "secrets") -> tuple[str, ...]:
    """Check the configured secrets and return them as a tuple, in configured order."""
    if isinstance(secrets, str | bytes) or not isinstance(secrets, Sequence):
        # A bare string is a Sequence too; iterating it would configure one secret per character.
        raise SchemeConfigError(f"{option}: expected a list of strings")
    if not secrets:
        raise SchemeConfigError(f"{option}: at least one secret is required")
    for index, secret in enumerate(secrets):
        if not isinstance(secret, str):
            raise SchemeConfigError(f"{option}[{index}]: expected a string, got {type(secret).__name__}")
        if not secret:
            raise SchemeConfigError(f"{option}[{index}]: empty secret")
        if secret != secret.strip():
            # Almost always a newline carried over from an env file; it would silently never match.
            raise SchemeConfigError(f"{option}[{index}]: secret has leading or trailing whitespace")
    return tuple(secrets)


def utf8_keys(secrets: Sequence[str]) -> tuple[bytes, ...]:
    """Secrets used verbatim as HMAC keys, the way Stripe, GitHub, Shopify, Slack and Twilio use them."""
    return tuple(secret.encode("utf-8") for secret in secret_strings(secrets))


def resolve_tolerance(tolerance: int | None) -> int:
    """The tolerance in seconds: the default when None, otherwise a positive integer."""
    if tolerance is None:
        return DEFAULT_TOLERANCE
    if isinstance(tolerance, bool) or not isinstance(tolerance, int) or tolerance <= 0:
        raise SchemeConfigError(f"tolerance: expected a positive number of seconds, got {tolerance!r}")
    return tolerance


def option_str(option: str, value: object, *, default: str | None = None) -> str | None:
    """A string option: ``default`` when None, else a non-empty string."""
    if value is None:
        return default
    if not isinstance(value, str) or not value:
        raise SchemeConfigError(f"{option}: expected a non-empty string, got {value!r}")
    return value


def option_choice(option: str, value: object, choices: Sequence[str], *, default: str) -> str:
    """A string option restricted to ``choices``."""
    if value is None:
        return default
    if value not in choices:
        raise SchemeConfigError(f"{option}: expected one of {', '.join(choices)}, got {value!r}")
    return str(value)


def option_bool(option: str, value: object) -> bool:
    """A boolean option; strings such as "false" are refused rather than read as true."""
    if not isinstance(value, bool):
        raise SchemeConfigError(f"{option}: expected true or false, got {value!r}")
    return value


# --- reading a request --------------------------------------------------------------------------


def https_url_parts(value: object) -> SplitResult | None:
    """``value`` split as an https URL with a host, no user info, no query or fragment and a numeric port (if
    any); None when it is anything else. Callers add what their kind of URL also demands of the path."""
    try:
        parts = urlsplit(value) if isinstance(value, str) else None
        if parts is not None:
            parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        return None
    if (
        parts is None
        or parts.scheme != "https"
        or not parts.hostname
        or parts.username is not None
        or parts.query
        or parts.fragment
    ):
        return None
    return parts


def lower_headers(headers: Mapping[str, str]) -> Headers:
    """Header names lowercased; the first value wins, as with Starlette's ``Headers[...]``."""
    lowered: Headers = {}
    for key, value in headers.items():
        # Starlette only ever gives str; a hand-built mapping might not, and must not crash verify.
        if isinstance(key, str) and isinstance(value, str):
            lowered.setdefault(key.lower(), value)
    return lowered


def first_header(headers: Headers, *names: str) -> str | None:
    """The first value among ``names`` (display case, looked up lowercased) that is not blank, or None."""
    for name in names:
        value = headers.get(name.lower())
        if value and not value.isspace():
            return value
    return None


def require_header(headers: Headers, *names: str) -> str:
    """The first non-blank value among ``names``; SignatureMissing naming the first when none is set."""
    value = first_header(headers, *names)
    if value is None:
        raise SignatureMissing(f"{names[0]} header is missing or blank")
    return value


def parse_timestamp(raw: str, where: str) -> int:
    """Unix seconds from a strict decimal string; anything else (signs, spaces, NaN, floats) is malformed."""
    # isdigit() alone admits non-ASCII digits such as "١٢٣", which int() would then accept.
    if not (raw.isascii() and raw.isdigit()) or len(raw) > _MAX_TIMESTAMP_DIGITS:
        raise SignatureMalformed(f"{where}: timestamp is not a whole number of seconds")
    return int(raw)


def check_timestamp(timestamp: int, now: float, tolerance: int) -> None:
    """Refuse a signed timestamp further than ``tolerance`` seconds from ``now``, in either direction."""
    if not math.isfinite(now):
        # A NaN clock makes every comparison false, which would accept any timestamp: fail closed.
        raise TimestampOutOfTolerance("server clock reading is not a finite number")
    skew = now - timestamp
    if skew > tolerance:
        raise TimestampOutOfTolerance(
            f"timestamp is {skew:.0f} s in the past; tolerance is {tolerance} s (replay or clock skew)"
        )
    if -skew > tolerance:
        raise TimestampOutOfTolerance(
            f"timestamp is {-skew:.0f} s in the future; tolerance is {tolerance} s (clock skew)"
        )


def decode_digest(value: str, encoding: str, size: int) -> bytes | None:
    """A digest of ``size`` bytes from strict hex or padded base64, or None if it is not one."""
    if not value.isascii():
        return None
    if encoding == "hex":
        if len(value) != 2 * size or not _HEX.fullmatch(value):
            return None
        return bytes.fromhex(value)
    if not _BASE64.fullmatch(value) or len(value) % 4:
        return None
    try:
        decoded = base64.b64decode(value, validate=True)
    except binascii.Error:
        return None
    return decoded if len(decoded) == size else None


def decode_digests(values: Sequence[str], encoding: str, size: int, where: str) -> list[bytes]:
    """The well-formed digests among ``values``; SignatureMalformed when not one of them is.

    A stray malformed entry next to a good one is ignored, as providers' own libraries do, so a
    delivery is never refused for what it carries besides a valid signature.
    """
    digests = [digest for value in values if (digest := decode_digest(value, encoding, size)) is not None]
    if not digests:
        raise SignatureMalformed(f"{where}: no well-formed signature ({encoding}, {size} bytes) found")
    return digests


def describe_labels(labels: Iterable[str]) -> str:
    """The version or algorithm labels a request presented, quoted for an error detail.

    Only short plain tokens are shown, at most a few, so a detail can name the ``v2`` or ``sha512`` the
    sender used without echoing attacker-chosen text (or a signature pasted into the wrong place).
    """
    shown: list[str] = []
    hidden = 0
    for label in dict.fromkeys(labels):
        if _LABEL.fullmatch(label) and len(shown) < _MAX_LABELS:
            shown.append(repr(label))
        else:
            hidden += 1
    if hidden:
        shown.append(f"{hidden} other(s) not shown")
    return ", ".join(shown) or "none"


# --- events -------------------------------------------------------------------------------------


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _float(text: str) -> float | str:
    # A number past a double's range (1e400) would read as infinity, which no JSON store holds and which is not
    # what was sent: it reads as the text of the number, exactly as sent (docs/providers.md, "Payloads").
    value = float(text)
    return value if math.isfinite(value) else text


def _int(text: str) -> int | str:
    # Python refuses to read an integer of more than 4,300 digits (a guard against quadratic parsing): such a
    # number reads as its text, exactly as sent, rather than failing a signed delivery.
    try:
        return int(text)
    except ValueError:
        return text


# Made once: json.loads with an option builds a new decoder per call, and this runs on every delivery.
_DECODER = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_float, parse_int=_int)


def decode_json(text: str) -> Any:
    """The JSON document in ``text`` as every scheme reads a body: no NaN/Infinity, and a number Python cannot
    hold as sent (past a double's range, or over 4,300 digits) as its text. ``ValueError`` (or
    ``RecursionError``, nested past Python's limit) when it is not JSON."""
    if text.startswith("\ufeff"):
        # As json.loads refuses it (the decoder object alone would not).
        raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
    return _DECODER.decode(text)


def parse_json(body: bytes) -> Any:
    """The JSON document in ``body`` (strict UTF-8, no NaN/Infinity); PayloadError otherwise."""
    try:
        return decode_json(body.decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        # The decoder's message gives a position or a single byte, never the body, and helps whoever
        # debugs the sender.
        raise PayloadError(f"body is not valid JSON: {str(exc)[:120]}") from None


def json_field(document: Any, path: str) -> Any:
    """The value at a dotted ``path`` of nested objects, or None when any step is missing."""
    value = document
    for part in path.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def require_text(value: Any, what: str, *, allow_int: bool = False) -> str:
    """``value`` as a non-empty string (or an integer, for ids); PayloadError otherwise."""
    if allow_int and isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str) or not value:
        raise PayloadError(f"{what} is missing or not a non-empty string")
    return value


def event_from_json(body: bytes, *, id_path: str = "id", type_path: str = "type") -> Event:
    """The single event of a JSON body whose id and type are fields of the body."""
    document = parse_json(body)
    return Event(
        id=require_text(json_field(document, id_path), f"body field {id_path!r}", allow_int=True),
        type=require_text(json_field(document, type_path), f"body field {type_path!r}"),
        payload=document,
    )

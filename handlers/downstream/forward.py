"""Declared HTTP effects: an effect written in ``effectgate.toml`` that forwards the event to a service.

A declared effect is registered into the same ``Registry`` as a Python ``@effect``, as a kind whose handler
is ``forward``: ingress plans it (``handlers.plan``), the worker leases, retries and redrives it, reports and
the operator plane show it, exactly as any other kind. Its key and lock key come from templates of JSON
Pointers into the signed payload (``order-paid:{/data/object/metadata/order_id}``), so a declared identity
can never read a field the provider does not sign (docs/adr/0007).

One forward is one step (``ctx.step("forward", …)``): its ``Idempotency-Key`` is the step's key, the same
on every attempt and redrive, and a recorded answer is never asked for again. The request is signed with
the Standard Webhooks scheme (``webhook-id`` = the idempotency key, ``webhook-timestamp``,
``webhook-signature: v1,<base64 HMAC-SHA256 of "id.timestamp.body">``) so the receiving service verifies
it with an off-the-shelf library. Signing is a dozen lines of ``hmac`` here rather than a runtime
dependency on the ``standardwebhooks`` package; the tests check it against that package in Python and in
Node.

Answers, unless the effect configures ``retry_statuses``:

    2xx                                     → success; {status, body} recorded as the step's result
    RETRY_STATUSES, timeout, transport      → TransientError (backoff; Retry-After honoured)
    any other status (3xx included)         → TerminalError, code http_<status>, the answer in its message

Redirects are never followed (a 3xx is terminal: a moved endpoint is a configuration problem), and at most
``max_answer_bytes`` of an answer are read.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import httpx

from effectgate.ledger.pointers import JsonPointer, PointerMissing

from ..effect_kind import (
    DEFAULT_LEASE_TTL,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_ORPHAN_POLICY,
    EffectKind,
    KeySpace,
    OrphanPolicy,
)
from ..errors import TerminalError, TransientError
from ..event import Event
from ..registry import Registry
from . import RETRY_STATUSES, retry_after_seconds

if TYPE_CHECKING:
    from ..context import EffectContext

logger = logging.getLogger(__name__)

STEP_NAME = "forward"
DEFAULT_TIMEOUT = 10.0
DEFAULT_MAX_ANSWER_BYTES = 64 * 1024
#: How much of a refused answer goes into the recorded error message.
MAX_ERROR_ANSWER_CHARS = 2000
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
_SECRET_PREFIX = "whsec_"


class KeyTemplate:
    """A key built from literal text and ``{/json/pointer}`` placeholders into the signed payload.

    ``{{`` and ``}}`` are not supported: a brace outside a placeholder is refused at parse time, so a
    typo stops start-up. A placeholder must resolve to a non-empty string or an integer; anything else
    (missing, an object, a float, a boolean) fails the plan, and the delivery is answered 422
    ``effect_key_failed`` rather than claimed under a key nobody meant.
    """

    def __init__(self, text: str) -> None:
        if not isinstance(text, str) or not text:
            raise ValueError("must be a non-empty string")
        parts: list[str | JsonPointer] = []
        at = 0
        for match in _PLACEHOLDER.finditer(text):
            parts.append(text[at : match.start()])
            try:
                parts.append(JsonPointer.parse(match.group(1)))
            except ValueError as exc:
                raise ValueError(f"{text!r}: {exc}") from None
            at = match.end()
        parts.append(text[at:])
        literal = "".join(p for p in parts if isinstance(p, str))
        if "{" in literal or "}" in literal:
            raise ValueError(f"{text!r}: an unmatched '{{' or '}}'")
        if not any(isinstance(p, JsonPointer) for p in parts):
            raise ValueError(
                f"{text!r} names no field: every event would share one key; add a {{/json/pointer}}"
            )
        self.text = text
        self.parts = tuple(p for p in parts if p != "")

    def __repr__(self) -> str:
        return f"KeyTemplate({self.text!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, KeyTemplate) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)

    def render(self, payload: Any) -> str:
        """The key for ``payload``; ``ValueError`` names the placeholder that cannot be filled."""
        out = []
        for part in self.parts:
            if isinstance(part, str):
                out.append(part)
                continue
            try:
                value = part.resolve(payload)
            except PointerMissing:
                raise ValueError(f"key template {self.text!r}: no value at {part.text!r}") from None
            if isinstance(value, bool) or not isinstance(value, str | int) or value == "":
                raise ValueError(
                    f"key template {self.text!r}: the value at {part.text!r} must be a non-empty string "
                    f"or an integer, not {type(value).__name__}"
                )
            out.append(str(value))
        return "".join(out)


def decode_secret(secret: str) -> bytes:
    """The HMAC key of a Standard Webhooks secret: ``whsec_`` + base64 (the form every library takes).
    ``ValueError`` says what is wrong, never quoting the secret."""
    body = secret.removeprefix(_SECRET_PREFIX)
    try:
        key = base64.b64decode(body, validate=True)
    except ValueError:
        raise ValueError(
            "must be 'whsec_' followed by base64 (as Standard Webhooks libraries take it)"
        ) from None
    if len(key) < 24:
        raise ValueError("must hold at least 24 bytes of key material")
    return key


def sign(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` header value for one request (Standard Webhooks ``v1``)."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(key, signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


@dataclass(frozen=True, slots=True)
class ForwardTarget:
    """Where a declared effect forwards to, validated at construction.

    ``url``: an absolute http(s) URL. ``timeout``: seconds for connect, each read and write. ``max_answer_bytes``:
    the most of an answer read (more is cut off and marked ``truncated``). ``secret``: the Standard Webhooks
    signing secret (``whsec_…``), ``None`` in a process that never forwards (the gateway); left out of
    ``repr``. ``retry_statuses``: the non-2xx statuses retried with backoff (``RETRY_STATUSES``, the API clients'); every
    other one is terminal.
    """

    url: str
    timeout: float = DEFAULT_TIMEOUT
    max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES
    secret: str | None = field(default=None, repr=False)
    retry_statuses: frozenset[int] = RETRY_STATUSES
    _key: bytes | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        parts = urlsplit(self.url) if isinstance(self.url, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"url must be an absolute http(s) URL, got {self.url!r}")
        if parts.fragment:
            raise ValueError("url must not carry a fragment")
        if (
            isinstance(self.timeout, bool)
            or not isinstance(self.timeout, int | float)
            or not math.isfinite(self.timeout)
            or self.timeout <= 0
        ):
            raise ValueError(f"timeout must be a finite number of seconds > 0, got {self.timeout!r}")
        if isinstance(self.max_answer_bytes, bool) or not isinstance(self.max_answer_bytes, int):
            raise ValueError(f"max_answer_bytes must be an integer, got {self.max_answer_bytes!r}")
        if self.max_answer_bytes < 1:
            raise ValueError(f"max_answer_bytes must be >= 1, got {self.max_answer_bytes}")
        bad = sorted(s for s in self.retry_statuses if not 300 <= s <= 599)
        if bad:
            raise ValueError(f"retry_statuses must be statuses from 300 to 599, got {bad}")
        if self.secret is not None:
            try:
                object.__setattr__(self, "_key", decode_secret(self.secret))
            except ValueError as exc:
                raise ValueError(f"secret {exc}") from None

    def signing_key(self) -> bytes:
        """The HMAC key; a process that loaded no secret cannot forward (a terminal configuration error)."""
        if self._key is None:
            raise TerminalError(
                f"forward to {self.url}: no signing secret in this process (a worker reads it)",
                code="forward_secret_missing",
            )
        return self._key


@dataclass(frozen=True, slots=True)
class DeclaredEffect:
    """One ``[effects.NAME]`` of the configuration: what to claim, and where to forward it."""

    name: str
    source: str
    events: tuple[str, ...]
    key: KeyTemplate
    forward: ForwardTarget
    fingerprint: tuple[str, ...] | None = None
    lock_key: KeyTemplate | None = None
    # Latest wins per object (docs/ordering.md): a JSON Pointer to a monotonic field of the signed payload.
    version: str | None = None
    key_space: KeySpace | None = None
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    orphan_policy: OrphanPolicy = DEFAULT_ORPHAN_POLICY
    lease_ttl: float = DEFAULT_LEASE_TTL
    # None: the worker's [worker] backoff_base / backoff_cap.
    backoff_base: float | None = None
    backoff_cap: float | None = None

    def kind(self) -> EffectKind:
        """The registry kind of this effect: key and lock key from the templates, the handler forwards."""
        return EffectKind(
            name=self.name,
            source=self.source,
            events=self.events,
            fn=Forward(self),
            # The templates read the payload only: signed material, whatever the provider leaves unsigned.
            key=_template_fn(self.key),
            lock_key=None if self.lock_key is None else _template_fn(self.lock_key),
            version=self.version,
            fingerprint=None if self.fingerprint is None else tuple(map(JsonPointer.parse, self.fingerprint)),
            key_space=self.key_space,
            max_attempts=self.max_attempts,
            orphan_policy=self.orphan_policy,
            lease_ttl=self.lease_ttl,
            backoff_base=self.backoff_base,
            backoff_cap=self.backoff_cap,
        )


class Forward:
    """The handler of a declared effect: forwards the event to its target (``forward_event``)."""

    def __init__(self, declared: DeclaredEffect) -> None:
        self.declared = declared

    def __repr__(self) -> str:
        return f"Forward({self.declared.name!r}, {self.declared.forward.url!r})"

    async def __call__(self, ctx: EffectContext, event: Event) -> Any:
        return await forward_event(ctx, event, self.declared.forward)


def _template_fn(template: KeyTemplate) -> Callable[[Event], str]:
    def render(event: Event) -> str:
        return template.render(event.payload)

    return render


def register_declared(registry: Registry, declared: DeclaredEffect) -> None:
    """Register ``declared``; once registered, again is a no-op (a process that loads its configuration
    twice), but a name another effect holds (a Python handler too) raises ``ValueError``."""
    existing = registry.get(declared.name)
    if existing is not None and isinstance(existing.fn, Forward) and existing.fn.declared == declared:
        return
    registry.register(declared.kind())


def request_body(ctx: EffectContext, event: Event) -> bytes:
    """What is forwarded: the event, and the effect's metadata (key, handler, attempt, tenant)."""
    document = {
        "event": {"id": event.id, "source": event.source, "type": event.type, "payload": event.payload},
        "effect": {
            "key": ctx.effect_key,
            "handler": ctx.handler,
            "attempt": ctx.attempt,
            "tenant": ctx.tenant,
        },
    }
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


async def forward_event(ctx: EffectContext, event: Event, target: ForwardTarget) -> Any:
    """Forward ``event`` to ``target`` as the step ``forward``; its recorded answer on a replay."""

    async def send(idempotency_key: str) -> dict[str, Any]:
        return await post_signed(ctx.http, target, idempotency_key, request_body(ctx, event))

    return await ctx.step(STEP_NAME, send)


async def post_signed(
    http: httpx.AsyncClient, target: ForwardTarget, idempotency_key: str, body: bytes
) -> dict[str, Any]:
    """POST ``body`` signed to ``target`` with ``idempotency_key``; the answer as the module docstring maps it."""
    timestamp = int(time.time())
    headers = {
        "Content-Type": "application/json",
        "Idempotency-Key": idempotency_key,
        "webhook-id": idempotency_key,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(target.signing_key(), idempotency_key, timestamp, body),
    }
    where = f"forward to {target.url}"
    try:
        async with http.stream(
            "POST",
            target.url,
            content=body,
            headers=headers,
            timeout=httpx.Timeout(target.timeout),
            # Never followed: a redirect could carry a signed effect to a host nobody configured.
            follow_redirects=False,
        ) as response:
            answer, truncated = await _read_capped(response, target.max_answer_bytes)
    except (httpx.TransportError, httpx.DecodingError) as exc:
        # The service may or may not have acted: only a retry with the same key can tell.
        raise TransientError(f"{where}: {type(exc).__name__}: {exc}") from exc
    status = response.status_code
    logger.debug("%s key=%s -> %d", where, idempotency_key, status)
    recorded = {"status": status, "body": _decode(answer), "truncated": truncated}
    if 200 <= status < 300:
        return recorded
    text = answer.decode("utf-8", "replace")[:MAX_ERROR_ANSWER_CHARS]
    detail = f"{where}: HTTP {status}: {text}"
    if status in target.retry_statuses:
        raise TransientError(detail, retry_after=retry_after_seconds(response.headers.get("Retry-After")))
    raise TerminalError(detail, code=f"http_{status}")


async def _read_capped(response: httpx.Response, cap: int) -> tuple[bytes, bool]:
    chunks = []
    size = 0
    async for chunk in response.aiter_bytes():
        chunks.append(chunk)
        size += len(chunk)
        if size > cap:
            # The rest is never read: an endless answer cannot hold the slice or the memory.
            return b"".join(chunks)[:cap], True
    return b"".join(chunks), False


def _decode(answer: bytes) -> Any:
    # Recorded as JSON when it is JSON, else as text: either way the ledger can store it.
    text = answer.decode("utf-8", "replace")
    try:
        return json.loads(text, parse_constant=_no_constant)
    except ValueError:
        return text


def _no_constant(name: str) -> Any:
    # NaN and Infinity are not JSON the ledger can store; such an answer is kept as text.
    raise ValueError(name)

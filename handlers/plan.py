"""The one place a verified event becomes effect requests: tenant, require, key, fingerprint, lock key,
version.

The ingress (``gateway/ingress/pipeline.py``) and the replay of unmatched deliveries (``handlers/actions/replay.py``) both
call ``plan_event``, so a delivery replayed later is claimed exactly as it would have been on arrival
(same key, same fingerprint, same lock key), and its genuine retry is then a duplicate.

Identity from signed material. A provider's signature may leave the event type unsigned (GitHub's
``X-GitHub-Delivery`` and ``X-GitHub-Event``, Shopify's topic; the gateway already replaced unsigned ids
with the signed body's digest). Key, lock-key, version and ``require`` functions therefore see a ``SignedView`` of
the event: reading ``delivery_id``, or ``type`` where it is unsigned, raises ``UnsignedField`` unless the
effect declared ``trust_unsigned=True``. ``check_identity`` finds such reads at start-up by reading the
functions' bytecode (attribute loads of ``type`` and ``delivery_id``), so most mistakes stop the process
before its first delivery; a read it cannot see (a function built at run time, an ``attrgetter``) still
meets the view and is answered 422 ``effect_key_failed``, never claimed under an unsigned identity.
Fingerprint pointers read the signed payload only, so they need no check.
"""

from __future__ import annotations

import dis
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import CodeType
from typing import Any

from effectgate.ledger.claims import EffectRequest
from effectgate.ledger.pointers import JsonPointer, PointerMissing

from .event import Event
from .registry import Registry

# Fields of ``Event`` a sender can change without breaking the signature (``type`` only where unsigned).
UNSIGNED_ALWAYS = frozenset({"delivery_id"})
MAX_TENANT_LENGTH = 200


class UnsignedField(AttributeError):
    """A key, lock-key or require function read an event field its provider does not sign."""

    def __init__(self, name: str) -> None:
        super().__init__(
            f"event.{name} is not covered by the signature (a replayer can rewrite it); derive keys from "
            "the signed payload, or declare the effect trust_unsigned=True"
        )
        self.field = name


class SignedView(Event):
    """The event as key, lock-key and ``require`` functions see it: ``delivery_id``, and ``type`` when
    the provider does not sign it, raise ``UnsignedField``. Everything else reads as on ``Event``."""

    __slots__ = ()

    def __getattribute__(self, name: str) -> Any:
        if name == "delivery_id" or (name == "type" and not object.__getattribute__(self, "type_signed")):
            raise UnsignedField(name)
        return object.__getattribute__(self, name)

    def __repr__(self) -> str:
        # The dataclass repr reads every field, the guarded ones included.
        return f"SignedView(source={self.source!r}, id={self.id!r}, tenant={self.tenant!r})"


def signed_view(event: Event) -> SignedView:
    """``event`` behind the guard described on ``SignedView``."""
    return SignedView(
        event.source, event.id, event.type, event.payload, event.tenant, event.delivery_id, event.type_signed
    )


class PlanFailed(Exception):
    """An effect's key, lock-key or require function failed for this event (the ingress answers 422)."""

    def __init__(self, kind: str, event_id: str, exc: BaseException) -> None:
        super().__init__(
            f"handler {kind!r} could not compute an effect or lock key for event {event_id!r}: "
            f"{type(exc).__name__}: {exc}"
        )
        self.kind = kind
        self.event_id = event_id
        self.error = exc


@dataclass(slots=True)
class EventPlan:
    """What one event asks for: the effects to claim, and the kinds that matched its type but whose
    ``require`` the signed payload did not meet (skipped: never claimed, never run)."""

    effects: list[EffectRequest] = field(default_factory=list)
    unmet: list[str] = field(default_factory=list)


def plan_event(registry: Registry, event: Event) -> EventPlan:
    """The effect requests ``event`` makes of ``registry``, with key, fingerprint and lock key decided here
    and nowhere else. Raises ``PlanFailed`` when a kind's function fails, so nothing of the event is claimed."""
    plan = EventPlan()
    guarded = signed_view(event)
    for kind in registry.match(event.source, event.type):
        seen = event if kind.trust_unsigned else guarded
        try:
            if not kind.requirement_met(seen):
                plan.unmet.append(kind.name)
                continue
            key = kind.effect_key(seen)
            lock_key = kind.lock_key_for(seen)
            # No object, no order: a delivery whose lock key function names none is claimed unversioned.
            version = kind.version_for(seen) if lock_key is not None else None
        except Exception as exc:
            raise PlanFailed(kind.name, event.id, exc) from exc
        plan.effects.append(
            EffectRequest(
                key,
                kind.name,
                kind.max_attempts,
                kind.orphan_policy,
                lock_key,
                fingerprint=kind.fingerprint_of(event),
                version=version,
            )
        )
    return plan


class TenantUnusable(Exception):
    """The event ``event_id`` names no usable or allowed tenant where the source's ``tenant_from`` points."""

    def __init__(self, code: str, event_id: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.event_id = event_id


@dataclass(frozen=True, slots=True)
class TenantRule:
    """How a source's events get their tenant: one static ``tenant``, or the string at ``tenant_from`` in
    the signed payload, accepted only when it is in ``allowed`` or matches ``pattern`` (whole string). A
    sender may name only the tenants its source was given; otherwise it could pre-claim the keys of
    another source's tenant."""

    tenant: str = "default"
    tenant_from: JsonPointer | None = None
    allowed: frozenset[str] | None = None
    pattern: re.Pattern[str] | None = None

    def tenant_of(self, event_id: str, payload: Any) -> str:
        """The tenant of the event ``event_id`` with ``payload``; ``TenantUnusable`` when there is none
        (``tenant_missing``), it cannot be a tenant (``tenant_invalid``) or the source does not allow it
        (``tenant_not_allowed``)."""
        if self.tenant_from is None:
            return self.tenant
        pointer = self.tenant_from.text
        try:
            tenant = self.tenant_from.resolve(payload)
        except PointerMissing:
            raise TenantUnusable(
                "tenant_missing", event_id, f"event {event_id!r} has no tenant at {pointer!r} (tenant_from)"
            ) from None
        if not isinstance(tenant, str) or not tenant:
            raise TenantUnusable(
                "tenant_missing",
                event_id,
                f"event {event_id!r}: the tenant at {pointer!r} must be a non-empty string, "
                f"not {type(tenant).__name__}",
            )
        # The tenant is part of every effect key and downstream idempotency key: no control characters
        # (the key derivation separates its parts with one), nothing unbounded.
        if len(tenant) > MAX_TENANT_LENGTH or not tenant.isprintable():
            raise TenantUnusable(
                "tenant_invalid",
                event_id,
                f"event {event_id!r}: the tenant at {pointer!r} must be printable and at most "
                f"{MAX_TENANT_LENGTH} characters",
            )
        if not self.allows(tenant):
            raise TenantUnusable(
                "tenant_not_allowed",
                event_id,
                f"event {event_id!r}: tenant {tenant[:64]!r} at {pointer!r} is not one this source allows "
                "(tenants / tenant_pattern)",
            )
        return tenant

    def allows(self, tenant: str) -> bool:
        """Whether ``tenant`` is in the allow-list or matches the pattern (no rule: every tenant)."""
        if self.allowed is None and self.pattern is None:
            return True
        if self.allowed is not None and tenant in self.allowed:
            return True
        return self.pattern is not None and self.pattern.fullmatch(tenant) is not None


def check_identity(registry: Registry, unsigned_by_source: Mapping[str, frozenset[str]]) -> list[str]:
    """Problems found before the first delivery: effects of a configured source whose key, lock-key or
    require function reads an event field the source's signature does not cover (``unsigned_by_source``:
    source name to the ``Event`` fields it leaves unsigned, such as ``{"type"}``), without
    ``trust_unsigned=True``. Each problem names the effect, the function and the field."""
    problems = []
    for kind in registry.kinds():
        unsigned = unsigned_by_source.get(kind.source)
        if unsigned is None or kind.trust_unsigned:
            continue
        guarded = UNSIGNED_ALWAYS | unsigned
        version_fn = kind.version if callable(kind.version) else None
        for role, fn in (
            ("key", kind.key),
            ("lock_key", kind.lock_key),
            ("require", kind.require_fn),
            ("version", version_fn),
        ):
            code = getattr(fn, "__code__", None)
            if not isinstance(code, CodeType):
                continue
            for name in sorted(guarded & set(_attributes_read(code))):
                problems.append(
                    f"effect {kind.name!r}: its {role} function reads event.{name}, which source "
                    f"{kind.source!r} does not sign (a replay can rewrite it); use signed payload fields, "
                    "or declare the effect trust_unsigned=True"
                )
    return problems


def check_key_spaces(registry: Registry, overlapping: Callable[[str, str], bool]) -> list[str]:
    """Problems found before the first delivery: effects of two sources that can reach one tenant
    (``overlapping(a, b)``; false for a source that is not configured) both building keys with a key
    function and neither declaring a ``key_space``. Their keys could collide: one source's events could
    claim first a key the other's effect needs."""
    undeclared: dict[str, list[str]] = {}
    for kind in registry.kinds():
        if kind.key is not None and kind.key_space is None:
            undeclared.setdefault(kind.source, []).append(kind.name)
    problems = []
    sources = sorted(undeclared)
    for i, a in enumerate(sources):
        for b in sources[i + 1 :]:
            if overlapping(a, b):
                problems.append(
                    f"effects {', '.join(map(repr, undeclared[a]))} (source {a!r}) and "
                    f"{', '.join(map(repr, undeclared[b]))} (source {b!r}) build their own keys in a tenant "
                    "both sources reach, so one source's events could claim the other's keys; declare "
                    'key_space="source" (keys under the source: new keys) or key_space="shared" (keys as '
                    "they are, shared on purpose) on each"
                )
    return problems


def _attributes_read(code: CodeType) -> Iterator[str]:
    # Attribute loads, method loads included, in the function and every function nested in it.
    for instruction in dis.get_instructions(code):
        if instruction.opname in ("LOAD_ATTR", "LOAD_METHOD") and isinstance(instruction.argval, str):
            yield instruction.argval
    for const in code.co_consts:
        if isinstance(const, CodeType):
            yield from _attributes_read(const)

"""Start-up checks of the registered effects against the configuration, each at the user's file and line.

Refused (``problems``): a declaration ``@effect`` recorded as mistaken while the modules were imported
(bad arguments, a plain ``def`` handler, a name registered twice), and an effect naming a source the
configuration does not have (it would never fire: every delivery for it is ``unmatched``). Warned
(``warnings``): an event pattern that can never match a type of its source's scheme, where the scheme's
types have a known shape (Stripe's ``payment_intent.succeeded``, Shopify's ``orders/paid``, …). The shapes
are what each provider documents for its type names: a new type of the right shape passes here, and the
providers' published catalogues are checked apart (``event_catalogue``).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from effectgate.handlers.registry import EffectKind, Mistake, Registry

from ..examples import EXAMPLE_TYPES


@dataclass(frozen=True, slots=True)
class TypeShape:
    """What every event type of one scheme looks like: the whole-type pattern, and the characters a
    type can hold (checked for a pattern with wildcards, whose literal parts must all be possible)."""

    pattern: re.Pattern[str]
    alphabet: frozenset[str]
    described: str


def _shape(pattern: str, alphabet: str, described: str) -> TypeShape:
    return TypeShape(re.compile(pattern), frozenset(alphabet), described)


_LOWER = "abcdefghijklmnopqrstuvwxyz"
_UPPER = _LOWER.upper()
_DIGITS = "0123456789"

# Schemes whose types are free-form (Standard Webhooks, generic HMAC) or mixed (Twilio's status words
# and its dotted event types) have no entry: nothing can be said about a pattern for them.
TYPE_SHAPES: Mapping[str, TypeShape] = {
    "stripe": _shape(
        r"[a-z0-9_]+(\.[a-z0-9_]+)+", _LOWER + _DIGITS + "_.", "lower-case words joined by dots"
    ),
    "github": _shape(
        r"[a-z0-9_]+(\.[a-z0-9_]+)?",  # digits too: projects_v2, projects_v2_item
        _LOWER + _DIGITS + "_.",
        "the X-GitHub-Event name, optionally a dot and the body's action",
    ),
    "shopify": _shape(r"[a-z_]+(/[a-z_]+)+", _LOWER + "_/", "lower-case topics with a slash"),
    "slack": _shape(r"[a-z_]+", _LOWER + "_", "lower-case words joined by underscores"),
    # Hyphens too: CHECKOUT.PAYMENT-APPROVAL.REVERSED, BILLING.SUBSCRIPTION.RE-ACTIVATED.
    "paypal": _shape(r"[A-Z_-]+(\.[A-Z_-]+)+", _UPPER + "_.-", "upper-case words joined by dots"),
    "adyen": _shape(r"[A-Z_]+", _UPPER + "_", "upper-case event codes"),
}

_WILDCARD_CLASS = re.compile(r"\[[^\]]*\]")


def pattern_can_match(shape: TypeShape, pattern: str) -> bool:
    """Whether ``pattern`` (an ``fnmatch`` pattern, as ``events`` takes) can match some type of ``shape``:
    a literal pattern must have the shape; one with wildcards may only hold the shape's characters."""
    if not any(c in pattern for c in "*?["):
        return shape.pattern.fullmatch(pattern) is not None
    literal = _WILDCARD_CLASS.sub("", pattern).replace("*", "").replace("?", "")
    return all(c in shape.alphabet for c in literal)


def _at(kind: EffectKind) -> str:
    return kind.defined_at or f"effect {kind.name!r}"


def problems(
    registry: Registry,
    mistakes: Sequence[Mistake],
    sources: Mapping[str, str],
    skip_sources: Collection[str] = (),
) -> list[str]:
    """Every mistaken declaration recorded while importing (``Registry.collecting``), and every effect
    whose source is neither configured (``sources``: name -> scheme) nor listed in ``[handlers]
    skip_sources``."""
    found = [str(m) for m in mistakes]
    configured = ", ".join(repr(s) for s in sorted(sources)) or "none"
    for kind in registry.kinds():
        if kind.source in sources or kind.source in skip_sources:
            continue
        close = difflib.get_close_matches(kind.source, list(sources), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else "."
        found.append(
            f"{_at(kind)}: effect {kind.name!r}: source {kind.source!r} is not configured, so it would "
            f"never run (configured sources: {configured}){hint} Configure [sources.{kind.source}], or "
            "list it in [handlers] skip_sources if this deployment does not take it."
        )
    return found


def warnings(registry: Registry, sources: Mapping[str, str]) -> list[str]:
    """Event patterns that can never match a type of their source's scheme."""
    found = []
    for kind in registry.kinds():
        scheme = sources.get(kind.source)
        shape = TYPE_SHAPES.get(scheme) if scheme is not None else None
        if scheme is None or shape is None:
            continue
        for pattern in kind.events:
            if pattern_can_match(shape, pattern):
                continue
            examples = ", ".join(repr(t) for t in EXAMPLE_TYPES.get(scheme, ()))
            found.append(
                f"{_at(kind)}: effect {kind.name!r}: event pattern {pattern!r} can never match a "
                f"{scheme} event of source {kind.source!r}: {scheme} types are {shape.described}"
                + (f", such as {examples}" if examples else "")
            )
    return found

"""The event types each provider publishes, kept as data (``event_types/{scheme}.txt``), and the start-up
warning for an effect that subscribes to a type its provider does not list.

Each file opens with ``#`` lines naming the provider, the documentation page the list was taken from and
the date, and how a type is compared (``match: whole type``, or ``match: before the first dot`` for
GitHub, whose gateway type is the event name and an optional action). A type missing from a catalogue is
a *warning*, never a refusal: providers add types before a catalogue here is updated. A scheme without a
file (Standard Webhooks, generic HMAC, Slack, Twilio) is not checked, and neither is a pattern with a
wildcard: it names no one type.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources

from effectgate.handlers.registry import Registry

_PACKAGE = "effectgate.gateway.config"
_FOLDER = "event_types"
_WHOLE, _BEFORE_DOT = "whole type", "before the first dot"


@dataclass(frozen=True, slots=True)
class Catalogue:
    """One provider's published event types, with the page they come from."""

    provider: str
    source: str
    retrieved: str
    types: frozenset[str]
    before_first_dot: bool

    def knows(self, event_type: str) -> bool:
        """Whether ``event_type`` (as the gateway reads it for this scheme) is a published type."""
        name = event_type.split(".", 1)[0] if self.before_first_dot else event_type
        return name in self.types

    def nearest(self, event_type: str) -> str | None:
        """The published type ``event_type`` most resembles, if any is close."""
        name = event_type.split(".", 1)[0] if self.before_first_dot else event_type
        close = difflib.get_close_matches(name, sorted(self.types), n=1, cutoff=0.6)
        if not close:
            return None
        return close[0] + event_type[len(name) :] if self.before_first_dot else close[0]


def parse(text: str, *, name: str = "catalogue") -> Catalogue:
    """A catalogue file's header and types; ``ValueError`` names a missing header field. A header field
    is ``# field: value``; indented ``#`` lines below it are comments on it."""
    header: dict[str, str] = {}
    types = set()
    for line in text.splitlines():
        if line.startswith("#"):
            field, sep, value = line[1:].partition(":")
            if sep and field.strip().isidentifier() and not line.startswith("#  "):
                header[field.strip()] = value.strip()
        elif line.strip():
            types.add(line.strip())
    missing = [f for f in ("provider", "source", "retrieved", "match") if f not in header]
    if missing:
        raise ValueError(f"{name}: header lacks {', '.join(missing)}")
    match = next((m for m in (_WHOLE, _BEFORE_DOT) if header["match"].startswith(m)), None)
    if match is None:
        raise ValueError(f"{name}: match must be {_WHOLE!r} or {_BEFORE_DOT!r}, got {header['match']!r}")
    return Catalogue(
        provider=header["provider"],
        source=header["source"].split()[0],
        retrieved=header["retrieved"].split()[0].rstrip(",;"),
        types=frozenset(types),
        before_first_dot=match == _BEFORE_DOT,
    )


@functools.cache
def catalogues() -> Mapping[str, Catalogue]:
    """Every shipped catalogue, by scheme name (the file's stem)."""
    folder = resources.files(_PACKAGE).joinpath(_FOLDER)
    found = {}
    for entry in folder.iterdir():
        if entry.name.endswith(".txt"):
            scheme = entry.name.removesuffix(".txt")
            found[scheme] = parse(entry.read_text(encoding="utf-8"), name=f"{_FOLDER}/{entry.name}")
    return found


@dataclass(frozen=True, slots=True)
class UncataloguedType:
    """An effect subscribing to an event type its provider's catalogue does not list."""

    effect: str
    defined_at: str
    source: str
    scheme: str
    event_type: str
    nearest: str | None
    catalogue: str

    @property
    def problem(self) -> str:
        """The warning in words, at the user's file and line."""
        hint = f"; did you mean {self.nearest!r}?" if self.nearest else ""
        return (
            f"{self.defined_at or 'effect ' + repr(self.effect)}: effect {self.effect!r}: event type "
            f"{self.event_type!r} is not in {self.scheme}'s published catalogue ({self.catalogue}), so it may "
            f"never arrive{hint}"
        )

    def log_fields(self) -> dict[str, str | None]:
        """The fields of the structured warning line."""
        return {
            "problem": self.problem,
            "effect": self.effect,
            "defined_at": self.defined_at,
            "source": self.source,
            "scheme": self.scheme,
            "event_type": self.event_type,
            "nearest": self.nearest,
            "catalogue": self.catalogue,
        }


def uncatalogued(registry: Registry, sources: Mapping[str, str]) -> list[UncataloguedType]:
    """Every literal event type an effect subscribes to that its source's scheme does not publish
    (``sources``: configured name -> scheme name)."""
    known = catalogues()
    found = []
    for kind in registry.kinds():
        scheme = sources.get(kind.source)
        catalogue = known.get(scheme) if scheme is not None else None
        if scheme is None or catalogue is None:
            continue
        for pattern in kind.events:
            if any(c in pattern for c in "*?[") or catalogue.knows(pattern):
                continue
            found.append(
                UncataloguedType(
                    effect=kind.name,
                    defined_at=kind.defined_at or "",
                    source=kind.source,
                    scheme=scheme,
                    event_type=pattern,
                    nearest=catalogue.nearest(pattern),
                    catalogue=f"{catalogue.source} (retrieved {catalogue.retrieved})",
                )
            )
    return found

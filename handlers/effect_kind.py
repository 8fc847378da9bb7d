"""An effect kind: a registered handler and the settings it runs with, validated at construction, and what
it computes from an event (its key, lock key, fingerprint, version, whether its requirements are met).

Every per-kind setting's default and the types of the functions a declaration takes live here too, so the
registry (``handlers.registry``), the declared HTTP effects (``handlers.downstream.forward``) and the settings
declaration (``gateway.config.settings``) read them from one place.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

from effectgate.ledger.fingerprints import fingerprint_selected
from effectgate.ledger.pointers import JsonPointer, PointerMissing

from .effect_settings import parse_pointers, parse_requirements, positive_int, positive_seconds
from .event import Event, Transition

if TYPE_CHECKING:
    from effectgate.ledger.db import Conn

    from .context import EffectContext

OrphanPolicy = Literal["redrive", "park"]
# Where a key function's keys live: "source" prefixes them with the effect's source (no other source can
# produce them), "shared" keeps them as returned (shared on purpose with other sources' effects that do too).
KeySpace = Literal["source", "shared"]

# Every per-kind setting's default, in one place. ``pending_ttl`` and ``poison_threshold`` default to
# ``None``: the process's reconciler settings (``ledger.maintenance.waker.DEFAULT_PENDING_TTL`` and
# ``ledger.maintenance.rescuer.DEFAULT_POISON_THRESHOLD``, or the configuration file).
# With the worker's default backoff (handlers.worker.config: base 1 s, cap 1 h) 60 attempts retry an effect
# for 24 h at the least (every jitter draw at its low end) and 48 h at the most before it fails for good:
# a downstream outage of hours is outlasted, as providers outlast ours (Stripe retries for 3 days).
# handlers.worker.backoff.RetrySchedule computes it; tests/unit/handlers/worker/test_backoff.py holds it to 24 h.
DEFAULT_MAX_ATTEMPTS = 60
DEFAULT_ORPHAN_POLICY: OrphanPolicy = "park"
DEFAULT_LEASE_TTL = 60.0
DEFAULT_SLICE_BUDGET = 300.0
MAX_EFFECT_KEY_LENGTH = 512
MAX_LOCK_KEY_LENGTH = 512
# Versions are stored as Postgres bigints (migrations/0020): integers as they are, times in microseconds.
MAX_VERSION = 2**63 - 1
# ``max_slice`` defaults to this many slice budgets; it may never be set below MIN_SLICE_FACTOR.
DEFAULT_SLICE_FACTOR = 3.0
MIN_SLICE_FACTOR = 2.0
# asyncio timers take seconds as floats, but a deadline past ~24.8 days (2**31 - 1 ms) is a mistake
# in a setting, not a deadline: refuse it rather than silently never firing.
MAX_SLICE_LIMIT = (2**31 - 1) / 1000
UNSET: Any = object()


Handler = Callable[["EffectContext", Event], Awaitable[Any]]
KeyFn = Callable[[Event], str]
LockKeyFn = Callable[[Event], "str | None"]
TransitionHook = Callable[["Conn", Transition], Awaitable[None]]
RequireFn = Callable[[Event], bool]
# ``version`` as a function: an int, an ISO 8601 time with its offset, or a timezone-aware datetime.
VersionFn = Callable[[Event], "int | str | datetime"]
# ``require`` as declared: JSON Pointer -> the value the signed payload must hold there, or a predicate.
Require = Mapping[str, Any] | RequireFn


class InvalidEffect(ValueError):
    """An effect declaration with mistakes; ``problems`` lists every one, not just the first."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = tuple(problems)
        super().__init__("; ".join(self.problems))


@dataclass(frozen=True, slots=True)
class EffectKind:
    """A registered handler and its settings, every one validated at construction (registration).

    ``lease_ttl``: how long a lease lives without a heartbeat (heartbeats come at a third of it).
    ``slice_budget``: when ``ctx.should_yield()`` turns true. ``max_slice``: the hard deadline on one
    slice (default 3 x budget, never below 2 x budget, ``None`` disables it). ``max_attempts``: attempts
    before a retried failure ends ``failed``. ``backoff_base`` / ``backoff_cap``: this kind's retry waits,
    seconds (``None``: the worker's ``[worker]`` settings; a worker ``backoff_base`` of 0 still turns them
    off, ``handlers.worker.backoff``). ``orphan_policy``: what the reconciler does with a job whose
    lease expired (``redrive`` or ``park``). ``pending_ttl`` / ``poison_threshold``: how long a due job
    may wait before it is woken again, and how many releases without a commit make it poison (``None``:
    the reconciler's settings). ``lock_key(event)``: at most one running job per (tenant, lock key).
    ``on_transition``: runs in the same transaction as every terminal transition.
    ``fingerprint``: JSON Pointers selecting what makes two deliveries under one key "the same request"
    (``None``, the default: the whole payload); given as strings, parsed here.
    ``require``: (JSON Pointer, value) pairs the signed payload must hold, and ``require_fn`` a predicate
    of the event, before the effect is claimed at all: a delivery that fails them is skipped for this
    effect (``unmet_requirement``), which is how an effect refuses a signed body sent under another,
    unsigned, type. ``trust_unsigned``: the key, lock-key and require functions may read fields the
    provider does not sign (``delivery_id``, an unsigned ``type``); off, they raise ``UnsignedField``.
    ``key_space``: for a ``key`` function, ``"source"`` files its keys under ``{source}:`` so no other
    source's events can claim them, ``"shared"`` keeps them as returned; ``None`` (undeclared) keeps them as
    returned too, and the gateway refuses to start when effects of two sources that can reach one tenant
    both leave it undeclared (docs/adr/0007).
    ``version``: latest wins per object (docs/ordering.md). A JSON Pointer into the signed payload (given as a
    string, parsed here) or a function of the event, naming a monotonic field of the object the lock key
    names: an integer, or an ISO 8601 time with an offset. It needs ``lock_key``. A delivery whose version is
    lower than the highest claimed for (tenant, kind, lock key) is recorded ``superseded`` and never runs.
    """

    name: str
    source: str
    events: tuple[str, ...]
    fn: Handler
    key: KeyFn | None = None
    orphan_policy: OrphanPolicy = DEFAULT_ORPHAN_POLICY
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    backoff_base: float | None = None
    backoff_cap: float | None = None
    lease_ttl: float = DEFAULT_LEASE_TTL
    slice_budget: float = DEFAULT_SLICE_BUDGET
    max_slice: float | None = field(default=UNSET)
    pending_ttl: float | None = None
    poison_threshold: int | None = None
    lock_key: LockKeyFn | None = None
    on_transition: TransitionHook | None = None
    fingerprint: tuple[JsonPointer, ...] | None = None
    require: tuple[tuple[JsonPointer, Any], ...] | None = None
    require_fn: RequireFn | None = None
    trust_unsigned: bool = False
    key_space: KeySpace | None = None
    # Given as a string (a JSON Pointer), parsed here: afterwards a JsonPointer or a function.
    version: str | JsonPointer | VersionFn | None = None
    # ``path:line`` of the ``@effect(...)`` that declared it (None: built directly), for start-up checks.
    defined_at: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        # Every mistake, not the first: one declaration with three mistakes is reported with three.
        if not self.name or not self.source:
            raise InvalidEffect(["an effect needs a name and a source"])
        normalised, problems = _normalised(self)
        # The only writes to the frozen instance, made before any check or reader sees a field: the loose
        # forms a declaration may give become the one form every reader gets. After __init__, a frozen
        # dataclass sets its own fields through object.__setattr__ (the dataclasses documentation's way).
        for setting, value in normalised.items():
            object.__setattr__(self, setting, value)
        problems += [problem for check in _CHECKS for problem in check(self)]
        if problems:
            raise InvalidEffect(problems)

    def matches(self, source: str, event_type: str) -> bool:
        """Whether this kind handles ``event_type`` from ``source`` (``*`` patterns allowed)."""
        return source == self.source and any(fnmatch.fnmatchcase(event_type, p) for p in self.events)

    def effect_key(self, event: Event) -> str:
        """The logical effect key for ``event``: the kind's key function (under ``{source}:`` when its
        ``key_space`` is ``"source"``), or source:event id:name."""
        key = self.key(event) if self.key is not None else f"{event.source}:{event.id}:{self.name}"
        if not isinstance(key, str) or not key:
            raise ValueError(
                f"effect {self.name!r}: the key function returned {key!r}, not a non-empty string"
            )
        if self.key_space == "source":
            key = f"{self.source}:{key}"
        if len(key) > MAX_EFFECT_KEY_LENGTH:
            raise ValueError(
                f"effect {self.name!r}: effect key longer than {MAX_EFFECT_KEY_LENGTH} characters"
            )
        return key

    def requirement_met(self, event: Event) -> bool:
        """Whether the signed payload of ``event`` holds every ``require`` value (same JSON type and
        value; a missing field is not met) and ``require_fn`` answers exactly ``True``."""
        for pointer, expected in self.require or ():
            try:
                found = pointer.resolve(event.payload)
            except PointerMissing:
                return False
            if not _same_json(found, expected):
                return False
        if self.require_fn is not None:
            answer = self.require_fn(event)
            if not isinstance(answer, bool):
                raise ValueError(f"the require function returned {answer!r}, not True or False")
            return answer
        return True

    def fingerprint_of(self, event: Event) -> str | None:
        """The fingerprint of ``event`` for this effect: of the selected fields, or ``None`` for the
        whole payload (computed once per delivery by the caller)."""
        if self.fingerprint is None:
            return None
        return fingerprint_selected(event.payload, self.fingerprint)

    def lock_key_for(self, event: Event) -> str | None:
        """The lock key for ``event`` (``None``: this effect takes no lock), computed at claim time."""
        if self.lock_key is None:
            return None
        lock = self.lock_key(event)
        if lock is None:
            return None
        if not isinstance(lock, str) or not lock or len(lock) > MAX_LOCK_KEY_LENGTH:
            raise ValueError(
                f"effect {self.name!r}: the lock_key function returned {lock!r}, not None or a non-empty "
                f"string of at most {MAX_LOCK_KEY_LENGTH} characters"
            )
        return lock

    def version_for(self, event: Event) -> int | None:
        """The version of ``event`` as a bigint (``None``: the effect declares none), computed at claim time.
        A missing field, or one that is neither an integer nor an ISO 8601 time with an offset, raises
        ``ValueError``: ordering by a guess would let an old event win."""
        version = self.version
        if version is None:
            return None
        if isinstance(version, JsonPointer):
            try:
                found = version.resolve(event.payload)
            except PointerMissing:
                raise ValueError(f"effect {self.name!r}: no version at {version.text!r}") from None
        elif callable(version):
            found = version(event)
        else:  # a string is parsed at construction
            raise TypeError(f"effect {self.name!r}: version {version!r} was not parsed")
        return _version_number(self.name, found)


def _normalised(kind: EffectKind) -> tuple[dict[str, Any], list[str]]:
    """The settings a declaration may give in a looser form, as every reader gets them, and the problem of
    each that does not parse (left as given): ``require`` and ``fingerprint`` as parsed JSON Pointers, a
    ``version`` string as a ``JsonPointer``, and ``max_slice`` left unset as ``DEFAULT_SLICE_FACTOR`` budgets
    (``None`` beside a bad budget, which has its own problem). Reads the instance, writes nothing."""
    values: dict[str, Any] = {}
    problems: list[str] = []
    for setting, parse in (("require", parse_requirements), ("fingerprint", parse_pointers)):
        given = getattr(kind, setting)
        if given is not None:
            try:
                values[setting] = parse(kind.name, given)
            except ValueError as exc:
                problems.append(str(exc))
    if isinstance(kind.version, str):
        try:
            values["version"] = JsonPointer.parse(kind.version)
        except ValueError as exc:
            problems.append(f"effect {kind.name!r}: version: {exc}")
    if kind.max_slice is UNSET:
        budget_ok = positive_seconds(kind.name, "slice_budget", kind.slice_budget) is None
        values["max_slice"] = DEFAULT_SLICE_FACTOR * kind.slice_budget if budget_ok else None
    return values, problems


# The checks of a normalised kind, one concern each, in the order their problems are reported. Each yields
# its problems; none changes the kind.
_Check = Callable[["EffectKind"], Iterable[str]]


def _some(*problems: str | None) -> Iterator[str]:
    return (p for p in problems if p is not None)


def _check_unsigned_fields(kind: EffectKind) -> Iterator[str]:
    if not isinstance(kind.trust_unsigned, bool):
        yield f"effect {kind.name!r}: trust_unsigned must be True or False"


def _check_key_space(kind: EffectKind) -> Iterator[str]:
    if kind.key_space not in (None, "source", "shared"):
        yield f"effect {kind.name!r}: key_space must be 'source' or 'shared', got {kind.key_space!r}"
    elif kind.key_space is not None and kind.key is None:
        yield f"effect {kind.name!r}: key_space applies to a key function; the default key is the source's"


def _check_version(kind: EffectKind) -> Iterator[str]:
    if kind.version is None:
        return
    # A string left unparsed was reported by _normalised.
    if not isinstance(kind.version, str | JsonPointer) and not callable(kind.version):
        yield (
            f"effect {kind.name!r}: version must be a JSON Pointer or a function of the event, "
            f"got {kind.version!r}"
        )
    if kind.lock_key is None:
        # The version orders the deliveries of one object; the lock key says which object.
        yield f"effect {kind.name!r}: version needs a lock_key naming the object it versions"


def _check_handler_and_events(kind: EffectKind) -> Iterator[str]:
    if not callable(kind.fn):
        yield f"effect {kind.name!r}: the handler must be an async function, got {kind.fn!r}"
    if not kind.events or not all(isinstance(e, str) and e for e in kind.events):
        yield f"effect {kind.name!r}: events must be a non-empty list of event types, got {kind.events!r}"


def _check_orphan_policy(kind: EffectKind) -> Iterator[str]:
    if kind.orphan_policy not in ("redrive", "park"):
        yield f"effect {kind.name!r}: orphan_policy must be 'redrive' or 'park', got {kind.orphan_policy!r}"


def _check_retries(kind: EffectKind) -> Iterator[str]:
    yield from _some(positive_int(kind.name, "max_attempts", kind.max_attempts))
    base, cap = kind.backoff_base, kind.backoff_cap
    bad = list(
        _some(
            None if base is None else positive_seconds(kind.name, "backoff_base", base),
            None if cap is None else positive_seconds(kind.name, "backoff_cap", cap),
        )
    )
    yield from bad
    if not bad and base is not None and cap is not None and cap < base:
        yield f"effect {kind.name!r}: backoff_cap must be >= backoff_base ({base:g} s), got {cap!r}"


def _check_durations(kind: EffectKind) -> Iterator[str]:
    yield from _some(
        positive_seconds(kind.name, "lease_ttl", kind.lease_ttl),
        positive_seconds(kind.name, "slice_budget", kind.slice_budget),
        None if kind.pending_ttl is None else positive_seconds(kind.name, "pending_ttl", kind.pending_ttl),
    )


def _check_poison_threshold(kind: EffectKind) -> Iterator[str]:
    if kind.poison_threshold is not None:
        yield from _some(positive_int(kind.name, "poison_threshold", kind.poison_threshold))


def _check_hooks(kind: EffectKind) -> Iterator[str]:
    for hook in ("key", "lock_key", "on_transition", "require_fn"):
        value = getattr(kind, hook)
        if value is not None and not callable(value):
            yield f"effect {kind.name!r}: {hook} must be callable, got {value!r}"


def _check_max_slice(kind: EffectKind) -> Iterator[str]:
    max_slice = kind.max_slice
    if max_slice is None:
        return
    problem = positive_seconds(kind.name, "max_slice", max_slice)
    if problem is not None:
        yield problem
        return
    budget = kind.slice_budget
    if positive_seconds(kind.name, "slice_budget", budget) is None and max_slice < MIN_SLICE_FACTOR * budget:
        yield (
            f"effect {kind.name!r}: max_slice must be at least {MIN_SLICE_FACTOR:g} x slice_budget "
            f"({MIN_SLICE_FACTOR * budget:g} s), or None to disable the hard deadline"
        )
    if max_slice > MAX_SLICE_LIMIT:
        yield (
            f"effect {kind.name!r}: max_slice must be at most {MAX_SLICE_LIMIT:g} s (2**31 - 1 ms); "
            "use None to disable the hard deadline"
        )


_CHECKS: tuple[_Check, ...] = (
    _check_unsigned_fields,
    _check_key_space,
    _check_version,
    _check_handler_and_events,
    _check_orphan_policy,
    _check_retries,
    _check_durations,
    _check_poison_threshold,
    _check_hooks,
    _check_max_slice,
)


def _version_number(kind: str, found: object) -> int:
    if isinstance(found, str):
        text = found
        try:
            found = datetime.fromisoformat(text)
        except ValueError:
            raise ValueError(
                f"effect {kind!r}: the version {text[:64]!r} is neither an integer nor an ISO 8601 time"
            ) from None
    if isinstance(found, datetime):
        if found.tzinfo is None:
            # A time without an offset is a different instant in every zone: no order can be read from it.
            raise ValueError(f"effect {kind!r}: the version time {found.isoformat()!r} has no UTC offset")
        delta = found - datetime(1970, 1, 1, tzinfo=UTC)
        found = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    if isinstance(found, bool) or not isinstance(found, int) or not -MAX_VERSION <= found <= MAX_VERSION:
        raise ValueError(
            f"effect {kind!r}: the version {found!r} is not an integer (of at most 63 bits) or an ISO 8601 time"
        )
    return found


def _same_json(found: object, expected: object) -> bool:
    # JSON's types, not Python's: true is not 1, and "1" is not 1.
    if isinstance(found, bool) or isinstance(expected, bool):
        return isinstance(found, bool) and isinstance(expected, bool) and found is expected
    if isinstance(found, list) and isinstance(expected, list):
        return len(found) == len(expected) and all(
            _same_json(a, b) for a, b in zip(found, expected, strict=True)
        )
    if isinstance(found, dict) and isinstance(expected, dict):
        return found.keys() == expected.keys() and all(_same_json(found[k], expected[k]) for k in found)
    if isinstance(found, int | float) and isinstance(expected, int | float):
        return found == expected
    return type(found) is type(expected) and found == expected

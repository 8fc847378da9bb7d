"""An effect kind: a registered handler and the settings it runs with, validated at construction, and what
it computes from an event (its key, lock key, fingerprint, version, whether its requirements are met).

Every per-kind setting's default and the types of the functions a declaration takes live here too, so the
registry (``handlers.registry``), the declared HTTP effects (``handlers.downstream.forward``) and the settings
declaration (``gateway.config.settings``) read them from one place.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Awaitable, Callable, Mapping, Sequence
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
# handlers.worker.backoff.RetrySchedule computes it; tests/unit/test_backoff.py holds it to 24 h.
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
        problems = self._problems()
        if problems:
            raise InvalidEffect(problems)

    def _problems(self) -> list[str]:
        """Every mistake in the settings (normalising ``require``, ``fingerprint`` and ``max_slice``
        on the way), so that one declaration with three mistakes is reported with three."""
        if not self.name or not self.source:
            return ["an effect needs a name and a source"]
        problems: list[str] = []

        def check(problem: str | None) -> None:
            if problem is not None:
                problems.append(problem)

        if self.require is not None:
            try:
                object.__setattr__(self, "require", parse_requirements(self.name, self.require))
            except ValueError as exc:
                problems.append(str(exc))
        if not isinstance(self.trust_unsigned, bool):
            problems.append(f"effect {self.name!r}: trust_unsigned must be True or False")
        if self.key_space not in (None, "source", "shared"):
            problems.append(
                f"effect {self.name!r}: key_space must be 'source' or 'shared', got {self.key_space!r}"
            )
        elif self.key_space is not None and self.key is None:
            problems.append(
                f"effect {self.name!r}: key_space applies to a key function; the default key is the source's"
            )
        if self.fingerprint is not None:
            try:
                object.__setattr__(self, "fingerprint", parse_pointers(self.name, self.fingerprint))
            except ValueError as exc:
                problems.append(str(exc))
        if self.version is not None:
            if isinstance(self.version, str):
                try:
                    object.__setattr__(self, "version", JsonPointer.parse(self.version))
                except ValueError as exc:
                    problems.append(f"effect {self.name!r}: version: {exc}")
            elif not isinstance(self.version, JsonPointer) and not callable(self.version):
                problems.append(
                    f"effect {self.name!r}: version must be a JSON Pointer or a function of the event, "
                    f"got {self.version!r}"
                )
            if self.lock_key is None:
                # The version orders the deliveries of one object; the lock key says which object.
                problems.append(
                    f"effect {self.name!r}: version needs a lock_key naming the object it versions"
                )
        if not callable(self.fn):
            problems.append(f"effect {self.name!r}: the handler must be an async function, got {self.fn!r}")
        if not self.events or not all(isinstance(e, str) and e for e in self.events):
            problems.append(
                f"effect {self.name!r}: events must be a non-empty list of event types, got {self.events!r}"
            )
        if self.orphan_policy not in ("redrive", "park"):
            problems.append(
                f"effect {self.name!r}: orphan_policy must be 'redrive' or 'park', got {self.orphan_policy!r}"
            )
        check(positive_int(self.name, "max_attempts", self.max_attempts))
        backoff_problems = [
            positive_seconds(self.name, setting, getattr(self, setting))
            for setting in ("backoff_base", "backoff_cap")
            if getattr(self, setting) is not None
        ]
        for problem in backoff_problems:
            check(problem)
        if (
            not any(backoff_problems)
            and self.backoff_base is not None
            and self.backoff_cap is not None
            and self.backoff_cap < self.backoff_base
        ):
            problems.append(
                f"effect {self.name!r}: backoff_cap must be >= backoff_base ({self.backoff_base:g} s), "
                f"got {self.backoff_cap!r}"
            )
        budget_problem = positive_seconds(self.name, "slice_budget", self.slice_budget)
        check(positive_seconds(self.name, "lease_ttl", self.lease_ttl))
        check(budget_problem)
        if self.pending_ttl is not None:
            check(positive_seconds(self.name, "pending_ttl", self.pending_ttl))
        if self.poison_threshold is not None:
            check(positive_int(self.name, "poison_threshold", self.poison_threshold))
        for hook in ("key", "lock_key", "on_transition", "require_fn"):
            if getattr(self, hook) is not None and not callable(getattr(self, hook)):
                problems.append(f"effect {self.name!r}: {hook} must be callable, got {getattr(self, hook)!r}")
        if self.max_slice is UNSET:
            default = None if budget_problem else DEFAULT_SLICE_FACTOR * self.slice_budget
            object.__setattr__(self, "max_slice", default)
        elif self.max_slice is not None:
            slice_problem = positive_seconds(self.name, "max_slice", self.max_slice)
            check(slice_problem)
            if slice_problem:
                return problems
            if budget_problem is None and self.max_slice < MIN_SLICE_FACTOR * self.slice_budget:
                problems.append(
                    f"effect {self.name!r}: max_slice must be at least {MIN_SLICE_FACTOR:g} x slice_budget "
                    f"({MIN_SLICE_FACTOR * self.slice_budget:g} s), or None to disable the hard deadline"
                )
        if self.max_slice is not None and self.max_slice > MAX_SLICE_LIMIT:
            problems.append(
                f"effect {self.name!r}: max_slice must be at most {MAX_SLICE_LIMIT:g} s (2**31 - 1 ms); "
                "use None to disable the hard deadline"
            )
        return problems

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

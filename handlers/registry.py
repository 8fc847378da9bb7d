"""Where effect handlers are registered (the kinds themselves, and their settings: ``handlers.effect_kind``).

One registry per process (``REGISTRY``); the ``@effect`` decorator registers into it. Handler
modules are named in the configuration and imported by the gateway (to match deliveries and
compute effect keys) and by the worker (to run them) alike.
"""

from __future__ import annotations

import contextlib
import difflib
import inspect
import os
import sys
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

from .effect_kind import EffectKind as EffectKind  # re-exported: the worker and tests take it from here
from .effect_kind import (
    Handler,
    InvalidEffect,
    KeyFn,
    KeySpace,
    LockKeyFn,
    OrphanPolicy,
    Require,
    RequireFn,
    TransitionHook,
    VersionFn,
)

if TYPE_CHECKING:
    from effectgate.ledger.db import Conn

SweepFn = Callable[["Conn"], Awaitable[int]]


@dataclass(frozen=True, slots=True)
class Mistake:
    """A mistake in an ``@effect`` declaration, at the user's file and line (``where``: ``path:line``)."""

    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


def _is_async(fn: object) -> bool:
    # A class instance whose __call__ is ``async def`` is a coroutine function in all but name.
    call = type(fn).__call__ if callable(fn) and not inspect.isroutine(fn) else None
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call)


_THIS_FILE = os.path.normcase(os.path.abspath(__file__))


def _did_you_mean(option: str, known: set[str]) -> str:
    close = difflib.get_close_matches(option, sorted(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _caller() -> str:
    """``path:line`` of the first frame outside this module: the user's ``@effect(...)`` line, so a
    mistake is reported where it can be fixed, not here. The path is relative to the working
    directory when it lies under it."""
    frame = sys._getframe(1)
    while (
        frame.f_back is not None and os.path.normcase(os.path.abspath(frame.f_code.co_filename)) == _THIS_FILE
    ):
        frame = frame.f_back
    path = frame.f_code.co_filename
    with contextlib.suppress(ValueError):  # another drive (Windows): keep it absolute
        relative = os.path.relpath(path)
        if not relative.startswith(os.pardir):
            path = relative
    return f"{path}:{frame.f_lineno}"


class EffectOptions(TypedDict, total=False):
    """What ``effect()`` takes besides ``source`` and ``events``, declared once for both spellings (the
    module's ``effect`` and ``Registry.effect``). Each option's default and meaning are ``EffectKind``'s field
    of the same name; ``require`` is split there into ``require`` (a mapping) and ``require_fn`` (a
    predicate), and ``name`` defaults to the handler's module and qualified name. A test keeps these names
    and ``EffectKind``'s fields in step."""

    key: KeyFn | None
    name: str | None
    orphan_policy: OrphanPolicy
    max_attempts: int
    backoff_base: float | None
    backoff_cap: float | None
    lease_ttl: float
    slice_budget: float
    max_slice: float | None
    pending_ttl: float | None
    poison_threshold: int | None
    lock_key: LockKeyFn | None
    on_transition: TransitionHook | None
    fingerprint: Sequence[str] | None
    require: Require | None
    trust_unsigned: bool
    key_space: KeySpace | None
    version: str | VersionFn | None


def _split_require(require: Require | None) -> tuple[Mapping[str, Any] | None, RequireFn | None]:
    if require is None:
        return None, None
    if isinstance(require, Mapping):
        return require, None
    return None, require


class Registry:
    """The effect kinds and sweeps of one process."""

    def __init__(self) -> None:
        self._kinds: dict[str, EffectKind] = {}
        self._sweeps: dict[str, SweepFn] = {}
        self._collectors: list[list[Mistake]] = []

    @contextlib.contextmanager
    def collecting(self) -> Iterator[list[Mistake]]:
        """Inside the block, a mistaken ``@effect`` is recorded in the list it gives instead of raised, so
        the gateway can import every handler module and report every mistake at once; outside it, the
        decorator raises ``InvalidEffect`` naming every mistake of that declaration at the user's line."""
        mistakes: list[Mistake] = []
        self._collectors.append(mistakes)
        try:
            yield mistakes
        finally:
            self._collectors.remove(mistakes)

    def register(self, kind: EffectKind) -> EffectKind:
        """Add a kind; a name registered twice is an error, never a silent replacement."""
        if kind.name in self._kinds:
            raise ValueError(f"effect {kind.name!r} is already registered")
        self._kinds[kind.name] = kind
        return kind

    def register_sweep(self, sweep_id: str, fn: SweepFn) -> None:
        """Add a sweep the reconciler runs after its job repairs on every pass it owns."""
        if not sweep_id or not isinstance(sweep_id, str):
            raise ValueError("a sweep needs an id")
        if not callable(fn):
            raise ValueError(f"sweep {sweep_id!r}: fn must be an async function of a connection")
        if sweep_id in self._sweeps:
            raise ValueError(f"sweep {sweep_id!r} is already registered")
        self._sweeps[sweep_id] = fn

    def effect(
        self, *, source: str, events: Iterable[str], **options: Unpack[EffectOptions]
    ) -> Callable[[Handler], Handler]:
        """Decorator: register an async handler for ``events`` from ``source``.

        Every argument is checked here, at the decorated function, and every mistake is reported with the
        file and line of this call (see ``collecting``).
        """
        where = _caller()
        known = set(EffectOptions.__annotations__)
        # Reported like every other mistake (at the user's line, collected at start-up), not as Python's
        # TypeError from deep inside the decorator: the likely cause is a typo, so the known names are listed.
        unknown = [
            f"effect(): unknown option {option!r}{_did_you_mean(option, known)}; the options are "
            + ", ".join(sorted(known))
            for option in sorted(set(options) - known)
        ]
        declared: dict[str, Any] = {k: v for k, v in options.items() if k in known}
        name = declared.pop("name", None)
        declared["require"], declared["require_fn"] = _split_require(declared.pop("require", None))

        def register(fn: Handler) -> Handler:
            kind_name = name or f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn)!s}"
            problems: list[str] = list(unknown)
            if callable(fn) and not _is_async(fn):
                problems.append(
                    f"effect {kind_name!r}: the handler must be a coroutine function (async def), "
                    "not a plain def"
                )
            if isinstance(events, str):
                event_types: tuple[Any, ...] = (events,)
            else:
                try:
                    event_types = tuple(events)
                except TypeError:
                    event_types = ()
            try:
                kind = EffectKind(
                    name=kind_name, source=source, events=event_types, fn=fn, defined_at=where, **declared
                )
            except InvalidEffect as exc:
                problems.extend(exc.problems)
            else:
                if not problems:
                    try:
                        self.register(kind)
                    except ValueError as exc:
                        problems.append(str(exc))
            if problems:
                if self._collectors:
                    self._collectors[-1].extend(Mistake(where, p) for p in problems)
                else:
                    raise InvalidEffect([f"{where}: {p}" for p in problems])
            return fn

        return register

    def get(self, name: str) -> EffectKind | None:
        """The kind registered under ``name``."""
        return self._kinds.get(name)

    def kinds(self) -> list[EffectKind]:
        """Every registered kind, in registration order."""
        return list(self._kinds.values())

    def sweeps(self) -> dict[str, SweepFn]:
        """Every registered sweep, by id."""
        return dict(self._sweeps)

    def match(self, source: str, event_type: str) -> list[EffectKind]:
        """The kinds that handle ``event_type`` from ``source``, in registration order."""
        return [k for k in self._kinds.values() if k.matches(source, event_type)]

    def clear(self) -> None:
        """Forget every kind and sweep (tests that build registries of their own)."""
        self._kinds.clear()
        self._sweeps.clear()


REGISTRY = Registry()


def effect(
    *, source: str, events: Iterable[str], **options: Unpack[EffectOptions]
) -> Callable[[Handler], Handler]:
    """Register an async effect handler in the process registry.

    ``key(event)`` gives the logical effect key (default ``{source}:{event id}:{name}``); every
    delivery that yields the same key is the same effect. ``orphan_policy`` says what the reconciler
    does with a job whose worker vanished: ``redrive`` (safe when every side effect goes through
    ``ctx.step``) or ``park`` for a human (the default). ``fingerprint`` names, as JSON Pointers, the
    fields that make two deliveries under one key the same request (default: the whole payload), e.g.
    ``["/data/object/amount", "/data/object/currency"]`` when two event types report one payment.
    ``require`` is checked on the signed payload before anything is claimed: a mapping of JSON Pointers to
    the values they must hold (``{"/financial_status": "paid"}``) or a predicate of the event; a delivery
    that fails it is skipped for this effect. Use it wherever the provider leaves the event type unsigned
    (GitHub, Shopify): the type routes, the signed body decides. Key, lock-key and require functions
    cannot read unsigned fields (``delivery_id``; ``type`` where unsigned) unless ``trust_unsigned=True``.
    ``key_space="source"`` files a key function's keys under the source, so another source's events can
    never claim them; ``"shared"`` says sharing them across sources is meant.
    ``version`` (with ``lock_key``) makes the latest event per object win: a JSON Pointer into the signed
    payload (``"/created"``) or a function of the event giving an integer or an ISO 8601 time; a delivery
    older than the newest claimed for its object is recorded ``superseded`` and never runs.
    Every other setting is described on ``EffectKind``; all are validated here, at registration.
    """
    return REGISTRY.effect(source=source, events=events, **options)


def register_sweep(sweep_id: str, fn: SweepFn) -> None:
    """Register a sweep in the process registry."""
    REGISTRY.register_sweep(sweep_id, fn)

"""Typed access to TOML tables that names the file and the key in every error.

Its own module so the configuration (``gateway.config``) and the parts it delegates to (operators in
``gateway.operator.auth``) share it without importing each other.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any


class ConfigError(Exception):
    """The configuration is invalid; each problem names the file and the key.

    ``problems`` holds every mistake found in one pass (one line each), so a user fixes them all in
    one edit rather than one per run.
    """

    def __init__(self, *problems: str) -> None:
        super().__init__("\n".join(problems))
        self.problems: tuple[str, ...] = problems


@dataclass
class Read:
    """One key a reader was asked for: where, as what, with which default and minimum."""

    prefix: str
    key: str
    kind: type | tuple[type, ...]
    default: Any
    required: bool
    minimum: float | None = None


# Set while ``reads()`` watches: the settings declaration (``gateway.config.settings``) is checked against
# what the parser actually asks for, so a key added to the parser and not to the declaration fails a test.
_reads: ContextVar[list[Read] | None] = ContextVar("effectgate_config_reads", default=None)


@contextmanager
def reads() -> Iterator[list[Read]]:
    """Every key the readers are asked for inside the ``with``, in order."""
    seen: list[Read] = []
    token = _reads.set(seen)
    try:
        yield seen
    finally:
        _reads.reset(token)


class TableReader:
    """Typed access to one TOML table that remembers where it is, for error messages.

    A mistake is recorded (``problem``) rather than raised, and the reader hands back the default, so
    one pass finds every mistake; the caller raises them together at the end (``problems`` is shared
    with every nested reader). ``failed`` says whether this table had one, so a caller does not build
    an object from half-read settings. ``error`` still makes a ``ConfigError`` to raise at once.
    """

    def __init__(
        self, path: str, prefix: str, table: Mapping[str, Any], problems: list[str] | None = None
    ) -> None:
        self.path = path
        self.prefix = prefix
        self.table = table
        self.problems: list[str] = [] if problems is None else problems
        self.used: set[str] = set()
        self.missing: list[str] = []
        self.failed = False

    def _where(self, key: str, what: str) -> str:
        where = f"{self.prefix}.{key}" if self.prefix else key
        return f"{self.path}: {where}: {what}"

    def error(self, key: str, what: str) -> ConfigError:
        return ConfigError(self._where(key, what))

    def problem(self, key: str, what: str) -> None:
        """Record a mistake in ``key``; reading carries on."""
        self.problems.append(self._where(key, what))
        self.failed = True

    def child(self, prefix: str, table: Mapping[str, Any]) -> TableReader:
        """A reader for a nested table (``prefix`` is its full name) whose problems join this one's."""
        return TableReader(self.path, prefix, table, self.problems)

    def get(
        self, key: str, kind: type | tuple[type, ...], default: Any = None, *, required: bool = False
    ) -> Any:
        self.used.add(key)
        watching = _reads.get()
        if watching is not None:
            watching.append(Read(self.prefix, key, kind, default, required))
        if key not in self.table:
            if required:
                # Reported by no_unknown_keys, which knows whether a misspelt key explains it.
                self.missing.append(key)
                self.failed = True
            return default
        value = self.table[key]
        # bool is an int to Python; a port of `true` is still a mistake.
        if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
            self.problem(key, f"must be {_kind_name(kind)}, not a boolean")
            return default
        if not isinstance(value, kind):
            self.problem(key, f"must be {_kind_name(kind)}, not {type(value).__name__} {value!r}")
            return default
        return value

    def number(self, key: str, default: float | None, *, minimum: float, integer: bool = False) -> Any:
        value = self.get(key, int if integer else (int, float), default)
        watching = _reads.get()
        if watching is not None:
            watching[-1].minimum = minimum
        if value is None:  # optional, and not set: the default None means "inherit"
            return None
        if value < minimum:
            self.problem(key, f"must be >= {minimum:g}, got {value!r}")
            return default
        return value

    def table_of(self, key: str) -> TableReader:
        value = self.get(key, dict, {})
        return self.child(f"{self.prefix}.{key}" if self.prefix else key, value)

    def no_unknown_keys(self) -> None:
        """Report keys nobody asked for (with the known key they most resemble) and required keys
        that are missing — unless a misspelling of the key is what is there instead."""
        known = sorted(self.used)
        explained: set[str] = set()
        for key in self.table:
            if key in self.used:
                continue
            close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
            if close:
                explained.add(close[0])
                self.problem(key, f"is not a known setting; did you mean {close[0]!r}?")
            else:
                self.problem(key, "is not a known setting (a typo?)")
        for key in self.missing:
            if key not in explained:
                self.problem(key, "is required")


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "a table",
        bool: "a boolean",
    }
    return " or ".join(names.get(k, k.__name__) for k in kinds)

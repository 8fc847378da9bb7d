"""Typed access to TOML tables that names the file and the key in every error.

Its own module so the configuration (``gateway.config``) and the parts it delegates to (operators in
``gateway.operator.auth``) share it without importing each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class ConfigError(Exception):
    """The configuration is invalid; the message names the file and the key."""


class TableReader:
    """Typed access to one TOML table that remembers where it is, for error messages."""

    def __init__(self, path: str, prefix: str, table: Mapping[str, Any]) -> None:
        self.path = path
        self.prefix = prefix
        self.table = table
        self.used: set[str] = set()

    def error(self, key: str, what: str) -> ConfigError:
        where = f"{self.prefix}.{key}" if self.prefix else key
        return ConfigError(f"{self.path}: {where}: {what}")

    def get(
        self, key: str, kind: type | tuple[type, ...], default: Any = None, *, required: bool = False
    ) -> Any:
        self.used.add(key)
        if key not in self.table:
            if required:
                raise self.error(key, "is required")
            return default
        value = self.table[key]
        # bool is an int to Python; a port of `true` is still a mistake.
        if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
            raise self.error(key, f"must be {_kind_name(kind)}, not a boolean")
        if not isinstance(value, kind):
            raise self.error(key, f"must be {_kind_name(kind)}, not {type(value).__name__} {value!r}")
        return value

    def number(self, key: str, default: float, *, minimum: float, integer: bool = False) -> Any:
        value = self.get(key, int if integer else (int, float), default)
        if value < minimum:
            raise self.error(key, f"must be >= {minimum:g}, got {value!r}")
        return value

    def table_of(self, key: str) -> TableReader:
        value = self.get(key, dict, {})
        return TableReader(self.path, f"{self.prefix}.{key}" if self.prefix else key, value)

    def no_unknown_keys(self) -> None:
        for key in self.table:
            if key not in self.used:
                raise self.error(key, "is not a known setting (a typo?)")


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

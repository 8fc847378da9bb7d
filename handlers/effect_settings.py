"""Checks of one declared setting of an effect (a number of seconds, a count, fingerprint pointers, ``require``
pairs), each answering with the message ``EffectKind`` collects, so one declaration's mistakes are reported together.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from effectgate.ledger.pointers import JsonPointer


def positive_seconds(kind: str, setting: str, value: object) -> str | None:
    # NaN and infinity compare false against everything, so a bare `value <= 0` would let them through.
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        return f"effect {kind!r}: {setting} must be a finite number of seconds > 0, got {value!r}"
    return None


def positive_int(kind: str, setting: str, value: object) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return f"effect {kind!r}: {setting} must be an integer >= 1, got {value!r}"
    return None


def parse_pointers(kind: str, pointers: object) -> tuple[JsonPointer, ...]:
    # A bare string is a sequence too; "/amount" as ["/", "a", …] would be a baffling mistake.
    if isinstance(pointers, str) or not isinstance(pointers, list | tuple):
        raise ValueError(f"effect {kind!r}: fingerprint must be a list of JSON Pointers, got {pointers!r}")
    if not pointers:
        raise ValueError(
            f"effect {kind!r}: fingerprint must name at least one field (omit it for the whole payload)"
        )
    parsed = []
    for pointer in pointers:
        try:
            parsed.append(pointer if isinstance(pointer, JsonPointer) else JsonPointer.parse(pointer))
        except ValueError as exc:
            raise ValueError(f"effect {kind!r}: fingerprint: {exc}") from None
    if len({p.text for p in parsed}) != len(parsed):
        raise ValueError(f"effect {kind!r}: fingerprint names a field twice")
    return tuple(parsed)


def parse_requirements(kind: str, require: object) -> tuple[tuple[JsonPointer, Any], ...]:
    pairs = require.items() if isinstance(require, Mapping) else require
    if not isinstance(pairs, Iterable) or isinstance(pairs, str):
        raise ValueError(f"effect {kind!r}: require must map JSON Pointers to values, got {require!r}")
    parsed = []
    for pair in pairs:
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise ValueError(f"effect {kind!r}: require must map JSON Pointers to values, got {require!r}")
        pointer, expected = pair
        try:
            parsed.append(
                (pointer if isinstance(pointer, JsonPointer) else JsonPointer.parse(pointer), expected)
            )
        except ValueError as exc:
            raise ValueError(f"effect {kind!r}: require: {exc}") from None
        if not is_json(expected):
            raise ValueError(f"effect {kind!r}: require {pointer!r}: {expected!r} is not a JSON value")
    if not parsed:
        raise ValueError(
            f"effect {kind!r}: require must name at least one field (omit it to require nothing)"
        )
    return tuple(parsed)


def is_json(value: object) -> bool:
    if value is None or isinstance(value, str | bool | int):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(is_json(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and is_json(v) for k, v in value.items())
    return False

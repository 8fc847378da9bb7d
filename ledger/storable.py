"""What Postgres can store, checked before it is asked to.

Python's json accepts values that ``jsonb`` and ``text`` refuse: NaN and Infinity, the NUL character,
and lone surrogates. A value refused at write time fails the write every time it is retried, so the
ledger checks first and the caller decides what the refusal means (a 400 for a delivery, a bug for a
step result) — and error text, which must be stored whatever it contains, is made storable instead.
"""

from __future__ import annotations

import math
from typing import Any

_MAX_DEPTH = 500


def jsonb_problem(value: Any) -> str | None:
    """Why ``value`` cannot be stored as ``jsonb``, or ``None`` when it can.

    One walk over the value (it runs on every delivery): JSON types only, finite numbers, and text
    without NUL or lone surrogates, in keys and values alike.
    """
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > _MAX_DEPTH:
            return "nested too deeply"
        if item is None or isinstance(item, bool | int):
            continue
        if isinstance(item, str):
            problem = _text_problem(item)
            if problem:
                return problem
        elif isinstance(item, float):
            if not math.isfinite(item):
                return "not JSON: contains NaN or Infinity"
        elif isinstance(item, dict):
            for key, child in item.items():
                # As json.dumps does: non-string scalar keys become strings; anything else is refused.
                if isinstance(key, str):
                    problem = _text_problem(key)
                    if problem:
                        return problem
                elif isinstance(key, float) and not math.isfinite(key):
                    return "not JSON: contains NaN or Infinity"
                elif not (key is None or isinstance(key, int | float)):
                    return f"not JSON: a key of type {type(key).__name__}"
                stack.append((child, depth + 1))
        elif isinstance(item, list | tuple):
            stack.extend((child, depth + 1) for child in item)
        else:
            return f"not JSON: a value of type {type(item).__name__}"
    return None


def _text_problem(text: str) -> str | None:
    if "\x00" in text:
        return "a string contains the NUL character (\\u0000), which Postgres cannot store"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "a string contains a lone surrogate (invalid Unicode)"
    return None


def storable_text(text: str) -> str:
    """``text`` with what Postgres refuses (NUL, lone surrogates) written out as escapes."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", errors="backslashreplace").decode("utf-8")
    return text


def storable_error(error: dict[str, Any]) -> dict[str, Any]:
    """An error record (type, message, traceback, …) with every string made storable."""
    return {key: storable_text(value) if isinstance(value, str) else value for key, value in error.items()}

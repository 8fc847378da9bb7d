"""What Postgres can store, checked before it is asked to.

Python's json accepts values that ``jsonb`` and ``text`` refuse: NaN and Infinity, the NUL character,
and lone surrogates. A value refused at write time fails the write every time it is retried, so the
ledger checks first and the caller decides what the refusal means (a 400 for a delivery, a bug for a
step result) — and error text, which must be stored whatever it contains, is made storable instead.
"""

from __future__ import annotations

import math
import re
from typing import Any

#: The deepest nesting of a payload the ledger stores (docs/providers.md, "Payloads"); deeper is refused.
MAX_DEPTH = 500
_MAX_DEPTH = MAX_DEPTH
#: What stands for a character Postgres cannot store (NUL, a lone surrogate) in a payload's stored copy.
REPLACEMENT = "\ufffd"
_UNSTORABLE_CHARACTER = re.compile("[\x00\ud800-\udfff]")


class Unstorable(ValueError):
    """A payload no rewriting of its text makes storable: nested too deeply, or not JSON at all."""


def storable_payload(value: Any) -> tuple[Any, str | None]:
    """A payload as the ledger stores and runs it: ``(value, None)`` when ``jsonb`` takes it as it is (nearly
    always: one walk, no copy), else ``(copy, problem)`` with every NUL and lone surrogate in its text — keys
    and values — replaced by U+FFFD, the character Unicode gives for what cannot be represented.
    ``Unstorable`` when that is not enough (nested deeper than ``MAX_DEPTH``, a value that is not JSON)."""
    problem = jsonb_problem(value)
    if problem is None:
        return value, None
    copy = _replace_text(value)
    left = jsonb_problem(copy)
    if left is not None:
        raise Unstorable(left)
    return copy, problem


def _replace_text(value: Any) -> Any:
    # Iterative: a payload may be nested as deep as Python parses (about 1,000), past the recursion limit.
    def text(item: Any) -> Any:
        return _UNSTORABLE_CHARACTER.sub(REPLACEMENT, item) if isinstance(item, str) else item

    if not isinstance(value, dict | list | tuple):
        return text(value)
    root: dict[Any, Any] | list[Any] = {} if isinstance(value, dict) else []
    stack: list[tuple[Any, dict[Any, Any] | list[Any]]] = [(value, root)]
    while stack:
        source, target = stack.pop()
        items = source.items() if isinstance(source, dict) else enumerate(source)
        for key, item in items:
            if isinstance(item, dict | list | tuple):
                child: Any = {} if isinstance(item, dict) else []
                stack.append((item, child))
            else:
                child = text(item)
            if isinstance(target, dict):
                target[text(key)] = child
            else:
                target.append(child)
    return root


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
    if text.isascii():
        # No surrogate is ASCII: the usual string is cleared without encoding a copy of it.
        return None
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


# Bounds on rewriting a value that is not storable: an error record is small, so past these the rest is
# written as a marker (a shared or circular structure must not be walked for ever).
_REWRITE_DEPTH = 100
_REWRITE_NODES = 10_000
# Python refuses to write an int of more than 4,300 digits as text (sys.set_int_max_str_digits); ~13,000
# bits stays well inside that, and inside jsonb's numeric range.
_MAX_INT_BITS = 13_000


def storable_json(value: Any) -> Any:
    """``value`` rewritten so that ``jsonb`` can store it: text made storable (as ``storable_text``), a
    value that is not JSON (an object, bytes, NaN, a huge int) written as its ``repr``, keys as text, a
    circular or too-deep part as a marker. For error records whose ``jsonb_problem`` is not ``None``:
    they must be stored whatever they hold, and a readable approximation beats none."""
    budget = [_REWRITE_NODES]
    return _rewrite(value, 0, set(), budget)


def _rewrite(value: Any, depth: int, path: set[int], budget: list[int]) -> Any:
    budget[0] -= 1
    if budget[0] < 0:
        return "<truncated>"
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value if value.bit_length() <= _MAX_INT_BITS else f"<int of {value.bit_length()} bits>"
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, dict | list | tuple):
        if depth >= _REWRITE_DEPTH:
            return "<nested too deeply>"
        if id(value) in path:
            return "<circular reference>"
        path.add(id(value))
        try:
            if isinstance(value, dict):
                return {_key(key): _rewrite(child, depth + 1, path, budget) for key, child in value.items()}
            return [_rewrite(child, depth + 1, path, budget) for child in value]
        finally:
            path.discard(id(value))
    return _repr(value)


def _key(key: Any) -> str:
    return storable_text(key) if isinstance(key, str) else _repr(key)


def _repr(value: Any) -> str:
    # A repr is user code: it may raise, or return text Postgres refuses.
    try:
        return storable_text(repr(value))
    except Exception:
        return f"<unrepresentable {type(value).__name__}>"


def storable_record(error: dict[str, Any]) -> dict[str, Any]:
    """An attempt's error record as it can be stored: text made storable (``storable_error``), and a record
    ``jsonb`` would still refuse (a ``code`` that is not JSON, NaN, NUL or a lone surrogate inside it)
    rewritten by ``storable_json``, with ``unstorable`` saying what was wrong with it."""
    record = storable_error(error)
    problem = jsonb_problem(record)
    if problem is None:
        return record
    rewritten: dict[str, Any] = storable_json(record)
    rewritten["unstorable"] = (
        f"the error record could not be stored as it was ({problem}); what Postgres refuses is written as text"
    )
    return rewritten

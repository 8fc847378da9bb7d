"""Field-level differences between two JSON payloads: what a key conflict's rejected delivery changed
against the payload that holds the key (the ``key_conflicts`` report and an effect's lineage show them).
"""

from __future__ import annotations

from typing import Any

# A diff of two large payloads is cut here: the first differences say what went wrong, the hundredth does not.
MAX_DIFF_ENTRIES = 100


def payload_diff(held: Any, rejected: Any) -> tuple[list[dict[str, Any]], bool]:
    """The field-level differences between two JSON values, and whether the list was cut short.

    Each entry has a JSON Pointer ``path`` (RFC 6901), a ``change`` of ``changed``, ``added`` (only in the
    rejected payload) or ``removed`` (only in the held one), and the ``held`` and/or ``rejected`` value.
    Values of different JSON types differ even where Python would call them equal (``1`` and ``true``).
    """
    entries: list[dict[str, Any]] = []
    truncated = _diff(held, rejected, "", entries)
    return entries, truncated


_MISSING: Any = object()


def _children(held: Any, rejected: Any) -> list[tuple[str, Any, Any]] | None:
    # (JSON Pointer token, held child, rejected child) of two objects or two arrays; None for anything else.
    if isinstance(held, dict) and isinstance(rejected, dict):
        return [
            (str(k).replace("~", "~0").replace("/", "~1"), held.get(k, _MISSING), rejected.get(k, _MISSING))
            for k in sorted(held.keys() | rejected.keys())
        ]
    if isinstance(held, list) and isinstance(rejected, list):
        return [
            (str(i), held[i] if i < len(held) else _MISSING, rejected[i] if i < len(rejected) else _MISSING)
            for i in range(max(len(held), len(rejected)))
        ]
    return None


def _add(out: list[dict[str, Any]], entry: dict[str, Any]) -> bool:
    if len(out) >= MAX_DIFF_ENTRIES:
        return True
    out.append(entry)
    return False


def _diff(held: Any, rejected: Any, path: str, out: list[dict[str, Any]]) -> bool:
    children = _children(held, rejected)
    if children is None:
        if type(held) is type(rejected) and held == rejected:
            return False
        return _add(out, {"path": path, "change": "changed", "held": held, "rejected": rejected})
    for token, held_child, rejected_child in children:
        child = f"{path}/{token}"
        if rejected_child is _MISSING:
            entry = {"path": child, "change": "removed", "held": held_child}
        elif held_child is _MISSING:
            entry = {"path": child, "change": "added", "rejected": rejected_child}
        elif _diff(held_child, rejected_child, child, out):
            return True
        else:
            continue
        if _add(out, entry):
            return True
    return False

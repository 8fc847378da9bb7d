"""The effective configuration (``effectgate config show``): the file, the environment overrides over
it, and every default, by the settings declaration; in TOML or JSON.

The file never holds a secret — only the names of the variables or files that do — and those names are
shown as they are. What could still carry one is masked: a password in a URL (``tracing.endpoint``,
``downstream.*.base_url``) and a scheme option whose name says key, secret, token or password.

The TOML ends with the retry schedules those settings give (``retry_schedules``), as comments: a reader sees
how long an effect is retried before it fails for good, and ``tomllib`` still reads back the same values.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from effectgate.handlers.effect_kind import DEFAULT_MAX_ATTEMPTS, EffectKind
from effectgate.handlers.worker.backoff import RetrySchedule, kind_backoff
from effectgate.handlers.worker.config import WorkerConfig

from .settings import REQUIRED, SETTINGS, TABLES

MASK = "***"
_SECRETISH = re.compile(r"(secret|password|token|key)$", re.IGNORECASE)
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
# Tables shown only when the file has them: no [tracing] is no tracing; [reconciler] is an older spelling.
_ONLY_IF_PRESENT = {"tracing", "reconciler"}


def build(data: dict[str, Any]) -> dict[str, Any]:
    """Every declared key of every table in ``data`` (a parsed, overridden file), defaults filled in."""
    out: dict[str, Any] = {}
    for table in TABLES:
        first = table.split(".")[0].removesuffix("[]")
        if first in _ONLY_IF_PRESENT and first not in data:
            continue
        if first == "maintenance" and "reconciler" in data:
            continue  # the file uses the older spelling; the parser reads that one alone
        for path, source in _instances(data, table):
            where = _place(out, path)
            for setting in (s for s in SETTINGS if s.table == table):
                if setting.key in source:
                    value = source[setting.key]
                elif setting.default is None or setting.default is REQUIRED or setting.unless in source:
                    continue
                else:
                    value = setting.default
                where[setting.key] = _masked(value)
    pruned: dict[str, Any] = _prune(out)
    return pruned


def _instances(data: dict[str, Any], table: str) -> list[tuple[list[str], dict[str, Any]]]:
    # (its path in the output, the file's table) for each instance of a declared table.
    found: list[tuple[list[str], dict[str, Any]]] = [([], data)]
    for part in table.split("."):
        nxt: list[tuple[list[str], dict[str, Any]]] = []
        for path, source in found:
            if part == "*":
                nxt += [([*path, n], v) for n, v in source.items() if isinstance(v, dict)]
            elif part.endswith("[]"):
                items = source.get(part[:-2], [])
                nxt += [([*path, f"{part[:-2]}[{i}]"], v) for i, v in enumerate(items) if isinstance(v, dict)]
            else:
                value = source.get(part, {})
                nxt.append(([*path, part], value if isinstance(value, dict) else {}))
        found = nxt
    return found


def _place(out: dict[str, Any], path: list[str]) -> dict[str, Any]:
    node = out
    for part in path:
        match = re.fullmatch(r"(.+)\[(\d+)\]", part)
        if match:
            items = node.setdefault(match[1], [])
            while len(items) <= int(match[2]):
                items.append({})
            node = items[int(match[2])]
        else:
            node = node.setdefault(part, {})
    return node


def _masked(value: Any) -> Any:
    if isinstance(value, str) and "://" in value:
        parts = urlsplit(value)
        if parts.password:
            netloc = f"{parts.username}:{MASK}@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
            return urlunsplit(parts._replace(netloc=netloc))
    if isinstance(value, dict):
        return {
            k: MASK if _SECRETISH.search(k) and not k.endswith("_env") else _masked(v)
            for k, v in value.items()
        }
    return value


def _prune(node: Any) -> Any:
    # Tables with nothing in them (an absent optional one) are left out.
    if isinstance(node, dict):
        pruned = {k: _prune(v) for k, v in node.items()}
        return {k: v for k, v in pruned.items() if v != {} and v != [{}]}
    if isinstance(node, list):
        return [_prune(v) for v in node]
    return node


def retry_schedules(worker: WorkerConfig, kinds: Iterable[EffectKind]) -> str:
    """The waits after each failed attempt and their total, as TOML comments: for the worker's backoff at the
    default ``max_attempts``, then for each kind (Python or ``[effects.*]``) that sets a budget of its own."""
    lines = [
        "",
        "# Retry schedules: the wait after each failed attempt (drawn from [0.5, 1] x its ceiling), and the",
        "# total before the last attempt fails the effect for good. A longer Retry-After lengthens a wait.",
    ]

    def block(title: str, base: float, cap: float, attempts: int) -> None:
        lines.append(f"# {title}: backoff_base {base:g} s, backoff_cap {cap:g} s, max_attempts {attempts}")
        lines.extend(f"#   {line}" for line in RetrySchedule(base, cap, attempts).describe())

    block(
        "[worker], for kinds that set none of their own",
        worker.backoff_base,
        worker.backoff_cap,
        DEFAULT_MAX_ATTEMPTS,
    )
    for kind in sorted(kinds, key=lambda k: k.name):
        if (
            kind.max_attempts == DEFAULT_MAX_ATTEMPTS
            and kind.backoff_base is None
            and kind.backoff_cap is None
        ):
            continue
        block(f"kind {kind.name}", *kind_backoff(kind, worker), kind.max_attempts)
    return "\n".join(lines) + "\n"


def as_json(config: dict[str, Any]) -> str:
    return json.dumps(config, indent=2, sort_keys=False)


def as_toml(config: dict[str, Any]) -> str:
    """``config`` as TOML that ``tomllib`` reads back to the same values."""
    lines: list[str] = []
    _emit(config, [], lines)
    return "\n".join(lines).strip() + "\n"


def _emit(table: dict[str, Any], path: list[str], lines: list[str]) -> None:
    scalars = {k: v for k, v in table.items() if not _is_table(v) and not _is_tables(v)}
    if scalars or (path and not any(_is_table(v) for v in table.values())):
        if path:
            lines += ["", f"[{'.'.join(map(_key, path))}]"]
        lines += [f"{_key(k)} = {_value(v)}" for k, v in scalars.items()]
    for k, v in table.items():
        if _is_table(v):
            _emit(v, [*path, k], lines)
        elif _is_tables(v):
            for item in v:
                lines += ["", f"[[{'.'.join(map(_key, [*path, k]))}]]"]
                lines += [f"{_key(ik)} = {_value(iv)}" for ik, iv in item.items()]


def _is_table(value: Any) -> bool:
    return isinstance(value, dict)


def _is_tables(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def _key(key: str) -> str:
    return key if _BARE_KEY.match(key) else json.dumps(key)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")

"""``EFFECTGATE_<SECTION>__<KEY>`` environment overrides, typed by the settings declaration.

``EFFECTGATE_GATEWAY__CLAIM_DEADLINE=3`` sets ``[gateway] claim_deadline``; a nested table joins its
names with ``__`` (``EFFECTGATE_GATEWAY__PENALTY_BOX__COOLING``), and a key of a named table names the
table as the file spells it, upper-cased with ``-`` as ``_`` (``EFFECTGATE_SOURCES__STRIPE__TOLERANCE``
for ``[sources.stripe]``, which the file must have). The environment wins over the file; a command-line
flag wins over both. Only variables with ``__`` after ``EFFECTGATE_`` are read here, so the older single
variables (``EFFECTGATE_DATABASE_URL``, ``EFFECTGATE_CONFIG``, …) keep their own meaning; the deprecated
``EFFECTGATE_STARTUP_WAIT`` and ``EFFECTGATE_MIGRATION_WAIT`` are read by ``gateway.cli.flags.database_wait``.
"""

from __future__ import annotations

import copy
import difflib
from collections.abc import Mapping
from typing import Any

from .settings import SETTINGS, Setting

PREFIX = "EFFECTGATE_"

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def override(
    data: dict[str, Any], env: Mapping[str, str], origins: dict[str, str] | None = None
) -> tuple[dict[str, Any], list[str]]:
    """``data`` (a parsed file) with every override in ``env`` applied, and a problem per bad variable,
    each naming it. ``data`` itself is not changed; ``origins``, when given, gets the variable that set
    each key (``sources.my-src.tenant`` → ``EFFECTGATE_SOURCES__MY_SRC__TENANT``)."""
    out = copy.deepcopy(data)
    problems = []
    for var in sorted(env):
        if not var.startswith(PREFIX) or "__" not in var[len(PREFIX) :]:
            continue
        try:
            where = _apply(out, var, env[var])
        except ValueError as exc:
            problems.append(f"environment {var}: {exc}")
        else:
            if origins is not None:
                origins[where] = var
    return out, problems


def mention(problems: list[str], path: str, origins: Mapping[str, str]) -> list[str]:
    """``problems`` with the variable named after each one about a key the environment set: a rule across
    keys (claim_lock_timeout below claim_statement_timeout) names the key, which the file may not set."""
    out = []
    for problem in problems:
        for key, var in origins.items():
            if problem.startswith(f"{path}: {key}: "):
                problem += f" (set by {var})"
                break
        out.append(problem)
    return out


def _apply(data: dict[str, Any], var: str, text: str) -> str:
    tokens = var[len(PREFIX) :].split("__")
    if tokens[0].lower() == "operators":
        raise ValueError("[[operators]] entries cannot be set from the environment; set them in the file")
    table: dict[str, Any] = data
    pattern: list[str] = []
    concrete: list[str] = []
    for depth, token in enumerate(tokens):
        last = depth == len(tokens) - 1
        fixed = ".".join([*pattern, token.lower()])
        if last:
            setting = _setting(".".join(pattern), token.lower())
            table[token.lower()] = parse_value(setting, text)
            return ".".join([*concrete, token.lower()])
        if any(s.path.startswith(fixed + ".") for s in SETTINGS):
            pattern.append(token.lower())
            concrete.append(token.lower())
            table = _subtable(table, token.lower())
        elif any(s.path.startswith(".".join([*pattern, "*"]) + ".") for s in SETTINGS):
            names = [n for n in table if isinstance(table[n], dict) and _spelled(n) == token]
            if not names:
                section = ".".join(pattern)
                raise ValueError(
                    f"the file has no [{section}.NAME] spelt {token} (upper-cased, '-' as '_'); "
                    f"the environment sets keys of the {section} tables the file declares, it adds none"
                )
            pattern.append("*")
            concrete.append(names[0])
            table = table[names[0]]
        else:
            raise ValueError(f"{fixed} is not a known table{_close(fixed)}")
    raise ValueError("names no setting")  # unreachable: the loop returns at its last token


def _spelled(name: str) -> str:
    return name.upper().replace("-", "_")


def _subtable(table: dict[str, Any], key: str) -> dict[str, Any]:
    value = table.setdefault(key, {})
    if not isinstance(value, dict):
        raise ValueError(f"the file's {key} is not a table")
    return value


def _close(path: str) -> str:
    env_names = [s.path for s in SETTINGS]
    close = difflib.get_close_matches(path, env_names, n=1, cutoff=0.6)
    if not close:
        return " (a typo?)"
    var = BY_PATH_ENV.get(close[0])
    return f"; did you mean {var}?" if var else f"; did you mean {close[0]}?"


def _setting(table: str, key: str) -> Setting:
    path = f"{table}.{key}" if table else key
    for setting in SETTINGS:
        if setting.path == path:
            if setting.env_var is None:
                raise ValueError(f"{path} cannot be set from the environment; set it in the file")
            return setting
    raise ValueError(f"{path} is not a known setting{_close(path)}")


def parse_value(setting: Setting, text: str) -> Any:
    """``text`` as a value of ``setting``; ``ValueError`` saying what was expected."""
    kind = setting.kind
    value: Any
    if kind == "string":
        value = text
    elif kind == "boolean":
        if text.strip().lower() not in _TRUE | _FALSE:
            raise ValueError(f"expected true or false, got {text!r}")
        value = text.strip().lower() in _TRUE
    elif kind == "strings":
        value = [part.strip() for part in text.split(",") if part.strip()]
    elif kind == "header":
        value = False if text.strip().lower() == "false" else text
    elif kind == "days" and text.strip() == "forever":
        value = "forever"
    elif kind in ("integer", "number", "days"):
        value = _number(text, integer=kind == "integer")
        _bounds(setting, value)
    else:
        raise ValueError(f"{setting.path} cannot be set from the environment; set it in the file")
    if setting.choices is not None and value not in setting.choices:
        raise ValueError(f"expected one of {', '.join(map(str, setting.choices))}, got {text!r}")
    return value


def _number(text: str, *, integer: bool) -> int | float:
    try:
        return int(text.strip())
    except ValueError:
        if integer:
            raise ValueError(f"expected an integer, got {text!r}") from None
    try:
        value = float(text.strip())
    except ValueError:
        raise ValueError(f"expected a number, got {text!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"expected a finite number, got {text!r}")
    return value


def _bounds(setting: Setting, value: float) -> None:
    low = setting.minimum
    if low is not None and (value <= low if setting.exclusive_minimum else value < low):
        raise ValueError(f"must be {'>' if setting.exclusive_minimum else '>='} {low:g}, got {value!r}")
    if setting.maximum is not None and value > setting.maximum:
        raise ValueError(f"must be <= {setting.maximum:g}, got {value!r}")


BY_PATH_ENV = {s.path: s.env_var for s in SETTINGS}

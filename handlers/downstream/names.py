"""Which ``[downstream.NAME]`` a handler asks for, read from its source before the first job runs.

``ctx.downstream("carier")`` with a name the configuration lacks would otherwise fail only when a job
reaches it, after start-up and maybe after earlier steps ran. Every literal name in a handler's own source
(nested functions and lambdas included) is checked at start; a name computed at run time, or asked for in a
helper outside the handler, is checked when it is asked for (``TerminalError`` ``unknown_downstream``).
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Callable, Collection, Iterator
from typing import Any

from ..registry import Registry

__all__ = ["check_downstream_names"]


def check_downstream_names(
    registry: Registry, configured: Collection[str], skip_sources: Collection[str] = ()
) -> list[str]:
    """Problems: each effect handler that asks for ``ctx.downstream(NAME)`` with a literal ``NAME`` that is
    not configured, named by the handler's file and line and listing the configured names. Effects of a
    source in ``skip_sources`` never run in this deployment, so what they ask for is not checked."""
    known = ", ".join(sorted(configured)) or "none"
    problems = []
    for kind in registry.kinds():
        if kind.source in skip_sources:
            continue
        for name, where in _names_asked(kind.fn):
            if name not in configured:
                problems.append(
                    f"{where}: effect {kind.name!r} asks for ctx.downstream({name!r}), which is not configured: "
                    f"add [downstream.{name}] (configured: {known})"
                )
    return problems


def _names_asked(fn: Callable[..., Any]) -> Iterator[tuple[str, str]]:
    fn = inspect.unwrap(fn)
    try:
        lines, first = inspect.getsourcelines(fn)
        path = inspect.getsourcefile(fn) or "<unknown>"
    except (OSError, TypeError):  # no source to read (built in, generated): checked at run time instead
        return
    try:
        tree = ast.parse(textwrap.dedent("".join(lines)))
    except SyntaxError:
        return
    calls = sorted(
        (n for n in ast.walk(tree) if isinstance(n, ast.Call)), key=lambda n: (n.lineno, n.col_offset)
    )
    for node in calls:
        if (
            isinstance(node.func, ast.Attribute)
            and node.func.attr == "downstream"
            and len(node.args) == 1
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.args[0].value, f"{path}:{first + node.lineno - 1}"

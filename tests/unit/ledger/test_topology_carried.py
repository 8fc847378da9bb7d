"""What the database is travels as a ``Topology`` on the process's ledger handle, never as a bare flag or a cache
in a module (issue: "one ledger handle").

Read from the source with ``ast``: no function of the packages takes a ``per_tenant`` flag (the word once meant
"distributed" in one place and "claims are routed" in another), and no module of ``ledger/`` keeps a module-level
weak-keyed cache of answers beside the pools. Each check is shown to fail on a small source of its own.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("gateway", "handlers", "ledger")
FLAGS = {"per_tenant"}


def flag_parameters(source: str) -> list[tuple[int, str]]:
    """(line, name) of every function parameter named like a bare topology flag."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            a = node.args
            for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs]:
                if arg.arg in FLAGS:
                    found.append((node.lineno, f"{node.name}({arg.arg})"))
    return found


def module_caches(source: str) -> list[tuple[int, str]]:
    """(line, target) of every module-level assignment of a ``WeakKeyDictionary``."""
    found = []
    for node in ast.parse(source).body:
        value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
        if isinstance(value, ast.Call) and "WeakKeyDictionary" in ast.unparse(value.func):
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            found.append((node.lineno, ast.unparse(target)))
    return found


def sources(*folders: str) -> list[Path]:
    return [p for folder in folders for p in sorted((ROOT / folder).rglob("*.py"))]


def test_no_function_takes_a_bare_topology_flag() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line} {name}"
        for path in sources(*PACKAGES)
        for line, name in flag_parameters(path.read_text())
    ]
    assert found == []


def test_no_ledger_module_caches_answers_beside_the_pools() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line} {name}"
        for path in sources("ledger")
        for line, name in module_caches(path.read_text())
    ]
    assert found == []


def test_the_checks_see_what_they_forbid() -> None:
    assert flag_parameters("async def fetch(conn, *, per_tenant=False): ...") == [(1, "fetch(per_tenant)")]
    assert flag_parameters("def fetch(conn, *, topology): ...") == []
    cached = "import weakref\n_by_pool: weakref.WeakKeyDictionary[int, int] = weakref.WeakKeyDictionary()\n"
    assert module_caches(cached) == [(2, "_by_pool")]
    assert module_caches("def f():\n    cache = weakref.WeakKeyDictionary()\n") == []

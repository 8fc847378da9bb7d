"""No module under tests/ imports a test module (a file named ``test_*.py``), nor a test from anywhere (issue 52,
item 5).

A test module holds tests. What two modules share lives in a helpers module named for what it holds
(tests/integration/jobs_and_workers.py, tests/e2e/schemes.py, tests/citus/ledger.py), and a fixture in the conftest.py
of the folder that holds every test using it, where pytest finds it. Importing a test module runs its module-level
code in the importer and hides from whoever edits it that something else leans on it; an imported fixture is a
second fixture of the same body (a session-scoped one built twice); an imported ``test_*`` function is collected
again; and, run from a checkout whose folder name is an identifier, the absolute name loads the module a second time
(docs/adr/0022-the-namespace-in-the-tree.md).

Every ``import`` and ``from … import`` of every ``.py`` file under tests/ is read with ``ast`` — at module level and
inside functions — plus ``importlib.import_module("…")`` with a literal name. What fails: a module of the suite
(``tests.…``, or any relative import) whose last part starts with ``test_``, or a name starting with ``test_``
imported from one (``from tests.a import test_x``: a test module, or a test function). The checker is tested on a
small source of its own, so "nothing found" cannot mean "nothing seen".
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
TESTS = ROOT / "tests"


def _is_test(name: str) -> bool:
    return name.rpartition(".")[2].startswith("test_")


def imports_of_tests(source: str, module: str, *, package: bool = False) -> list[tuple[int, str]]:
    """(line, imported name) for every import of a test module, or of a test, in ``source``: the text of the module
    named ``module`` (``tests.a.b``; ``package`` when it is an ``__init__.py``, the base of its relative imports)."""
    base = module.split(".") if package else module.split(".")[:-1]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [
                (node.lineno, a.name) for a in node.names if a.name.startswith("tests.") and _is_test(a.name)
            ]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parent = base[: len(base) - (node.level - 1)]
                target = ".".join([*parent, node.module] if node.module else parent)
            else:
                target = node.module or ""
            # Every relative import stays inside the suite; an absolute one, only when it names tests.
            if not (node.level or target == "tests" or target.startswith("tests.")):
                continue
            if _is_test(target):
                found.append((node.lineno, target))
            found += [(node.lineno, f"{target}.{a.name}") for a in node.names if _is_test(a.name)]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and node.args[0].value.startswith("tests.")
            and _is_test(node.args[0].value)
        ):
            found.append((node.lineno, node.args[0].value))
    return sorted(found)


def suite_test_imports(tests: Path = TESTS) -> list[str]:
    """``path:line: name`` for every import of a test module, or of a test, by a ``.py`` file under ``tests``."""
    found = []
    for path in sorted(tests.rglob("*.py")):
        relative = path.relative_to(tests.parent)
        module = ".".join(relative.with_suffix("").parts)
        package = path.name == "__init__.py"
        if package:
            module = module.rpartition(".")[0]
        for line, name in imports_of_tests(path.read_text(encoding="utf-8"), module, package=package):
            found.append(f"{relative}:{line}: {name}")
    return found


def test_no_module_of_the_suite_imports_a_test_module() -> None:
    found = suite_test_imports()
    assert found == [], (
        "these import a test module or a test; move what they use into a helpers module named for what it holds "
        "(a fixture into the conftest.py of the folder holding every test that uses it):\n" + "\n".join(found)
    )


SOURCE = """\
from .test_x import y
from tests.a.test_x import y
import tests.a.test_x
from tests.a import helpers, test_x
from ..test_z import w
import importlib
importlib.import_module("tests.a.test_x")


def f():
    from . import test_late


from .helpers import y
from tests.a.helpers import y
import tests.a.helpers
from test_support import y
import pytest
"""


def test_the_checker_finds_test_modules_imported_in_every_spelling() -> None:
    assert imports_of_tests(SOURCE, "tests.a.b.test_me") == [
        (1, "tests.a.b.test_x"),
        (2, "tests.a.test_x"),
        (3, "tests.a.test_x"),
        (4, "tests.a.test_x"),
        (5, "tests.a.test_z"),
        (7, "tests.a.test_x"),
        (11, "tests.a.b.test_late"),
    ]


def test_relative_imports_of_a_package_resolve_from_the_package_itself() -> None:
    assert imports_of_tests("from .test_x import y\n", "tests.a", package=True) == [(1, "tests.a.test_x")]
    assert imports_of_tests("from .test_x import y\n", "tests.a.b") == [(1, "tests.a.test_x")]


def test_the_suite_walk_names_the_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "tests" / "a").mkdir(parents=True)
    (tmp_path / "tests" / "a" / "test_one.py").write_text("import os\nfrom .test_two import helper\n")
    (tmp_path / "tests" / "a" / "test_two.py").write_text("def helper(): ...\n")
    (tmp_path / "tests" / "a" / "helpers.py").write_text("from tests.a.test_two import helper\n")
    assert suite_test_imports(tmp_path / "tests") == [
        "tests/a/helpers.py:1: tests.a.test_two",
        "tests/a/test_one.py:2: tests.a.test_two",
    ]

"""Every third-party module a test imports comes from a distribution pyproject.toml declares directly.

A package left on a developer's machine (or arriving as someone else's dependency) hides a missing
declaration until CI runs on a fresh machine: `websockets` once came with `uvicorn[standard]`, the extra was
dropped, and the dashboard test stopped collecting on every new machine. So the check is strict: the
distribution must be named in `dependencies`, the `dev` extra (or an extra `dev` names), or — for the
benchmarks under `tests/bench/` only — the `bench` extra. A transitive arrival does not count.

`.ci/run` runs the suite in a virtual environment made from those declarations alone, so a module that is
declared nowhere fails there as an import error too; this test says which declaration is missing.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[3]
TESTS = ROOT / "tests"
# Names that resolve inside the repository, not to an installed distribution.
LOCAL = {"effectgate", "tests", "conftest"} | {p.name for p in ROOT.iterdir() if p.is_dir()}


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared(*extras: str) -> set[str]:
    """Distributions named directly by the runtime dependencies and ``extras`` (self-references followed)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    optional: dict[str, list[str]] = project.get("optional-dependencies", {})
    names: set[str] = set()
    pending = [*project["dependencies"], *(req for extra in extras for req in optional[extra])]
    seen_extras = set(extras)
    while pending:
        requirement = Requirement(pending.pop())
        if _normalise(requirement.name) == _normalise(project["name"]):
            for extra in requirement.extras - seen_extras:
                seen_extras.add(extra)
                pending.extend(optional[extra])
            continue
        names.add(_normalise(requirement.name))
    return names


def _third_party_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            modules = [node.module]
        else:
            continue
        for module in modules:
            top = module.split(".")[0]
            if top not in sys.stdlib_module_names and top not in LOCAL:
                found.add(top)
    return found


def undeclared_imports(paths: list[Path]) -> list[str]:
    """One line per (file, module) whose distribution is not declared where that file's tests need it."""
    owners = packages_distributions()
    for_tests = _declared("dev")
    for_benchmarks = for_tests | _declared("bench")
    bench_only = for_benchmarks - for_tests
    problems = []
    for path in paths:
        path_is_benchmark = (TESTS / "bench") in path.parents
        allowed = for_benchmarks if path_is_benchmark else for_tests
        for module in sorted(_third_party_imports(path)):
            distributions = {_normalise(d) for d in owners.get(module, [])}
            where = path.relative_to(ROOT) if ROOT in path.parents else path.name
            if not distributions and path_is_benchmark and _normalise(module) in bench_only:
                continue  # the bench extra is installed by `make bench`, not into the test environment
            if not distributions:
                problems.append(f"{where}: imports {module!r}, which no installed distribution provides")
            elif not distributions & allowed:
                problems.append(
                    f"{where}: imports {module!r} from {', '.join(sorted(distributions))}, which pyproject.toml "
                    "does not declare (add it to the dev extra)"
                )
    return problems


# A user's project with its own package; what it imports is checked by running it in a venv holding only
# the wheel and pytest (tests/e2e/test_wheel.py).
SAMPLE_PROJECT = TESTS / "data" / "sample_user_project"


def test_every_test_import_is_declared_in_pyproject() -> None:
    paths = [p for p in TESTS.rglob("*.py") if SAMPLE_PROJECT not in p.parents]
    assert undeclared_imports(sorted(paths)) == []


def test_the_check_reports_undeclared_and_missing_modules(tmp_path: Path) -> None:
    # h11 arrives with uvicorn, yet nothing here declares it: exactly the "it was just there" case.
    probe = tmp_path / "test_probe.py"
    probe.write_text(
        "import os\nimport yaml\nimport h11\nimport not_a_module_anywhere\n"
        "from . import sibling\nimport tests.conftest\n"
    )
    assert undeclared_imports([probe]) == [
        "test_probe.py: imports 'h11' from h11, which pyproject.toml does not declare (add it to the dev extra)",
        "test_probe.py: imports 'not_a_module_anywhere', which no installed distribution provides",
    ]


def test_benchmark_only_dependencies_count_only_for_benchmarks() -> None:
    assert "pgqueuer" in _declared("bench") and "pgqueuer" not in _declared("dev")
    assert {"pytest", "opentelemetry-sdk", "psycopg"} <= _declared("dev")

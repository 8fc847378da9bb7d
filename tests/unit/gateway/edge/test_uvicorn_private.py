"""gateway/edge/uvicorn_private.py, read from the code: the one home of uvicorn's private imports and underscore
names, its list of the uvicorn names the edge uses complete, and its tested range pyproject's.

What uvicorn's classes define is read from the installed uvicorn's source with ``ast``, so at a new release a
name the edge uses that moved between classes, or a new uvicorn name that one of the guard's own attributes
now shadows, shows up here.
"""

from __future__ import annotations

import ast
import inspect
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from effectgate.gateway.edge import uvicorn_private

ROOT = Path(__file__).resolve().parents[4]
EDGE = ROOT / "gateway" / "edge"
HOME = EDGE / "uvicorn_private.py"
# The modules that build on uvicorn's private classes; only HOME may touch their underscore names.
USERS = (EDGE / "guard.py", EDGE / "supervisor.py")
PRIVATE_PACKAGES = ("uvicorn.protocols", "uvicorn.supervisors")
PROJECT_FOLDERS = ("gateway", "handlers", "ledger")


def private_imports(source: str) -> list[str]:
    """The modules under ``uvicorn.protocols`` / ``uvicorn.supervisors`` that ``source`` imports, by line."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            # `from uvicorn import supervisors` names the package as an attribute of its parent.
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        else:
            continue
        hits = [name for name in names if name.startswith(PRIVATE_PACKAGES)]
        if hits:
            found.append(f"{node.lineno}: {hits[0]}")
    return found


def uvicorn_names() -> set[str]:
    """Every method and instance attribute uvicorn's classes named in ``uvicorn_private`` define themselves."""
    names: set[str] = set()
    for cls in (
        uvicorn_private.HttpToolsProtocol,
        uvicorn_private.RequestResponseCycle,
        uvicorn_private.Multiprocess,
    ):
        [body] = ast.parse(inspect.getsource(cls)).body
        assert isinstance(body, ast.ClassDef)
        names |= {n.name for n in body.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
        names |= {
            n.attr
            for n in ast.walk(body)
            if isinstance(n, ast.Attribute)
            and isinstance(n.ctx, ast.Store)
            and isinstance(n.value, ast.Name)
            and n.value.id == "self"
        }
    return {name for name in names if not (name.startswith("__") and name.endswith("__"))}


def used_names(source: str) -> set[str]:
    """Attribute names ``source`` reads, writes or calls, and the methods its classes define (overrides)."""
    tree = ast.parse(source)
    names = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        names |= {n.name for n in cls.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    return names


def listed_names(docstring: str) -> set[str]:
    """Every name the docstring shows as ``code``, dotted paths split into their parts."""
    return {part for shown in re.findall(r"``([\w.]+)``", docstring) for part in shown.split(".")}


def unlisted(source: str, uvicorn: set[str], docstring: str) -> list[str]:
    return sorted((used_names(source) & uvicorn) - listed_names(docstring))


# -- the rules, on the real tree -------------------------------------------------------------------


def test_the_tested_range_is_pyprojects_uvicorn_requirement() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    [requirement] = [r for r in map(Requirement, project["dependencies"]) if r.name == "uvicorn"]
    tested = SpecifierSet(f">={uvicorn_private.FLOOR},<{uvicorn_private.CEILING}")
    assert requirement.specifier == tested, (str(requirement.specifier), str(tested))


def test_only_uvicorn_private_imports_uvicorns_private_packages() -> None:
    importers = {}
    for folder in PROJECT_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            found = private_imports(path.read_text(encoding="utf-8"))
            if found and path != HOME:
                importers[str(path.relative_to(ROOT))] = found
    assert importers == {}
    assert private_imports(HOME.read_text(encoding="utf-8"))


def test_the_guard_and_the_supervisor_call_no_underscore_name_of_uvicorns() -> None:
    underscored = {name for name in uvicorn_names() if name.startswith("_")}
    # Read from uvicorn itself: the parser loop's calls the module wraps are among them.
    assert {"_unset_keepalive_if_required", "_should_upgrade", "_unsupported_upgrade_warning"} <= underscored
    touched = {path.name: used_names(path.read_text(encoding="utf-8")) & underscored for path in USERS}
    assert touched == {path.name: set() for path in USERS}


def test_every_uvicorn_name_the_edge_uses_is_listed_in_the_module() -> None:
    uvicorn = uvicorn_names()
    docstring = uvicorn_private.__doc__ or ""
    missing = {
        path.name: unlisted(path.read_text(encoding="utf-8"), uvicorn, docstring) for path in (*USERS, HOME)
    }
    assert missing == {path.name: [] for path in (*USERS, HOME)}
    # Spot checks that each class is read: the protocol's, the cycle's and the supervisor's names.
    assert {"data_received", "pipeline", "more_body", "keep_subprocess_alive"} <= uvicorn


# -- the checks, on code of their own --------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ("from uvicorn.protocols.utils import get_remote_addr\n", ["1: uvicorn.protocols.utils"]),
        ("def f():\n    import uvicorn.supervisors.multiprocess\n", ["2: uvicorn.supervisors.multiprocess"]),
        ("from uvicorn import Config, supervisors\n", ["1: uvicorn.supervisors"]),
        ("import uvicorn\nfrom uvicorn import Config, Server\n", []),
    ],
)
def test_the_import_check_finds_a_private_package(source: str, found: list[str]) -> None:
    assert private_imports(source) == found


def test_the_listing_check_finds_an_unlisted_name_and_a_shadowed_one() -> None:
    source = (
        "class P(HttpToolsProtocol):\n"
        "    def on_body(self, body):\n"  # listed in the module
        "        self.flow.pause_reading()\n"  # uvicorn's flow control, not listed
        "    def send_400_response(self, msg):\n"  # a method of its own, shadowing uvicorn's
        "        pass\n"
    )
    assert unlisted(source, uvicorn_names(), uvicorn_private.__doc__ or "") == ["flow", "send_400_response"]

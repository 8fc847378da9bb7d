"""The one-way rule, checked: gateway -> handlers -> ledger, signatures on their own, no import cycles, and the
gateway's rooms (LAYOUT.md): the edge imports only metrics and its [gateway] values, configuration nothing of what
it configures, the fakes only the CLI and the kit, uvicorn's private modules only the edge.

Every ``import`` and ``from … import`` of every module is read with ``ast`` — at module level, inside
functions, under ``if TYPE_CHECKING:`` — plus ``importlib.import_module("…")`` with a literal name.

TYPE_CHECKING-only imports count like any other, for the layers and for cycles. They do not run, but they
are still a dependency of the code's meaning: a ledger module that names a handler type in an annotation
cannot be type-checked, read or moved without the handler side, and a "cycle broken by TYPE_CHECKING"
is the same two modules that cannot be understood apart. The graph is module to module; importing
``a.b.c`` is an edge to ``a.b.c`` only, not to the packages ``a`` and ``a.b`` above it (every submodule
would otherwise be in a cycle with its own package's ``__init__``).

The checker is tested on a small tree of its own, so "the rules pass" cannot mean "the checker sees nothing".
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

from tests.unit.project.project_modules import FOLDERS, KIT, Module, project_modules


def _nearest_module(target: str, modules: Mapping[str, Module]) -> str | None:
    # `from effectgate.ledger.db import Conn` names an attribute, not a module: the nearest module above
    # it is what is imported. Names outside the project (stdlib, third party) give None.
    while target and target not in modules:
        target = target.rpartition(".")[0]
    return target or None


def _imports(module: Module, modules: Mapping[str, Module]) -> Iterable[str | None]:
    tree = ast.parse(module.path.read_text(encoding="utf-8"), filename=str(module.path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield _nearest_module(alias.name, modules)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            for alias in node.names:
                # `from pkg import sub` imports the module pkg.sub when there is one, else pkg itself.
                sub = f"{target}.{alias.name}"
                yield sub if sub in modules else _nearest_module(target, modules)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield _nearest_module(node.args[0].value, modules)


def import_graph(modules: Mapping[str, Module]) -> dict[str, set[str]]:
    """Module -> the project modules it imports (anywhere in its source)."""
    return {
        name: {t for t in _imports(module, modules) if t is not None and t != name}
        for name, module in modules.items()
    }


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


# (who, may import only within / may not import, reason). A module of the first package may import the
# project's modules only from the allowed packages.
ALLOWED = [
    ("effectgate.ledger", ("effectgate.ledger",), "the ledger imports nothing else of the project"),
    (
        "effectgate.gateway.signatures",
        ("effectgate.gateway.signatures",),
        "signature schemes import nothing else of the project",
    ),
    ("effectgate.migrations", ("effectgate.migrations",), "migrations are data"),
    (
        "effectgate.handlers",
        ("effectgate.handlers", "effectgate.ledger"),
        "handlers know nothing of the gateway (HTTP)",
    ),
    ("effectgate", ("effectgate.handlers", "effectgate.ledger"), "the public API is the handler side"),
]


def layer_violations(graph: Mapping[str, set[str]]) -> list[str]:
    """Every edge that breaks the one-way rule, as ``a -> b: why``."""
    found = []
    for source, targets in sorted(graph.items()):
        for who, allowed, why in ALLOWED:
            if (source == who if who == "effectgate" else _within(source, who)) and not all(
                any(_within(t, a) for a in allowed) for t in targets
            ):
                bad = sorted(t for t in targets if not any(_within(t, a) for a in allowed))
                found += [f"{source} -> {t}: {why}" for t in bad]
                break
    return found


# The gateway's rooms (LAYOUT.md): (who, what of the project it may import, reason).
ROOMS = [
    (
        "effectgate.gateway.edge",
        ("effectgate.gateway.edge", "effectgate.gateway.metrics", "effectgate.gateway.config.gateway"),
        "the edge imports only metrics, itself and the [gateway] values it is configured with",
    ),
]
# (who, what it may not import, reason).
FORBIDDEN = [
    (
        "effectgate.gateway.config",
        (
            "effectgate.gateway.edge",
            "effectgate.gateway.ingress",
            "effectgate.gateway.operator",
            "effectgate.gateway.cli",
        ),
        "configuration is read before anything it configures, and knows none of it",
    ),
]
# The fake providers serve `effectgate fake-providers` and the testing kit; production code never reaches them.
FAKES = "effectgate.gateway.fakes"
FAKES_IMPORTERS = ("effectgate.gateway.cli", "effectgate.testing", FAKES)
# uvicorn's private parts (docs/adr/0009): only the edge reaches into them, inside a tested version range.
UVICORN_PRIVATE = ("uvicorn.protocols", "uvicorn.supervisors")
EDGE = "effectgate.gateway.edge"


def room_violations(graph: Mapping[str, set[str]]) -> list[str]:
    """Every edge that breaks a rule between the gateway's rooms, as ``a -> b: why``."""
    found = []
    for source, targets in sorted(graph.items()):
        for who, allowed, why in ROOMS:
            if _within(source, who):
                found += [
                    f"{source} -> {t}: {why}"
                    for t in sorted(targets)
                    if not any(_within(t, a) for a in allowed)
                ]
        for who, forbidden, why in FORBIDDEN:
            if _within(source, who):
                found += [
                    f"{source} -> {t}: {why}"
                    for t in sorted(targets)
                    if any(_within(t, f) for f in forbidden)
                ]
        if not any(_within(source, a) for a in FAKES_IMPORTERS):
            found += [
                f"{source} -> {t}: only the CLI and the testing kit run the fakes"
                for t in sorted(targets)
                if _within(t, FAKES)
            ]
    return found


def uvicorn_private_importers(modules: Mapping[str, Module]) -> list[str]:
    """Modules that import uvicorn's private modules, anywhere in their source."""
    found = []
    for name, module in sorted(modules.items()):
        for node in ast.walk(ast.parse(module.path.read_text(encoding="utf-8"))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            found += [
                f"{name} -> {n}"
                for n in names
                if any(n == p or n.startswith(p + ".") for p in UVICORN_PRIVATE)
            ]
    return found


def kit_importers(graph: Mapping[str, set[str]]) -> list[str]:
    """Edges into the testing kit from outside it: the kit composes gateway, handlers and ledger (as the
    CLI does) for users' tests, so nothing that runs in production may depend on it."""
    kit = KIT[1]
    return [
        f"{source} -> {t}"
        for source, targets in sorted(graph.items())
        if not _within(source, kit)
        for t in sorted(targets)
        if _within(t, kit)
    ]


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def asyncio_run_calls(modules: Mapping[str, Module]) -> list[str]:
    """Modules that call ``asyncio.run`` (by attribute, or imported from asyncio)."""
    found = []
    for name, module in sorted(modules.items()):
        tree = ast.parse(module.path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            direct = (
                isinstance(node, ast.Attribute)
                and node.attr == "run"
                and isinstance(node.value, ast.Name)
                and node.value.id == "asyncio"
            )
            imported = (
                isinstance(node, ast.ImportFrom)
                and node.module == "asyncio"
                and any(a.name == "run" for a in node.names)
            )
            if direct or imported:
                found.append(f"{name}:{node.lineno}")
    return found


# Packages that would make a layer an HTTP server: the handler side calls APIs (httpx) but serves none.
SERVER_PACKAGES = ("starlette", "uvicorn")


def server_imports(modules: Mapping[str, Module], within: str) -> list[str]:
    """Modules under ``within`` that import an HTTP server package, anywhere in their source."""
    found = []
    for name, module in sorted(modules.items()):
        if not (_within(name, within) or (within == "effectgate.handlers" and name == "effectgate")):
            continue
        for node in ast.walk(ast.parse(module.path.read_text(encoding="utf-8"))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            found += [f"{name} -> {n}" for n in names if n.split(".")[0] in SERVER_PACKAGES]
    return found


# -- the rules, on the real tree -------------------------------------------------------------------


def test_every_folder_is_read() -> None:
    modules = project_modules()
    for must in (
        "effectgate",
        "effectgate.ledger.claims",
        "effectgate.handlers.worker.runtime",
        "effectgate.gateway.cli",
        "effectgate.gateway.signatures.stripe",
        "effectgate.gateway.fakes.providers",
        "effectgate.testing.context",
        "effectgate.testing.pytest_plugin",
    ):
        assert must in modules
    graph = import_graph(modules)
    # Spot checks that imports of every form are seen: relative, absolute, inside a function, by name.
    assert "effectgate.ledger.db" in graph["effectgate.ledger.claims"]
    assert "effectgate.gateway.fakes.providers" in graph["effectgate.gateway.cli.up"]  # in a function
    assert "effectgate.gateway.app" in graph["effectgate.gateway.cli.serve"]  # in a function
    assert "effectgate.handlers" in graph["effectgate"]  # importlib.import_module("effectgate.handlers")
    assert "effectgate.handlers.context" in graph["effectgate.handlers.effect_kind"]  # under TYPE_CHECKING


def test_dependencies_point_one_way() -> None:
    assert layer_violations(import_graph(project_modules())) == []


def test_nothing_of_the_project_imports_the_testing_kit() -> None:
    graph = import_graph(project_modules())
    assert "effectgate.handlers.context" in graph["effectgate.testing.context"]
    assert kit_importers(graph) == []


def test_the_gateways_rooms_keep_their_rules() -> None:
    graph = import_graph(project_modules())
    assert "effectgate.gateway.metrics" in graph["effectgate.gateway.edge.guard"]
    assert "effectgate.gateway.fakes.providers" in graph["effectgate.gateway.cli.up"]
    assert room_violations(graph) == []


def test_only_the_edge_imports_uvicorns_private_modules() -> None:
    importers = uvicorn_private_importers(project_modules())
    # The edge does reach into uvicorn (the guarded protocol, the supervisor), so the rule is not vacuous.
    assert any(".supervisors" in i for i in importers)
    assert any(".protocols" in i for i in importers)
    assert [i for i in importers if not _within(i.split(" -> ")[0], EDGE)] == []


def test_no_import_cycles() -> None:
    assert cycles(import_graph(project_modules())) == []


def test_handlers_and_ledger_serve_no_http() -> None:
    modules = project_modules()
    assert server_imports(modules, "effectgate.handlers") == []
    assert server_imports(modules, "effectgate.ledger") == []


def test_asyncio_run_only_in_the_composition_root() -> None:
    calls = asyncio_run_calls(project_modules())
    # The pytest plugin is a composition root of its own (a test session's): it migrates the template
    # ledger from a plain fixture, so it serves tests of any async runner.
    roots = ("effectgate.gateway.cli:", "effectgate.gateway.cli.", "effectgate.testing.pytest_plugin:")
    assert calls and all(c.startswith(roots) for c in calls), calls


# -- the checker, on a tree of its own -------------------------------------------------------------


def _tree(tmp_path: Path, files: Mapping[str, str]) -> dict[str, Module]:
    for relative, text in files.items():
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (tmp_path / "handlers" / "_effectgate").mkdir(parents=True, exist_ok=True)
    (tmp_path / "handlers" / "_effectgate" / "__init__.py").write_text("")
    for folder in FOLDERS:
        (tmp_path / folder).mkdir(exist_ok=True)
        (tmp_path / folder / "__init__.py").touch()
    return project_modules(tmp_path)


def test_the_checker_finds_a_forbidden_import_in_a_function_and_under_type_checking(tmp_path: Path) -> None:
    modules = _tree(
        tmp_path,
        {
            "ledger/a.py": "def f():\n    from effectgate.handlers import b\n",
            "handlers/b.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from effectgate.gateway.c import X\n"
            ),
            "gateway/c.py": "X = 1\n",
            "gateway/signatures/__init__.py": "",
            "gateway/signatures/s.py": "from ..c import X\n",
        },
    )
    assert layer_violations(import_graph(modules)) == [
        "effectgate.gateway.signatures.s -> effectgate.gateway.c: "
        "signature schemes import nothing else of the project",
        "effectgate.handlers.b -> effectgate.gateway.c: handlers know nothing of the gateway (HTTP)",
        "effectgate.ledger.a -> effectgate.handlers.b: the ledger imports nothing else of the project",
    ]


def test_the_checker_finds_production_code_importing_the_testing_kit(tmp_path: Path) -> None:
    modules = _tree(
        tmp_path,
        {
            "handlers/_effectgate/testing/__init__.py": "from effectgate.handlers import w\n",
            "handlers/w.py": "def f():\n    from effectgate.testing import MemoryContext\n",
        },
    )
    assert kit_importers(import_graph(modules)) == ["effectgate.handlers.w -> effectgate.testing"]


def test_the_checker_finds_a_cycle_through_a_relative_import(tmp_path: Path) -> None:
    modules = _tree(
        tmp_path,
        {
            "gateway/x.py": "from . import y\n",
            "gateway/y.py": "from .z import thing\n",
            "gateway/z.py": "def g():\n    import effectgate.gateway.x\n",
        },
    )
    assert cycles(import_graph(modules)) == [
        ["effectgate.gateway.x", "effectgate.gateway.y", "effectgate.gateway.z"]
    ]


def test_the_checker_finds_a_server_in_handlers(tmp_path: Path) -> None:
    modules = _tree(
        tmp_path, {"handlers/fake.py": "def f():\n    from starlette.applications import Starlette\n"}
    )
    assert server_imports(modules, "effectgate.handlers") == [
        "effectgate.handlers.fake -> starlette.applications"
    ]


def test_the_checker_finds_asyncio_run_in_either_spelling(tmp_path: Path) -> None:
    modules = _tree(
        tmp_path,
        {
            "gateway/cli.py": "import asyncio\nasyncio.run(None)\n",
            "gateway/other.py": "from asyncio import run\n",
        },
    )
    assert asyncio_run_calls(modules) == ["effectgate.gateway.cli:2", "effectgate.gateway.other:1"]


def test_the_checker_finds_the_edge_importing_past_its_values(tmp_path: Path) -> None:
    modules = _tree(
        tmp_path,
        {
            "gateway/edge/__init__.py": "",
            "gateway/edge/guard.py": "from ..config.gateway import Limits\nfrom .. import metrics\nfrom ..ingress import deliver\n",
            "gateway/config/__init__.py": "",
            "gateway/config/gateway.py": "Limits = 1\n",
            "gateway/metrics.py": "",
            "gateway/ingress.py": "deliver = 1\n",
        },
    )
    assert room_violations(import_graph(modules)) == [
        "effectgate.gateway.edge.guard -> effectgate.gateway.ingress: "
        "the edge imports only metrics, itself and the [gateway] values it is configured with"
    ]


def test_the_checker_finds_configuration_importing_what_it_configures(tmp_path: Path) -> None:
    modules = _tree(
        tmp_path,
        {
            "gateway/config/__init__.py": "def f():\n    from effectgate.gateway.operator.auth import X\n",
            "gateway/operator/__init__.py": "",
            "gateway/operator/auth.py": "X = 1\n",
        },
    )
    assert room_violations(import_graph(modules)) == [
        "effectgate.gateway.config -> effectgate.gateway.operator.auth: "
        "configuration is read before anything it configures, and knows none of it"
    ]


def test_the_checker_finds_production_code_importing_the_fakes(tmp_path: Path) -> None:
    modules = _tree(
        tmp_path,
        {
            "gateway/fakes/__init__.py": "",
            "gateway/fakes/providers.py": "",
            "gateway/cli/__init__.py": "from ..fakes import providers\n",
            "gateway/app.py": "from .fakes import providers\n",
        },
    )
    assert room_violations(import_graph(modules)) == [
        "effectgate.gateway.app -> effectgate.gateway.fakes.providers: only the CLI and the testing kit run the fakes"
    ]


def test_the_checker_finds_uvicorns_private_modules_outside_the_edge(tmp_path: Path) -> None:
    modules = _tree(
        tmp_path,
        {
            "gateway/edge/__init__.py": "from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol\n",
            "gateway/app.py": "import uvicorn\nfrom uvicorn.supervisors import Multiprocess\n",
            "gateway/serve.py": "def f():\n    import uvicorn.protocols.utils\n",
        },
    )
    assert uvicorn_private_importers(modules) == [
        "effectgate.gateway.app -> uvicorn.supervisors",
        "effectgate.gateway.edge -> uvicorn.protocols.http.httptools_impl",
        "effectgate.gateway.serve -> uvicorn.protocols.utils",
    ]

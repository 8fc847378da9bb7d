"""Every module, file and name that a docstring or comment of the source mentions exists in the tree.

A move renames rooms, and the prose that points at them goes stale without failing anything: a reader sent
to ``ledger.reconciler`` finds nothing. This reads every ``.py`` file under gateway/, handlers/ and ledger/
(not the tests): its docstrings with ``ast`` (every string standing alone as a statement, so the strings under
fields count too) and its comments with ``tokenize``.

What is checked:

- A dotted name beginning with ``effectgate.``, ``gateway.``, ``handlers.`` or ``ledger.``. The short form is
  the installed name without ``effectgate.`` (``ledger.jobs.leases`` is ``effectgate.ledger.jobs.leases``).
  It passes when it is a module or package, or when its longest module prefix is followed by a name that
  module defines at top level (a def, class, assignment or import, also under ``if``/``try``, or an entry of
  its ``__all__``): ``ledger.claims.claim_deliveries``, ``handlers.errors.TransientError``. When that name is
  a class, the next component must be defined in the class body (``gateway.edge.turns.Turns.take``); past
  that nothing is checked. A ``*`` is a pattern (``ledger.maintenance.scheduler.DEFAULT_*``) and passes when
  some name matches it. The tree holds no attribute reference that this misreads, so the looser rule (any
  two-component module prefix) is not needed.
- A path beginning with ``gateway/``, ``handlers/`` or ``ledger/`` (``ledger/jobs/leases.py``,
  ``gateway/config/``, ``ledger/sql/jobs.sql``), read from the repository root; it passes when it exists,
  and a path with a ``*`` when it matches something.

A dotted name that the source also spells as a string in its code, or that begins one, is that string, not a
module: a log event (``ledger.distributed``), a span (``effectgate.claim``), a setting key or its TOML table
(``gateway.penalty_box.cooling``, ``[gateway.penalty_box]``), the file ``effectgate.toml``. Such names are
skipped. Read from the code, this needs no list kept by hand; the price is that an old module name that is
also a key's prefix (``gateway.penalty_box`` was a module before the move) is not caught.

What fails: anything else, which is a module, file or name that is no longer where the text says.

The checker is tested on a small tree of its own, so "nothing stale" cannot mean "nothing seen".
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

from tests.unit.project.project_modules import Module, project_modules

ROOT = Path(__file__).resolve().parents[3]
FOLDERS = ("gateway", "handlers", "ledger")

# Not preceded by a word, a dot or a slash, so `self.handlers.get`, `request.state.ledger` and a URL's
# `…/gateway/…` are not read as references; a sentence's full stop is not part of the name.
DOTTED = re.compile(r"(?<![\w./-])(?:effectgate|gateway|handlers|ledger)(?:\.[A-Za-z_*][\w*]*)+")
PATH = re.compile(r"(?<![\w./-])(?:gateway|handlers|ledger)/[\w./*-]*")


@dataclass(frozen=True, order=True)
class Stale:
    path: str
    line: int
    name: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.name}"


def _docstrings(tree: ast.AST) -> list[ast.Constant]:
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    ]


def prose(source: str) -> Iterator[tuple[int, str]]:
    """Every docstring and comment of a module, each with the line it starts on."""
    for node in _docstrings(ast.parse(source)):
        yield node.lineno, node.value
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string


def code_strings(sources: Iterable[Path]) -> set[str]:
    """Every dotted name the code spells as a string: log events, spans, logger names, setting keys."""
    found: set[str] = set()
    for source in sources:
        tree = ast.parse(source.read_text(encoding="utf-8"))
        docstrings = set(map(id, _docstrings(tree)))
        found.update(
            node.value
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
            and DOTTED.fullmatch(node.value)
        )
    return found


def _names_in(body: list[ast.stmt]) -> set[str]:
    names: set[str] = set()
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets) and node.value:
                names.update(
                    n.value
                    for n in ast.walk(node.value)
                    if isinstance(n, ast.Constant) and isinstance(n.value, str)
                )
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).partition(".")[0] for a in node.names)
        elif isinstance(node, ast.If | ast.Try | ast.With):
            # TYPE_CHECKING imports, optional imports and their fallbacks are the module's names too.
            for field in ("body", "orelse", "finalbody"):
                names |= _names_in(getattr(node, field, []))
            for handler in getattr(node, "handlers", []):
                names |= _names_in(handler.body)
    return names


def _matches(pattern: str, names: set[str]) -> str | None:
    found = sorted(n for n in names if fnmatchcase(n, pattern))
    return found[0] if found else None


def _defines(module: Module, rest: list[str], modules: Mapping[str, Module]) -> bool:
    tree = ast.parse(module.path.read_text(encoding="utf-8"))
    # A pattern in the first place may also stand for submodules (`ledger.jobs.*`).
    submodules = {n.rpartition(".")[2] for n in modules if n.rpartition(".")[0] == module.name}
    first = _matches(rest[0], _names_in(tree.body) | submodules)
    if first is None:
        return False
    if len(rest) == 1:
        return True
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    if first not in classes:
        return True
    return _matches(rest[1], _names_in(classes[first].body)) is not None


def resolves(name: str, modules: Mapping[str, Module]) -> bool:
    """Whether a dotted name is a project module, or names something a project module defines."""
    parts = (name if name.startswith("effectgate.") else f"effectgate.{name}").split(".")
    for end in range(len(parts), 0, -1):
        prefix = ".".join(parts[:end])
        if prefix in modules:
            return end == len(parts) or _defines(modules[prefix], parts[end:], modules)
    return False


def path_exists(path: str, root: Path) -> bool:
    if "*" in path:
        return any(root.glob(path))
    return (root / path).exists()


def stale_names(root: Path = ROOT) -> list[Stale]:
    """Every (file:line, name) in the source's docstrings and comments that does not resolve."""
    modules = project_modules(root)
    sources = sorted(path for folder in FOLDERS for path in (root / folder).rglob("*.py"))
    strings = code_strings(sources)
    stale: list[Stale] = []
    for source in sources:
        relative = source.relative_to(root).as_posix()
        for line, text in prose(source.read_text(encoding="utf-8")):
            for match in DOTTED.finditer(text):
                name = match.group()
                if resolves(name, modules) or any(s == name or s.startswith(name + ".") for s in strings):
                    continue
                stale.append(Stale(relative, line + text.count("\n", 0, match.start()), name))
            for match in PATH.finditer(text):
                path = match.group().rstrip(".-")
                if not path_exists(path, root):
                    stale.append(Stale(relative, line + text.count("\n", 0, match.start()), path))
    return sorted(stale)


def test_docstrings_and_comments_name_only_what_exists() -> None:
    stale = stale_names()
    assert not stale, "names in docstrings and comments that are not in the tree:\n" + "\n".join(
        map(str, stale)
    )


def _tree(tmp_path: Path, files: Mapping[str, str]) -> Path:
    for relative, text in files.items():
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return tmp_path


def test_the_checker_finds_stale_names_and_passes_live_ones(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "handlers/_effectgate/__init__.py": '__all__ = ["effect"]\n',
            "handlers/__init__.py": "",
            "handlers/errors.py": "class TransientError(Exception):\n    retry_after = 1\n",
            "ledger/__init__.py": 'log.info("ledger.distributed")\n',
            "ledger/jobs/__init__.py": "from . import leases\n",
            "ledger/jobs/leases.py": "DEFAULT_LEASE = 30\nif True:\n    from x import fetch\n",
            "gateway/__init__.py": 'FILE = "effectgate.toml"\nKEY = "gateway.penalty_box.enabled"\n',
            "gateway/cli/__init__.py": (
                '"""Live: ``ledger.jobs.leases``, ``ledger/jobs/leases.py``, ``gateway/cli/``, ``effectgate.effect``,\n'
                "``handlers.errors.TransientError.retry_after``, ``ledger.jobs.leases.DEFAULT_*``,\n"
                "``effectgate.handlers.errors``, ``ledger.jobs.leases.fetch``, the ``effectgate.toml`` file,\n"
                "self.handlers.forward, https://example.com/gateway/settings.py, ``[gateway.penalty_box]``.\n\n"
                'Stale: ``ledger.reconciler.DEFAULT_*`` and ``handlers.errors.Gone``.\n"""\n'
                "\n"
                "# Stale: gateway/settings.py, handlers.errors.TransientError.gone and effectgate.gateway.serving.\n"
                "# Live: the event ledger.distributed is logged, not imported.\n"
            ),
        },
    )
    assert [str(s) for s in stale_names(root)] == [
        "gateway/cli/__init__.py:6: handlers.errors.Gone",
        "gateway/cli/__init__.py:6: ledger.reconciler.DEFAULT_*",
        "gateway/cli/__init__.py:9: effectgate.gateway.serving",
        "gateway/cli/__init__.py:9: gateway/settings.py",
        "gateway/cli/__init__.py:9: handlers.errors.TransientError.gone",
    ]

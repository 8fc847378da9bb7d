"""Facts the project names as constants are defined in one module each and imported elsewhere (issue 52).

Each name below was once assigned in two modules (``RETRY_AFTER`` in two ingress modules, ``EXIT_OK`` and
``EXIT_USAGE`` in the command line's and the operator's, ``DEFAULT_POOL_MAX`` in the ledger and the
configuration), which is how two copies drift. Read with ``ast``: a module-level assignment of the name, or of
it with a leading underscore, anywhere in gateway/, handlers/ or ledger/; an import does not count.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
ONCE = {
    "RETRY_AFTER": "gateway/ingress/answers.py",
    "DEFAULT_POOL_MAX": "ledger/db.py",
    **{
        name: "gateway/exit_codes.py"
        for name in (
            "EXIT_OK",
            "EXIT_FAILURE",
            "EXIT_USAGE",
            "EXIT_NOT_FOUND",
            "EXIT_REFUSED",
            "EXIT_PENDING",
        )
    },
}


def assigned(tree: ast.Module) -> Iterable[str]:
    """The names a module assigns at its top level, a leading underscore dropped."""
    for node in tree.body:
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign)
            else []
        )
        yield from (t.id.lstrip("_") for t in targets if isinstance(t, ast.Name))


def definitions(root: Path = ROOT) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for folder in ("gateway", "handlers", "ledger"):
        for path in sorted((root / folder).rglob("*.py")):
            for name in assigned(ast.parse(path.read_text(encoding="utf-8"))):
                found.setdefault(name, []).append(str(path.relative_to(root)))
    return found


def test_each_fact_is_defined_in_one_module() -> None:
    found = definitions()
    assert {name: found.get(name) for name in ONCE} == {name: [home] for name, home in ONCE.items()}


def test_the_check_sees_a_second_definition(tmp_path: Path) -> None:
    # Not vacuous: a private copy in another module is found.
    for folder, text in (("gateway", "EXIT_OK = 0\n"), ("handlers", "_EXIT_OK: int = 0\n"), ("ledger", "")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "m.py").write_text(text)
    assert definitions(tmp_path)["EXIT_OK"] == ["gateway/m.py", "handlers/m.py"]

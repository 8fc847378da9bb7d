"""The project's modules by installed name (``effectgate.ledger.jobs.leases``), found from the repository's folders
the way pyproject's package-dir installs them: the import rules and the check of names in prose read the same tree."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
# Repository folder -> installed package (pyproject's package-dir).
FOLDERS = {
    "gateway": "effectgate.gateway",
    "handlers": "effectgate.handlers",
    "ledger": "effectgate.ledger",
    "migrations": "effectgate.migrations",
}
TOP_LEVEL_INIT = ROOT / "handlers" / "_effectgate" / "__init__.py"
# The testing kit for handler authors: installed as effectgate.testing, from beside the top-level package.
KIT = ("handlers/_effectgate/testing", "effectgate.testing")


@dataclass(frozen=True)
class Module:
    name: str
    path: Path

    @property
    def package(self) -> str:
        """The package relative imports are resolved against."""
        return self.name if self.path.name == "__init__.py" else self.name.rpartition(".")[0]


def project_modules(root: Path = ROOT) -> dict[str, Module]:
    """Every module of the installed ``effectgate`` namespace, by its installed name."""
    modules = {"effectgate": Module("effectgate", root / TOP_LEVEL_INIT.relative_to(ROOT))}
    for folder, package in FOLDERS.items():
        for path in sorted((root / folder).rglob("*.py")):
            relative = path.relative_to(root / folder)
            if relative.parts[0] == "_effectgate":
                continue
            parts = list(relative.with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            name = ".".join([package, *parts])
            modules[name] = Module(name, path)
    folder, package = KIT
    for path in sorted((root / folder).rglob("*.py")):
        parts = list(path.relative_to(root / folder).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        name = ".".join([package, *parts])
        modules[name] = Module(name, path)
    return modules

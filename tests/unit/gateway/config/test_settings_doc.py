"""docs/configuration.md's settings reference is what the declaration makes, and names every setting."""

from __future__ import annotations

from pathlib import Path

import pytest

from effectgate.gateway.config import reference, settings

PAGE = Path(__file__).resolve().parents[4] / "docs" / "configuration.md"


def generated_part(page: str) -> str:
    start, end = page.index(reference.BEGIN), page.index(reference.END)
    return page[start : end + len(reference.END)]


def test_the_page_is_up_to_date_with_the_declaration() -> None:
    page = PAGE.read_text(encoding="utf-8")
    assert generated_part(page) == reference.reference(), (
        "docs/configuration.md is out of date: run `effectgate config reference --write docs/configuration.md`"
    )


def test_every_declared_setting_and_its_variable_is_in_the_reference() -> None:
    part = generated_part(PAGE.read_text(encoding="utf-8"))
    for setting in settings.SETTINGS:
        heading = part.index(f"#### `{reference._heading(setting.table)}`")
        assert f"| `{setting.key}` |" in part[heading:], setting.path
        if setting.env_var:
            assert f"`{setting.env_var}`" in part, setting.path
    # The keys the issue found missing.
    assert "| `connect_timeout` |" in part and "| `pool_max` |" in part


def test_rewriting_replaces_only_the_generated_part() -> None:
    page = f"before\n{reference.BEGIN}\nstale\n{reference.END}\nafter\n"
    new = reference.rewritten(page)
    assert new.startswith("before\n") and new.endswith("\nafter\n") and "stale" not in new
    assert reference.rewritten(new) == new
    with pytest.raises(reference.MarkersMissing):
        reference.rewritten("no markers")

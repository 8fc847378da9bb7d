"""Every scheme has a documented non-2xx behaviour and a conflict answer, and the docs say the same."""

from __future__ import annotations

import re
from pathlib import Path

from effectgate.gateway.config.providers import PROVIDERS
from effectgate.gateway.signatures import SCHEMES

DOCS = Path(__file__).resolve().parents[4] / "docs" / "providers.md"


def test_every_scheme_has_a_conflict_answer() -> None:
    assert set(PROVIDERS) == set(SCHEMES)


def test_the_docs_table_gives_every_scheme_the_same_conflict_answer() -> None:
    rows = {}
    for line in DOCS.read_text(encoding="utf-8").splitlines():
        match = re.match(r"\| `([a-z-]+)` \|.*\| (200|409) \|$", line)
        if match:
            rows[match.group(1)] = int(match.group(2))
    assert rows == {name: p.conflict_status for name, p in PROVIDERS.items()}

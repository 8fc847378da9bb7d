"""The worker's statements as they were before migration 0022, for populating a ledger of the previous release.

Today's fetch and step statements write ``tenant`` into job_attempts and steps, columns 0022 adds: on a ledger
before it they fail. A test that fills such a ledger through the real code paths (the worker's Python, its
parameters and its parsing of the answer) runs it with these frozen statements in their place, then migrates.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from effectgate.ledger.queries import Q, parse

BEFORE_0022 = parse((Path(__file__).parents[2] / "data" / "before_0022_sql.sql").read_text(encoding="utf-8"))


@contextmanager
def statements_before_0022() -> Iterator[None]:
    """Within the block, ``Q`` answers the fetch and the step statements of the release before 0022."""
    queries: dict[str, str] = Q._queries  # type: ignore[attr-defined]
    saved = {name: queries[name] for name in BEFORE_0022}
    queries.update(BEFORE_0022)
    try:
        yield
    finally:
        queries.update(saved)

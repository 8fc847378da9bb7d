"""Fixtures the integration tests of several rooms share (the suite-wide ones, the Postgres server and the template
database, are in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .reports_seed import seeded_database


@pytest.fixture(scope="module")
def seeded_url(pg_server_url: str, template_db: str) -> Iterator[str]:
    """A database holding the small, fully known ledger of ``reports_seed``, one per test module: the tests
    that use it only read."""
    with seeded_database(pg_server_url, template_db) as url:
        yield url

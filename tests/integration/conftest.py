"""Fixtures the integration tests of several rooms share (the suite-wide ones, the Postgres server and the template
database, are in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from effectgate.ledger import db

from .reports_seed import seeded_database


def _rolled_back(request: pytest.FixtureRequest) -> bool:
    return request.node.get_closest_marker("rolled_back") is not None


@pytest.fixture
def conn_url(request: pytest.FixtureRequest) -> str:
    """The database ``conn`` connects to: ``module_db_url`` in a module marked ``rolled_back``, else ``db_url``.
    Requested by name, so a rolled-back module clones no database per test, and asked here rather than in
    ``conn``: the first request sets up the template database, whose migration runs an event loop of its own,
    which cannot start inside ``conn``'s."""
    return str(request.getfixturevalue("module_db_url" if _rolled_back(request) else "db_url"))


@pytest.fixture
async def conn(request: pytest.FixtureRequest, conn_url: str) -> AsyncIterator[db.Conn]:
    """A connection to a database of this test's own (``db_url``).

    In a module marked ``rolled_back``, the connection is to one database per module (``module_db_url``) and the
    test runs in a transaction that is rolled back (River's ``TestTx``): the ledger's own transactions become
    savepoints inside it, and no database is cloned per test. Tests there that need several connections (races,
    NOTIFY, workers) take ``db_url`` instead. The transaction lasts the whole test by design, so the server's
    idle-in-transaction bound is off: a test paused in a debugger, or slowed on a loaded machine, is not a frozen
    process. One fixture chosen by a marker, as pytest-django's ``django_db(transaction=…)`` chooses: the two kinds
    of module sit side by side in the same rooms, so no room's conftest could choose for all of its modules.
    """
    if not _rolled_back(request):
        c = await db.connect(conn_url)
        async with c:
            yield c
        return
    c = await db.connect(conn_url, idle_in_transaction_timeout=None)
    async with c, c.transaction(force_rollback=True):
        yield c


@pytest.fixture(scope="module")
def seeded_url(pg_server_url: str, template_db: str) -> Iterator[str]:
    """A database holding the small, fully known ledger of ``reports_seed``, one per test module: the tests
    that use it only read."""
    with seeded_database(pg_server_url, template_db) as url:
        yield url
